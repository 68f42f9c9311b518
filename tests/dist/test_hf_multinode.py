"""The HF Trainer example on two nodes: two `steps.train --trainer hf` pods, one gloo rank each, on
loopback, each with an `output_dir` of its own (nodes share no disk), the bucket a folder both reach.
A SIGTERM to either pod stops both at the same step and both exit 75; node 1's files of the checkpoint
(its `rng_state_1.pth`) are in the bucket, uploaded by node 1 before rank 0's commit, and listed in the
manifest; the group's retry fetches the checkpoint on each node and ends bit-identical to the same two
ranks in one pod (tests/dist/test_hf_multirank.py's reference). The control: the same resume with node
1's RNG file taken out of the checkpoint differs from the reference."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.dist.test_hf_multirank import HF_YAML, TOTAL, entry_cmd, equal_to_reference
from tests.dist.test_hf_multirank import reference as reference  # noqa: F401 - the 2-rank fixture
from tests.dist.test_multinode import finish, start_group
from tests.helpers import CORPUS, PY, base_env

pytestmark = [pytest.mark.dist, pytest.mark.timeout(900)]
assert entry_cmd  # the one-pod command the reference ran


def hf_node_cmd(model, bucket: str, node: int, port: int) -> list[str]:
    cmd = [
        PY,
        "-m",
        "steps.train",
        "--nproc",
        "1",
        "--trainer",
        "hf",
        "--config",
        str(HF_YAML),
        "--nnodes",
        "2",
        "--node-rank",
        str(node),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
    ]
    for s in (
        f"model.path={model}",
        f"checkpoint.uri={bucket}",
        f"data.uri={CORPUS}",
        f"total_steps={TOTAL}",
        "checkpoint.every_steps=5",
        "model.dropout=0.1",
    ):
        cmd += ["--set", s]
    return cmd


def hf_group(model, bucket: str, disks, first: int = 0, **env: str):
    """The two HF pods; node I's output_dir is disks/node-I (its local disk)."""
    return start_group(
        lambda node, port: hf_node_cmd(model, bucket, node, port),
        lambda node: base_env(BATON_HF_OUTPUT_DIR=str(disks / f"node-{node}"), **env),
        first,
    )


def stopped_at_6(model, bucket: str, disks, signalled: int) -> None:
    pods = hf_group(model, bucket, disks, BATON_GRACE="20", BATON_PAUSE_AFTER_STEP="6")
    pods[signalled].wait_for("step", 6)
    os.kill(pods[signalled].p.pid, signal.SIGTERM)
    rcs = finish(pods)
    assert rcs == [75, 75], [p.err[-3000:] for p in pods]
    stops = [
        [(r["rank"], r["step"], r["outcome"]) for r in p.records if r["event"] == "preempt"] for p in pods
    ]
    assert stops == [[(0, 6, "saved")], [(1, 6, "saved")]]


@pytest.mark.parametrize("signalled", [0, 1])
def test_hf_on_two_nodes_a_sigterm_to_either_stops_both_and_the_retry_is_bit_identical(
    tiny_model, reference, tmp_path, signalled
):  # noqa: F811
    bucket = f"file://{tmp_path}/bucket"
    stopped_at_6(tiny_model, bucket, tmp_path / "disk", signalled)
    manifest = json.loads((tmp_path / "bucket" / "checkpoint-6" / "_COMMIT").read_text())
    assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "optimizer.pt"} <= set(
        manifest["files"]
    )
    # rng_state_1.pth was written on node 1's disk only: it reached the bucket through node 1's upload.
    assert not (tmp_path / "disk" / "node-0" / "checkpoint-6" / "rng_state_1.pth").exists()

    pods = hf_group(tiny_model, bucket, tmp_path / "disk2", first=1, BATON_GRACE="20")  # fresh disks: new VMs
    assert finish(pods) == [0, 0], [p.err[-3000:] for p in pods]
    for node, pod in enumerate(pods):
        assert [(r["rank"], r["step"]) for r in pod.records if r["event"] == "done"] == [(node, TOTAL)]
    assert [r["from_step"] for r in pods[0].records if r["event"] == "resume"] == [6]
    equal_to_reference(reference, bucket)


def test_control_the_resume_without_node_1s_rng_file_is_noticed(tiny_model, reference, tmp_path):  # noqa: F811
    bucket = f"file://{tmp_path}/bucket"
    stopped_at_6(tiny_model, bucket, tmp_path / "disk", 1)
    # Take node 1's RNG file out of the checkpoint, manifest and all: what a commit that listed only node 0's
    # files would have left. The resume goes on (HF warns and keeps the fresh RNG) and the run differs.
    folder = tmp_path / "bucket" / "checkpoint-6"
    manifest = json.loads((folder / "_COMMIT").read_text())
    del manifest["files"]["rng_state_1.pth"]
    (folder / "rng_state_1.pth").unlink()
    (folder / "_COMMIT").write_text(json.dumps(manifest, sort_keys=True))
    pods = hf_group(tiny_model, bucket, tmp_path / "disk2", BATON_GRACE="20")
    assert finish(pods) == [0, 0], [p.err[-3000:] for p in pods]
    with pytest.raises(AssertionError):
        equal_to_reference(reference, bucket)
