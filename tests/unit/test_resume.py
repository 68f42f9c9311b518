"""The proof: SIGTERM, restart, and the final tensors equal an uninterrupted run's, with the negative
controls that show the comparison notices each missing piece of restored state.

Real processes, real signals. `BATON_PAUSE_AFTER_STEP` holds the trainer at a chosen step boundary
until the signal arrives, so the test lands SIGTERM on an exact step.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers import (
    base_env,
    equal_count,
    judged,
    model_and_optim,
    run,
    run_and_sigterm,
    step_dir,
    tensors,
    trainer_cmd,
)

DROPOUT = "model.dropout=0.1"
TOTAL = 40  # 20 steps per epoch at world 1 with the tiny config


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("reference")
    rc, recs, err = run(trainer_cmd(tiny_model, ckpt, DROPOUT))
    assert rc == 0, err
    assert [r["event"] for r in recs if r["event"] != "step"][-2:] == ["checkpoint", "done"]
    steps = {r["step"]: r for r in recs if r["event"] == "step"}
    assert sorted(steps) == list(range(1, TOTAL + 1))
    return ckpt, steps, tensors(ckpt, TOTAL)


@pytest.fixture(scope="module")
def interrupted(tiny_model, tmp_path_factory):
    """A trial stopped by SIGTERM after step 13, before its restart."""
    ckpt = tmp_path_factory.mktemp("interrupted")
    rc, recs, err = run_and_sigterm(trainer_cmd(tiny_model, ckpt, DROPOUT), at_step=13)
    assert rc == 75, err
    return ckpt, recs


def _resume(tiny_model, src, dst, env=None):
    shutil.copytree(src, dst)
    rc, recs, err = run(trainer_cmd(tiny_model, dst, DROPOUT), env=env)
    assert rc == 0, err
    return recs


def test_preemption_saves_the_step_the_signal_landed_on(interrupted):
    _, recs = interrupted
    pre = [r for r in recs if r["event"] == "preempt"]
    assert len(pre) == 1 and pre[0]["step"] == 13 and pre[0]["exit"] == 75 and pre[0]["signal"] == "SIGTERM"
    assert pre[0]["save_ms"] > 0 and not pre[0]["already_committed"]
    assert pre[0]["grace_left_s"] > 0
    ck = [r for r in recs if r["event"] == "checkpoint" and r["reason"] == "preempt"]
    assert [c["step"] for c in ck] == [13] and ck[0]["bytes"] > 0
    assert max(r["step"] for r in recs if r["event"] == "step") == 13


def test_resume_is_bit_identical_to_the_uninterrupted_run(tiny_model, reference, interrupted, tmp_path):
    ref_ckpt, ref_steps, ref_t = reference
    recs = _resume(tiny_model, interrupted[0], tmp_path / "trial")
    resume = [r for r in recs if r["event"] == "resume"]
    assert resume and resume[0]["from_step"] == 13 and resume[0]["checkpoint"].endswith("step-00000013")
    assert (
        "rank_phases" not in resume[0]
    )  # one rank: its `phases` are the job's (two: tests/dist/test_multirank.py)
    steps = {r["step"]: r for r in recs if r["event"] == "step"}
    assert sorted(steps) == list(range(14, TOTAL + 1)), "no step replayed, none skipped"
    # The batch consumed at step K+1 is the reference's, and so is every later one.
    assert steps[14]["batch_sha"] == ref_steps[14]["batch_sha"]
    assert all(steps[s]["batch_sha"] == ref_steps[s]["batch_sha"] for s in steps)
    trial_t = tensors(tmp_path / "trial", TOTAL)
    equal, total = equal_count(ref_t, trial_t)
    assert equal == total and total > 100
    assert len(model_and_optim(ref_t)) >= 100


def _records_of(steps: dict[int, dict]) -> list[dict]:
    """The reference's records, from its step records (the fixture keeps those): a fresh start, every step, done."""
    attempt = next(iter(steps.values()))["attempt"]
    return [
        {"event": "resume", "step": 0, "attempt": attempt, "from_step": 0, "fresh": True},
        *steps.values(),
        {"event": "done", "step": TOTAL, "attempt": attempt},
    ]


@pytest.fixture(scope="module")
def replay(tiny_model, tmp_path_factory):
    """A second uninterrupted run: the drill's reference-replay, for steps.compare's judgment."""
    ckpt = tmp_path_factory.mktemp("replay")
    rc, recs, err = run(trainer_cmd(tiny_model, ckpt, DROPOUT))
    assert rc == 0, err
    return ckpt, recs


