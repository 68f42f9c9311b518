"""Two gloo ranks under torchrun, through the PID-1 entrypoint: bit-identical resume, a collective
stop when only one worker is signalled, per-rank state under rank keys, exit codes, resharding."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pytest
import torch

from tests.helpers import (
    CORPUS,
    PY,
    REPO,
    TINY_YAML,
    base_env,
    equal_count,
    model_and_optim,
    records,
    step_dir,
    tensors,
)
from tests.helpers import workers_of as helpers_workers_of

pytestmark = pytest.mark.dist
DROPOUT = "model.dropout=0.1"
TOTAL = 24  # 10 steps per epoch with 2 ranks: the resume crosses an epoch boundary


def workers_of(pid: int) -> dict[int, int]:
    """rank -> pid of the trainer's torchrun workers below `pid`."""
    return helpers_workers_of(pid, b"trainer")


def entry_cmd(model, ckpt, *sets, nproc=2):
    cmd = [PY, "-m", "steps.train", "--nproc", str(nproc), "--config", str(TINY_YAML)]
    for s in (
        f"model.path={model}",
        f"checkpoint.uri={ckpt}",
        f"data.uri={CORPUS}",
        f"total_steps={TOTAL}",
        DROPOUT,
        *sets,
    ):
        cmd += ["--set", s]
    return cmd


def run_entry(cmd, env=None, timeout=240):
    p = subprocess.run(
        cmd, capture_output=True, text=True, env=env or base_env(BATON_GRACE="20"), cwd=REPO, timeout=timeout
    )
    return p.returncode, records(p.stdout), p.stderr


def entry_sigterm(cmd, at_step, who, timeout=240):
    """`who`: 'rank0' / 'rank1' (one worker only) or 'entry' (PID 1, as the kubelet does)."""
    env = base_env(BATON_GRACE="20", BATON_PAUSE_AFTER_STEP=str(at_step))
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    out = []
    for line in p.stdout:
        out.append(line)
        if (
            line.startswith("{")
            and json.loads(line).get("event") == "step"
            and json.loads(line)["step"] == at_step
        ):
            if who == "entry":
                os.kill(p.pid, signal.SIGTERM)
            else:
                deadline = time.monotonic() + 20
                while len(w := workers_of(p.pid)) < 2 and time.monotonic() < deadline:
                    time.sleep(0.1)
                os.kill(w[int(who[-1])], signal.SIGTERM)
    rc = p.wait(timeout=timeout)  # a hang here (a rank stuck in a collective) fails the test
    return rc, records("".join(out)), p.stderr.read()


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("ref2")
    rc, recs, err = run_entry(entry_cmd(tiny_model, ckpt))
    assert rc == 0, err
    return ckpt, {r["step"]: r for r in recs if r["event"] == "step"}, tensors(ckpt, TOTAL)


@pytest.fixture(scope="module")
def interrupted(tiny_model, tmp_path_factory):
    """SIGTERM to rank 1 only, after step 7."""
    ckpt = tmp_path_factory.mktemp("int2")
    t0 = time.monotonic()
    rc, recs, err = entry_sigterm(entry_cmd(tiny_model, ckpt), 7, "rank1")
    return ckpt, rc, recs, err, time.monotonic() - t0


