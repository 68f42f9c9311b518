"""FSDP2 on one GPU: SIGTERM, save, restart, compare. Tier 2 measured, not assumed.

Each drill runs the tiny Qwen2 with attention dropout 0.1 (so every forward pass draws from the CUDA
generator) three ways: a reference, its replay (same config, fresh process: the nondeterminism floor),
and a trial stopped by a real SIGTERM and resumed from its checkpoint. The trial may differ from the
reference by no more than the replay does; whether that is bit for bit is measured and reported
(`[gpu-measure]` lines, collected by gpu/check.py).

- fp32: `python -m trainer` (its own 1-rank group), synchronous preemption save; a negative control
  resumes a copy of the trial without restoring the RNG and must break equivalence;
- async: the same computation with `checkpoint.async_save`, SIGTERM on a step whose periodic (async)
  save is still in flight: the stop commits it and the resume loads it;
- bf16: `model.dtype=bfloat16` through `python -m steps.train --nproc 1` (torchrun, PID-1 exit mapping).
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.gpu.gpu_helpers import (
    GPU_MARKS,
    N_GPUS,
    floor_and_diff,
    manifest,
    measure,
    run_drill,
)

pytestmark = [*GPU_MARKS, pytest.mark.slow]
TOTAL, EVERY = 12, 4


@pytest.fixture(scope="module")
def fp32(tiny_model, tmp_path_factory):
    return run_drill(
        tmp_path_factory.mktemp("fp32"),
        tiny_model,
        "model.dtype=float32",
        total=TOTAL,
        stop=6,
        every=EVERY,
        control=True,
    )


@pytest.fixture(scope="module")
def bf16(tiny_model, tmp_path_factory):
    return run_drill(
        tmp_path_factory.mktemp("bf16"),
        tiny_model,
        "model.dtype=bfloat16",
        total=TOTAL,
        stop=6,
        every=EVERY,
        nproc=1,
    )


@pytest.fixture(scope="module")
def async_save(tiny_model, tmp_path_factory, fp32):
    # The fingerprint leaves checkpoint settings out: same computation, so fp32's reference and replay serve.
    return run_drill(
        tmp_path_factory.mktemp("async"),
        tiny_model,
        "model.dtype=float32",
        "checkpoint.async_save=true",
        total=TOTAL,
        stop=8,
        every=EVERY,
        reference_from=fp32,
    )


def check_runs(d) -> None:
    for name, res, want in (
        ("reference", d.reference, 0),
        ("replay", d.replay, 0),
        ("trial, attempt 1", d.first, 75),
        ("trial, resume", d.second, 0),
    ):
        assert res is not None, f"{name} did not run (the first attempt ended {d.first.rc})\n{d.first.tail()}"
        assert res.rc == want, f"{name} exited {res.rc}, expected {want}\n{res.tail()}"


def check_equivalence(d, label: str) -> None:
    check_runs(d)
    pre = d.first.of("preempt")
    assert len(pre) == 1 and pre[0]["step"] == d.stop, pre
    resumed = d.second.of("resume")
    assert resumed and resumed[0]["from_step"] == d.stop, resumed
    ref_steps = {r["step"]: r for r in d.reference.of("step")}
    trial_steps = {r["step"]: r for r in d.second.of("step")}
    assert sorted(trial_steps) == list(range(d.stop + 1, d.total + 1))
    # The same data, batch for batch, after the resume.
    assert all(trial_steps[s]["batch_sha"] == ref_steps[s]["batch_sha"] for s in trial_steps)
    floor, diff, differing, compared = floor_and_diff(d)
    loss_gap = max(abs(trial_steps[s]["loss"] - ref_steps[s]["loss"]) for s in trial_steps)
    measure(
        f"resume_{label}",
        floor=floor,
        max_abs_diff=diff,
        differing_tensors=differing,
        tensors=compared,
        bit_identical=differing == 0,
        max_loss_gap=loss_gap,
        outcome=pre[0]["outcome"],
        preempt_save_ms=pre[0]["save_ms"],
        devices=N_GPUS,
    )
    assert diff <= floor, (
        f"{label}: the trial differs from the reference by {diff:.3g} in {differing}/{compared} "
        f"tensors, more than the replay does ({floor:.3g})"
    )
    if floor == 0:
        assert loss_gap == 0, f"{label}: bitwise-equal final state but losses differ by {loss_gap}"


def test_the_run_is_on_the_gpu(fp32):
    check_runs(fp32)
    assert "on cuda:0" in fp32.reference.stderr
    assert manifest(fp32.ckpt("reference"), TOTAL)["device"] == "cuda"
    losses = [r["loss"] for r in fp32.reference.of("step")]
    assert len(losses) == TOTAL and all(math.isfinite(x) for x in losses)
    final = fp32.final("reference")
    assert {v.dtype for k, v in final.items() if k.startswith("model.")} == {torch.float32}
    tps = sorted(r["tokens_per_s"] for r in fp32.reference.of("step"))
    measure("tiny_fp32_tokens_per_s_median", value=tps[len(tps) // 2])


def test_fsdp2_sigterm_and_resume_on_one_gpu_is_within_the_floor(fp32):
    check_equivalence(fp32, "fp32")
    assert fp32.first.of("preempt")[0]["outcome"] == "saved"


def test_the_cuda_generator_rides_in_the_checkpoint(fp32):
    check_runs(fp32)
    cuda = fp32.at_stop.get("rng.rank0.cuda")
    assert cuda is not None, sorted(k for k in fp32.at_stop if k.startswith("rng."))
    assert cuda.dtype == torch.uint8 and cuda.numel() >= 16  # Philox seed and offset, per device captured
    earlier = fp32.before_stop.get("rng.rank0.cuda")
    assert earlier is not None, "no committed checkpoint before the stop"
    assert not torch.equal(cuda, earlier), "the CUDA generator did not move between two checkpoints"


def test_negative_control_without_the_rng_restore_breaks_equivalence(fp32):
    check_runs(fp32)
    assert fp32.control is not None and fp32.control.rc == 0, fp32.control.tail() if fp32.control else ""
    floor, diff, differing, compared = floor_and_diff(fp32, "control")
    measure(
        "negative_control_skip_rng",
        floor=floor,
        max_abs_diff=diff,
        differing_tensors=differing,
        tensors=compared,
    )
    assert diff > floor and differing > 0, (
        "skipping the RNG restore went unnoticed: the CUDA generator is not what "
        "dropout draws from, or it is restored some other way"
    )


def test_async_periodic_save_is_committed_by_the_stop_and_resumed_from(async_save):
    d = async_save
    check_runs(d)
    periodic = [r for r in d.first.of("checkpoint") if r["step"] == d.stop]
    assert periodic and periodic[0].get("asynchronous") is True, periodic
    check_equivalence(d, "fp32_async")


def test_bf16_parameters_save_and_resume(bf16):
    check_equivalence(bf16, "bf16")
    final = bf16.final("trial")
    model = {k: v.dtype for k, v in final.items() if k.startswith("model.") and v.is_floating_point()}
    assert set(model.values()) == {torch.bfloat16}, model
    moments = {
        v.dtype for k, v in final.items() if k.startswith("optim.") and k.endswith(("exp_avg", "exp_avg_sq"))
    }
    assert moments == {torch.bfloat16}, moments
    assert "-> exit 75" in bf16.first.stderr  # through steps.train's exit mapping