# What the drill's verdict must name for each skipped restore (steps/lib/verdict.py): the trajectory finds the
# RNG (before the batch was drawn), the data order (with the same RNG) and the schedule at the first step
# after the resume (14; the scheduler's lr was restored with the optimizer's param groups, so its own state
# shows one step later); the optimizer's moments leave the trajectory equal and show in the checkpoints,
# and at Tier 1 in the loss of the step after the first update that used them (LOSS_AT_TIER_1).
SKIPPED_CAUSE = {
    "rng": "step 14: the RNG differed before this batch was drawn (RNG not restored, or consumed at start)",
    "data": "step 14: the data order differs with the same RNG (the data order not restored",
    "scheduler": "step 15: lr differs (scheduler not restored)",
    "optimizer": "final checkpoints differ: optimizer",
}
LOSS_AT_TIER_1 = "step 15: the same batch and RNG, but the loss differs (state outside the checkpoint"


@pytest.mark.parametrize("component", ["rng", "data", "optimizer", "scheduler"])
def test_negative_control_skipping_one_restore_breaks_equivalence(
    tiny_model, reference, replay, interrupted, tmp_path, component
):
    ref_ckpt, ref_steps, ref_t = reference
    recs = _resume(tiny_model, interrupted[0], tmp_path / "trial", env=base_env(BATON_SKIP_RESTORE=component))
    trial_t = model_and_optim(tensors(tmp_path / "trial", TOTAL))
    equal, total = equal_count(model_and_optim(ref_t), trial_t)
    assert equal < total, f"skipping the {component} restore went unnoticed"
    ref_recs = _records_of(ref_steps)
    report = judged(
        {"reference": ref_ckpt, "replay": replay[0], "trial": tmp_path / "trial"},
        {"reference": ref_recs, "replay": replay[1], "trial": interrupted[1] + recs},
        TOTAL,
        tier=1,
    )
    assert not report["passed"] and SKIPPED_CAUSE[component] in report["verdict"], report["verdict"]
    if component == "optimizer":
        assert report["verdict"].startswith(f"NOT preemption-safe: {LOSS_AT_TIER_1}"), report["verdict"]


def test_the_correct_resume_is_certified_by_the_drills_judgment(
    tiny_model, reference, replay, interrupted, tmp_path
):
    """The positive control of the judgment above: the same judgment, every entry of every component
    (model, optimizer, scheduler, RNG, data position) equal, the trajectory equal step by step."""
    ref_ckpt, ref_steps, _ = reference
    recs = _resume(tiny_model, interrupted[0], tmp_path / "trial")
    ref_recs = _records_of(ref_steps)
    report = judged(
        {"reference": ref_ckpt, "replay": replay[0], "trial": tmp_path / "trial"},
        {"reference": ref_recs, "replay": replay[1], "trial": interrupted[1] + recs},
        TOTAL,
        tier=1,
    )
    assert report["passed"], report["verdict"]
    assert {c["component"] for c in report["components"]} == {
        "model",
        "optimizer",
        "scheduler",
        "rng",
        "data",
    }
    assert (
        report["equal_tensors"] == report["tensors"] > 100 and report["trajectory"]["steps_compared"] == TOTAL
    )


@pytest.mark.parametrize("at_step", [20, 21], ids=["last-step-of-epoch-0", "first-step-of-epoch-1"])
def test_resume_across_an_epoch_boundary(tiny_model, reference, tmp_path, at_step):
    ref_ckpt, ref_steps, ref_t = reference
    ckpt = tmp_path / "trial"
    rc, recs, err = run_and_sigterm(trainer_cmd(tiny_model, ckpt, DROPOUT), at_step=at_step)
    assert rc == 75, err
    pre = [r for r in recs if r["event"] == "preempt"][0]
    # Step 20 is also a periodic checkpoint: the preemption finds it committed and exits at once.
    assert pre["already_committed"] == (at_step == 20)
    rc, recs, err = run(trainer_cmd(tiny_model, ckpt, DROPOUT))
    assert rc == 0, err
    steps = {r["step"]: r for r in recs if r["event"] == "step"}
    assert min(steps) == at_step + 1 and steps[at_step + 1]["epoch"] == 1
    assert steps[at_step + 1]["batch_sha"] == ref_steps[at_step + 1]["batch_sha"]
    equal, total = equal_count(ref_t, tensors(ckpt, TOTAL))
    assert equal == total


def test_sigterm_right_after_step_1_saves_step_1_and_resumes_exactly(tiny_model, reference, tmp_path):
    # The first edge of a run: one optimizer step taken, the warmup's first learning rate, one batch in.
    _, ref_steps, ref_t = reference
    ckpt = tmp_path / "trial"
    rc, recs, err = run_and_sigterm(trainer_cmd(tiny_model, ckpt, DROPOUT), at_step=1)
    assert rc == 75, err
    (pre,) = [r for r in recs if r["event"] == "preempt"]
    assert (pre["step"], pre["outcome"], pre["during"]) == (1, "saved", "step")
    rc, recs, err = run(trainer_cmd(tiny_model, ckpt, DROPOUT))
    assert rc == 0, err
    steps = {r["step"]: r for r in recs if r["event"] == "step"}
    assert min(steps) == 2 and steps[2]["batch_sha"] == ref_steps[2]["batch_sha"]
    assert steps[2]["lr"] == ref_steps[2]["lr"]
    equal, total = equal_count(ref_t, tensors(ckpt, TOTAL))
    assert equal == total