def test_one_signalled_rank_stops_both_at_the_same_step_and_the_entrypoint_says_75(interrupted):
    ckpt, rc, recs, err, _ = interrupted
    assert rc == 75, err
    pre = [r for r in recs if r["event"] == "preempt"]
    assert len(pre) == 1 and pre[0]["step"] == 7 and pre[0]["signal"] == "peer"  # rank 0 heard it from rank 1
    assert "torchrun exited 1" in err and "-> exit 75" in err
    manifest = json.loads((step_dir(ckpt, 7) / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and {"__0_0.distcp", "__1_0.distcp"} <= set(manifest["files"])


def test_two_rank_resume_is_bit_identical(tiny_model, reference, interrupted, tmp_path):
    ckpt = tmp_path / "t"
    shutil.copytree(interrupted[0], ckpt)
    rc, recs, err = run_entry(entry_cmd(tiny_model, ckpt))
    assert rc == 0, err
    steps = {r["step"]: r for r in recs if r["event"] == "step"}
    assert sorted(steps) == list(range(8, TOTAL + 1))
    assert steps[8]["batch_sha"] == reference[1][8]["batch_sha"]
    equal, total = equal_count(reference[2], tensors(ckpt, TOTAL))
    assert equal == total and total > 100
    # The restart's phases per rank (the bench's figure 10 shows them), beside rank 0's own `phases`: each
    # rank's entry is its own timing (rank 0's equals its `phases`), the load and restore included.
    (resume,) = [r for r in recs if r["event"] == "resume"]
    ranks = resume["rank_phases"]
    assert len(ranks) == 2 and all({"startup_s", "load_verify_s", "restore_s"} <= set(p) for p in ranks), (
        ranks
    )
    assert all(ranks[0][k] == resume["phases"][k] for k in ranks[0]), (ranks[0], resume["phases"])


def test_per_rank_state_lives_under_rank_keys(interrupted):
    from trainer.checkpoint.checkpointer import json_from_tensor

    t = tensors(interrupted[0], 7)
    assert not torch.equal(t["rng.rank0.torch"], t["rng.rank1.torch"])
    blobs = [json_from_tensor(t[f"loader.rank{r}"]) for r in (0, 1)]
    assert [b["rank"] for b in blobs] == [0, 1] and blobs[0]["yielded"] == blobs[1]["yielded"] > 0


def test_negative_control_swapped_rank_state_breaks_equivalence(tiny_model, reference, interrupted, tmp_path):
    ckpt = tmp_path / "t"
    shutil.copytree(interrupted[0], ckpt)
    rc, _, err = run_entry(
        entry_cmd(tiny_model, ckpt), env=base_env(BATON_GRACE="20", BATON_SWAP_RANK_STATE="1")
    )
    assert rc == 0, err
    equal, total = equal_count(model_and_optim(reference[2]), model_and_optim(tensors(ckpt, TOTAL)))
    assert equal < total


def test_sigterm_to_the_entrypoint_is_forwarded_and_reported_as_75(tiny_model, tmp_path):
    rc, recs, err = entry_sigterm(entry_cmd(tiny_model, tmp_path), 3, "entry")
    assert rc == 75, err
    assert [r["step"] for r in recs if r["event"] == "preempt"] == [3]


def test_entrypoint_reports_1_on_a_crash(tiny_model, tmp_path):
    rc, _, err = run_entry(entry_cmd(tiny_model, tmp_path, "data.uri=/nonexistent/corpus.txt"))
    assert rc == 1 and "data.uri" in err


@pytest.mark.parametrize("saved_world, resume_world", [(2, 1), (1, 2)])
def test_reshard_loads_exactly_and_continues_from_the_same_global_sample(
    tiny_model, tmp_path, saved_world, resume_world
):
    ckpt = tmp_path / "ck"
    rc, recs, err = entry_sigterm(
        entry_cmd(tiny_model, ckpt, nproc=saved_world), 13, "entry" if saved_world == 1 else "rank0"
    )
    assert rc == 75, err
    out = tmp_path / "probe.json"
    sets = [
        f"model.path={tiny_model}",
        f"checkpoint.uri={ckpt}",
        f"data.uri={CORPUS}",
        f"total_steps={TOTAL}",
        DROPOUT,
    ]
    cmd = [
        PY,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={resume_world}",
        str(REPO / "tests" / "dist" / "probe_reshard.py"),
        str(TINY_YAML),
        str(out),
    ]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, env=base_env(), cwd=REPO, timeout=240)
    assert p.returncode == 0, p.stderr
    probe = json.loads(out.read_text())
    assert probe["saved_world"] == saved_world and probe["world"] == resume_world
    assert probe["equal"] == probe["total"] and probe["total"] > 50
    step, epoch, start, yielded = probe["saved_progress"]
    assert probe["step"] == step == 13
    global_sample = start + yielded * probe["batch_size"] * saved_world
    assert (probe["epoch"], probe["position"]) == (epoch, global_sample) or (
        probe["epoch"] == epoch + 1 and probe["position"] == 0
    )
