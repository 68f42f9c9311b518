"""Two NCCL ranks on two GPUs (skipped unless `torch.cuda.device_count() >= 2`): SIGTERM to one worker
stops both at the same step, the checkpoint holds both ranks' shards, and the 2-rank resume is within the
floor of a 2-rank reference and its replay."""

from __future__ import annotations

import pytest

from tests.gpu.gpu_helpers import GPU_MARKS, floor_and_diff, manifest, measure, requires_two_gpus, run_drill

pytestmark = [*GPU_MARKS, requires_two_gpus, pytest.mark.dist, pytest.mark.slow]


def test_two_nccl_ranks_sigterm_one_worker_and_resume_within_the_floor(tiny_model, tmp_path):
    d = run_drill(
        tmp_path, tiny_model, "model.dtype=float32", total=12, stop=5, every=4, nproc=2, sigterm_rank=1
    )
    for name, res, want in (("reference", d.reference, 0), ("replay", d.replay, 0), ("trial", d.first, 75)):
        assert res.rc == want, f"{name} exited {res.rc}, expected {want}\n{res.tail()}"
    assert d.second is not None and d.second.rc == 0, d.second.tail() if d.second else ""
    pre = d.first.of("preempt")
    assert len(pre) == 1 and pre[0]["step"] == 5 and pre[0]["signal"] == "peer", (
        pre
    )  # rank 0 heard it from rank 1
    m = manifest(d.ckpt("trial"), 5)
    assert (
        m["world_size"] == 2 and m["device"] == "cuda" and {"__0_0.distcp", "__1_0.distcp"} <= set(m["files"])
    )
    floor, diff, differing, compared = floor_and_diff(d)
    measure(
        "resume_two_ranks_nccl",
        floor=floor,
        max_abs_diff=diff,
        differing_tensors=differing,
        tensors=compared,
        bit_identical=differing == 0,
    )
    assert diff <= floor, (
        f"2 ranks: trial differs by {diff:.3g} ({differing}/{compared} tensors), floor {floor:.3g}"
    )
