"""The cause the verdict names is the cause, fast: records built by hand, so that the labelling rules of
steps/lib/trajectory.py and steps/lib/verdict.py are what is tested. Each cause has a control that names another
(or passes), so that no label is reached by default.

The step's own order decides: the RNG before the batch was drawn, then the batch with that RNG, then the
RNG the step trained with, then the schedule; with all four equal at Tier 1, the loss (state outside the
checkpoint). The slow drills with real HF scripts: tests/workflow/test_certifier.py."""

from __future__ import annotations

import torch

from steps.lib.judge import judge as judge_checkpoints
from steps.lib.verdict import assemble
from steps.verify import verify
from tests.unit.test_verdict_start import TOTAL as START_TOTAL
from tests.unit.test_verdict_start import records as start_records

TOTAL = START_TOTAL  # test_verdict_start's, whose records these build on


def records(
    changed: dict[str, int] | None = None, resumed_at: int | None = 3, batch_rng: bool = True
) -> list[dict]:
    """One role's records (test_verdict_start's: a start record, a step record per step, an optional
    preemption and resume, done), with `batch_rng_sha` on every step and `changed`: field -> the step from
    which it differs from the reference's ("loss" and "lr" included)."""
    out = start_records(resumed_at=resumed_at)
    for rec in out:
        if rec["event"] != "step":
            continue
        if batch_rng:
            rec["batch_rng_sha"] = 200 + rec["step"]
        for field, at in (changed or {}).items():
            if rec["step"] >= at:
                rec[field] = rec[field] * 3 if field != "lr" else 0.002
    return out


def result(equivalent: bool = True, tier: int = 1, components: list[dict] | None = None) -> dict:
    return {
        "equivalent": equivalent,
        "tier": tier,
        "tensors": 4,
        "equal_tensors": 4 if equivalent else 3,
        "max_abs_diff": 0.0,
        "floor": 0.0,
        "differing": [] if equivalent else ["optimizer.state.0.exp_avg"],
        "components": components
        or (
            [] if equivalent else [{"component": "optimizer", "entries": 2, "differing": 1, "l2_share": 1.0}]
        ),
    }


def verdict(
    trial: list[dict], res: dict | None = None, replay: list[dict] | None = None, batch_rng: bool = True
) -> dict:
    recs = {
        "reference": records(resumed_at=None, batch_rng=batch_rng),
        "replay": replay or records(resumed_at=None, batch_rng=batch_rng),
        "trial": trial,
    }
    return assemble(res or result(), verify(trial, TOTAL), {}, recs, TOTAL)


def test_control_an_equal_trajectory_and_equal_checkpoints_pass():
    report = verdict(records())
    assert report["passed"], report["verdict"]


def test_an_rng_that_differed_before_the_batch_was_drawn_is_named_with_every_field_that_differs():
    """A script that draws from the RNG at its first step, with a collator that draws too: the batch
    changes with it. The RNG is the cause; the batch is named beside it, never instead of it."""
    report = verdict(records({"batch_rng_sha": 4, "batch_sha": 4, "rng_sha": 4}))
    assert not report["passed"]
    assert report["verdict"] == (
        "NOT preemption-safe: step 4: the RNG differed before this batch was drawn (RNG not "
        "restored, or consumed at start); also different: the batch, the RNG at the step's "
        "start"
    ), report["verdict"]
    assert report["trajectory"]["trial"]["fields"] == ["batch_rng_sha", "batch_sha", "rng_sha"]


def test_a_data_order_that_differs_with_the_same_rng_is_the_data_pipelines_own_state():
    report = verdict(records({"batch_sha": 4}))
    assert "step 4: the data order differs with the same RNG" in report["verdict"], report["verdict"]
    assert (
        "a generator or counter of its own" in report["verdict"] and "also different" not in report["verdict"]
    )


def test_a_trainer_without_the_rng_before_the_batch_gets_a_batch_cause_that_claims_no_more():
    """Control of the one above: without batch_rng_sha the RNG before the batch is unknown, so the label
    may not say it was the same."""
    report = verdict(records({"batch_sha": 4}, batch_rng=False), batch_rng=False)
    assert "step 4: batch differs" in report["verdict"] and "with the same RNG" not in report["verdict"], (
        report["verdict"]
    )


def test_an_rng_that_changed_after_the_batch_was_drawn():
    report = verdict(records({"rng_sha": 5}))
    assert "step 5: the RNG at the step's start differs" in report["verdict"], report["verdict"]


def test_a_schedule_not_restored():
    report = verdict(records({"lr": 4}))
    assert "step 4: lr differs (scheduler not restored)" in report["verdict"], report["verdict"]