def test_sigterm_between_micro_batches_abandons_the_partial_step(tiny_model, reference, tmp_path):
    """grad_accum 2: the signal lands after the first micro-batch of step 18 (its dropout has drawn from
    the RNG, its loader has moved). The stop saves step 17 as it was at that boundary."""
    ckpt = tmp_path / "trial"
    env = base_env(BATON_PAUSE_AFTER_STEP="17:1")
    rc, recs, err = run_and_sigterm(trainer_cmd(tiny_model, ckpt, DROPOUT), at_step=17, env=env, delay_s=1.0)
    assert rc == 75, err
    assert "1 micro-batch(es) into the next" in err
    pre = [r for r in recs if r["event"] == "preempt"][0]
    assert pre["step"] == 17 and pre["outcome"] == "saved"
    rc, recs, err = run(trainer_cmd(tiny_model, ckpt, DROPOUT))
    assert rc == 0, err
    assert [r["from_step"] for r in recs if r["event"] == "resume"] == [17]
    equal, total = equal_count(reference[2], tensors(ckpt, TOTAL))
    assert equal == total


def test_sigterm_during_startup_exits_75_and_restarts_exactly(tiny_model, reference, tmp_path):
    import subprocess

    from tests.helpers import REPO, records

    ckpt = tmp_path / "trial"
    p = subprocess.Popen(
        trainer_cmd(tiny_model, ckpt, DROPOUT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=base_env(),
        cwd=REPO,
    )
    for line in p.stderr:
        if " attempt " in line:  # logged after the model loaded, before the first step
            p.send_signal(15)
            break
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 75
    pre = [r for r in records(out) if r["event"] == "preempt"]
    assert (
        pre
        and pre[0]["step"] == 0
        and pre[0]["checkpoint"] is None
        and pre[0]["outcome"] == "nothing_to_save"
    )
    assert not list(ckpt.glob("runs/*/step-*")), "step 0 is recomputed from the config, not saved"
    rc, recs, err = run(trainer_cmd(tiny_model, ckpt, DROPOUT))
    assert rc == 0, err
    equal, total = equal_count(reference[2], tensors(ckpt, TOTAL))
    assert equal == total


def test_torn_and_truncated_checkpoints_are_passed_over(tiny_model, reference, tmp_path):
    ckpt = tmp_path / "trial"
    rc, recs, err = run_and_sigterm(
        trainer_cmd(tiny_model, ckpt, DROPOUT, "checkpoint.keep_last=5"), at_step=25
    )
    assert rc == 75, err
    (step_dir(ckpt, 25) / "_COMMIT").unlink()  # torn: the commit marker never landed
    shard = next(step_dir(ckpt, 20).glob("__0_*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # truncated shard
    rc, recs, err = run(trainer_cmd(tiny_model, ckpt, DROPOUT, "checkpoint.keep_last=5"))
    assert rc == 0, err
    refused = [r for r in recs if r["event"] == "checkpoint_refused"]
    assert [r["step"] for r in refused] == [20] and "bytes" in refused[0]["reason"]
    resume = [r for r in recs if r["event"] == "resume"][0]
    assert resume["from_step"] == 10
    equal, total = equal_count(reference[2], tensors(ckpt, TOTAL))
    assert equal == total


def test_a_foreign_checkpoint_is_refused_with_exit_1(tiny_model, interrupted, tmp_path):
    import hashlib

    ckpt = tmp_path / "trial"
    shutil.copytree(interrupted[0], ckpt)
    d = step_dir(ckpt, 13)
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["fingerprint"] = "f" * 64
    text = json.dumps(manifest)
    (d / "manifest.json").write_text(text)
    commit = json.loads((d / "_COMMIT").read_text())
    commit["manifest_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    (d / "_COMMIT").write_text(json.dumps(commit))
    rc, recs, err = run(trainer_cmd(tiny_model, ckpt, DROPOUT))
    assert rc == 1
    assert "refusing checkpoint" in err and "ffffffffffff" in err and "another run" in err
    assert not [r for r in recs if r["event"] == "step"], "nothing trained on top of a foreign checkpoint"


def test_a_crash_exits_1(tiny_model, tmp_path):
    broken = tmp_path / "model"
    shutil.copytree(tiny_model, broken)
    (broken / "config.json").write_text("{not json")
    rc, recs, err = run(trainer_cmd(broken, tmp_path / "ckpt"))
    assert rc == 1 and ("Traceback" in err or "error" in err)


def test_resuming_a_finished_run_exits_0_without_training(tiny_model, reference, tmp_path):
    ckpt = tmp_path / "done"
    shutil.copytree(reference[0], ckpt)
    rc, recs, err = run(trainer_cmd(tiny_model, ckpt, DROPOUT))
    assert rc == 0, err
    assert not [r for r in recs if r["event"] == "step"]
    assert [r["event"] for r in recs][-1] == "done"
