"""The process group the trainer builds on CUDA (`cpu:gloo,cuda:nccl`), checked under torchrun.

The stop flag lives on the CPU on purpose: with a mixed group a CPU tensor's all-reduce goes to the gloo
half and a CUDA tensor's to NCCL, so the flag works under NCCL without touching the GPU stream. Object
collectives and barriers (checkpoint commit, attempt claims) also pick the CPU (gloo) half.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.gpu.gpu_helpers import GPU_MARKS, gpu_env, requires_two_gpus
from tests.helpers import PY, REPO

pytestmark = GPU_MARKS
PROBE = REPO / "tests" / "gpu" / "probe_collectives.py"


def probe(nproc: int, tmp_path) -> list[dict]:
    cmd = [
        PY,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(PROBE),
        str(tmp_path),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=gpu_env(), cwd=REPO, timeout=180)
    assert p.returncode == 0, p.stderr[-4000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(nproc)]


def test_the_trainers_group_on_one_gpu(tmp_path):
    (r,) = probe(1, tmp_path)
    assert r["device"] == "cuda:0"
    assert "nccl" in r["backend"] and "gloo" in r["backend"], r["backend"]
    assert r["object_collective_device"] == "cpu"
    assert r["all_reduce_cpu"] == r["all_reduce_cuda"] == 1
    # One rank: no collective, the local flag decides (and this rank is the signalled one).
    assert r["should_stop_cpu"] is True and r["should_stop_cuda"] is True
    assert r["broadcast_object"] and r["fsdp_grads_on"] == ["cuda"] and r["fsdp_grads_finite"]


@requires_two_gpus
@pytest.mark.dist
def test_one_signalled_rank_stops_both_over_nccl_and_gloo(tmp_path):
    ranks = probe(2, tmp_path)
    assert [r["device"] for r in ranks] == ["cuda:0", "cuda:1"]
    for r in ranks:
        assert r["all_reduce_cpu"] == r["all_reduce_cuda"] == 2
        assert r["should_stop_cpu"] is True and r["should_stop_cuda"] is True
        assert r["broadcast_object"] and r["fsdp_grads_finite"]
    assert ranks[0]["signal_cpu"] == ranks[0]["signal_cuda"] == "peer"  # rank 0 heard it from rank 1
    assert ranks[1]["signal_cpu"] == "SIGTERM"