def test_the_same_batch_and_rng_with_another_loss_is_state_outside_the_checkpoint_at_tier_1():
    """A lookahead's slow weights, or a callback's counter, kept in memory: the trajectory agrees, and at
    Tier 1 (where the reference and its replay logged equal losses) the loss says where the trial left.
    The checkpoints' difference is named beside it, weights and moments before logged metrics."""
    trial = records({"loss": 5})
    report = verdict(trial, result(equivalent=False))
    assert report["verdict"].startswith(
        "NOT preemption-safe: step 5: the same batch and RNG, but the loss differs "
        "(state outside the checkpoint"
    ), report["verdict"]
    assert "final checkpoints differ: optimizer 1 of 2" in report["verdict"]
    # Controls: at Tier 2 a loss is a result of the kernels, never compared; and at Tier 1 a replay whose
    # losses differ from the reference's makes the loss no witness.
    assert "loss differs" not in verdict(trial, result(equivalent=False, tier=2))["verdict"]
    unexact = verdict(trial, result(equivalent=False), replay=records({"loss": 2}, resumed_at=None))
    assert "loss differs" not in unexact["verdict"] and "final checkpoints differ" in unexact["verdict"]


def test_a_loss_that_differed_before_the_trajectory_is_reported_too():
    report = verdict(records({"loss": 3, "batch_sha": 5}))
    assert report["verdict"].endswith("; the loss already differed at step 3"), report["verdict"]
    assert not verdict(records({"loss": 5, "batch_sha": 5}))["verdict"].endswith("at step 5")  # control


def test_logged_metrics_come_last_among_the_checkpoint_entries_that_differ():
    """At Tier 1 a logged gradient norm is exact too: it may not lead the list of a lookahead bug's
    differences. Control: the moment leads, and the metric is still listed."""
    ref = {
        "optimizer.state.0.exp_avg": torch.zeros(3),
        "trainer_state.log_history.3.grad_norm": torch.tensor(1.0),
        "model.w": torch.zeros(2),
    }
    trial = {
        "optimizer.state.0.exp_avg": torch.ones(3),
        "trainer_state.log_history.3.grad_norm": torch.tensor(2.0),
        "model.w": torch.ones(2),
    }
    found = judge_checkpoints(ref, dict(ref), trial, None, tier=1)
    assert found["differing"][-1] == "trainer_state.log_history.3.grad_norm", found["differing"]
    assert set(found["differing"][:2]) == {"optimizer.state.0.exp_avg", "model.w"}


def test_a_trainer_that_exited_before_its_first_record_is_named_by_its_own_error():
    """steps.train's own `failed` record (source steps.train, attempt null) carries the trainer's last
    `error:` line. Control: without it the verdict asks about the callback."""
    failed = {
        "event": "failed",
        "reason": "trainer_error",
        "step": 0,
        "attempt": None,
        "time": 1.0,
        "launcher_exit": 1,
        "source": "steps.train",
        "error": "error: config key 'seed': must be >= 0, got -1",
    }
    report = verdict([failed])
    assert (
        "the trial wrote no step records: its trainer exited 1 before its first record: error: config key "
        "'seed'"
    ) in report["verdict"], report["verdict"]
    assert "is BatonCallback attached" in verdict([])["verdict"]


def test_a_file_written_after_the_commit_is_named_and_fails_the_drill():
    """An `uncommitted_file` record (the HF callback's, for a file that reached checkpoint-N after its commit):
    the verdict names the file, though checkpoints and trajectory agree. Control: the same records without it
    pass (test_control_an_equal_trajectory_and_equal_checkpoints_pass)."""
    trial = records() + [
        {
            "event": "uncommitted_file",
            "step": 5,
            "attempt": 2,
            "time": 5.9,
            "file": "ema.pt",
            "how": "written",
        }
    ]
    report = verdict(trial)
    assert not report["passed"], report["verdict"]
    assert "the trial wrote checkpoint-5/ema.pt after the commit" in report["verdict"], report["verdict"]


def test_an_eviction_that_killed_the_loaders_workers_is_named_as_such():
    """An evicted attempt that lost its loader workers ends with a `failed` record (loader_workers_killed) and no
    preempt: the verdict quotes why, where it used to say only that the trial died on SIGTERM."""
    from steps.lib.verdict import verdict_of

    trial = [r for r in records(resumed_at=3) if not (r["event"] == "preempt")]
    why = "the data loader's workers were killed by the SIGTERM of the eviction at step 3, before any preemption save"
    trial.append(
        {
            "event": "failed",
            "step": 3,
            "attempt": 1,
            "time": 3.6,
            "reason": "loader_workers_killed",
            "error": why,
        }
    )
    evictions = {"evictions": [{"point": 3, "attempt": 1, "observed_step": 3, "ended": {"exit_code": 1}}]}
    report = {
        "steps": {"preemptions": 0, "replayed": 0},
        "evictions_met": {"lost": 1, "killed": 0, "missed": 0, "landed": 0},
    }
    said = verdict_of(report, evictions, trial)
    assert said.startswith("NOT preemption-safe: 1 of 1 evictions ended without a preempt record (" + why), (
        said
    )
    plain = verdict_of(report, evictions, [r for r in trial if r["event"] != "failed"])  # control
    assert "the trial died on SIGTERM without committing the step it had reached" in plain
