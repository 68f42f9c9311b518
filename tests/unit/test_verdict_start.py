"""The certifier's judgment itself, fast: the exact start, the trajectory apart from the checkpoints, and the
time a group took to come back. Each case has a control that passes, so that no case fails vacuously.

The slow drills (tests/workflow/test_certifier.py) judge real trainers; here the records and the
checkpoints' result are built by hand, so the verdict's own rules are what is tested: a verdict that
ignored the trajectory, or the start, would pass the slow suite whenever the checkpoints also differ."""

from __future__ import annotations

from steps.lib.verdict import assemble, comebacks
from steps.verify import verify

TOTAL = 6


def records(
    start: str = "w0",
    optim: str = "o0",
    leave_at: int | None = None,
    field: str = "batch_sha",
    resumed_at: int | None = None,
) -> list[dict]:
    """One role's records: a fresh start with its `start` record, a step record per step with its
    trajectory fields (`field` changes from step `leave_at` on), an optional preemption and resume, done."""
    out = [
        {"event": "resume", "step": 0, "attempt": 1, "time": 0.0, "from_step": 0, "fresh": True},
        {"event": "start", "step": 0, "attempt": 1, "time": 0.1, "weights_sha": start, "optim_sha": optim},
    ]
    attempt = 1
    for s in range(1, TOTAL + 1):
        rec = {
            "event": "step",
            "step": s,
            "attempt": attempt,
            "time": float(s),
            "loss": 1.0 / s,
            "batch_sha": s,
            "rng_sha": 100 + s,
            "lr": 0.001,
        }
        if leave_at is not None and s >= leave_at:
            rec[field] = rec[field] * 7 if field != "lr" else 0.002
        out.append(rec)
        if s == resumed_at:
            out += [
                {
                    "event": "preempt",
                    "step": s,
                    "attempt": attempt,
                    "time": s + 0.5,
                    "exit": 75,
                    "outcome": "saved",
                },
                {"event": "resume", "step": s, "attempt": attempt + 1, "time": s + 0.7, "from_step": s},
            ]
            attempt += 1
    out.append({"event": "done", "step": TOTAL, "attempt": attempt, "time": TOTAL + 1.0})
    return out


def result(equivalent: bool = True, tier: int = 2) -> dict:
    """What compare found in the final checkpoints: equal (Tier 1) or within the floor (Tier 2)."""
    return {
        "equivalent": equivalent,
        "tier": tier,
        "tensors": 4,
        "equal_tensors": 4 if tier == 1 else 0,
        "max_abs_diff": 0.0 if tier == 1 else 1e-3,
        "floor": 0.0 if tier == 1 else 1e-2,
        "differing": [],
    }


def judge(recs: dict[str, list[dict]], res: dict) -> dict:
    return assemble(res, verify(recs["trial"], TOTAL), {}, recs, TOTAL)


def test_control_equal_starts_and_trajectories_within_the_floor_pass():
    recs = {"reference": records(), "replay": records(), "trial": records(resumed_at=3)}
    report = judge(recs, result())
    assert report["passed"] is True, report["verdict"]
    assert report["verdict"].startswith("preemption-safe")


def test_an_initial_model_that_differs_at_every_start_is_not_certifiable_at_any_tier():
    """The unseeded init: reference and replay begin from different models. At Tier 2 the floor, the
    distance between two different models, absorbs a real resume bug (a lookahead's slow weights kept
    outside state_dict): compare finds the trial's checkpoints within it, and the trajectory's batch and
    RNG hashes are equal. The verdict must refuse, name the start and say how to seed, and never advise
    Tier 2. (The slow drill with a real unseeded HF script: tests/workflow/test_certifier.py.)"""
    recs = {
        "reference": records(start="w-a"),
        "replay": records(start="w-b"),
        "trial": records(start="w-c", resumed_at=3),
    }
    for tier in (1, 2):
        report = judge(recs, result(equivalent=True, tier=tier))
        assert report["passed"] is False
        assert report["verdict"].startswith("NOT certifiable: the initial model differs at every start"), (
            report["verdict"]
        )
        assert "set_seed" in report["verdict"] and "Tier 2" not in report["verdict"]


def test_a_different_initial_optimizer_state_is_named_too():
    recs = {"reference": records(optim="o-a"), "replay": records(optim="o-b"), "trial": records(resumed_at=3)}
    report = judge(recs, result())
    assert not report["passed"] and "initial optimizer state differs" in report["verdict"]


def test_a_trial_that_leaves_the_trajectory_fails_even_with_its_checkpoints_within_the_floor():
    recs = {
        "reference": records(),
        "replay": records(),
        "trial": records(leave_at=4, field="rng_sha", resumed_at=3),
    }
    report = judge(recs, result(equivalent=True))
    assert report["passed"] is False and report["verdict"].startswith("NOT preemption-safe: step 4"), report[
        "verdict"
    ]


def test_a_replay_that_leaves_the_trajectory_is_not_certifiable_even_with_its_checkpoints_equal():
    recs = {"reference": records(), "replay": records(leave_at=2), "trial": records(resumed_at=3)}
    report = judge(recs, result(equivalent=True, tier=1))
    assert report["passed"] is False and report["verdict"].startswith("NOT certifiable"), report["verdict"]


def test_a_role_without_a_start_record_cannot_be_certified_at_tier_2_only():
    recs = {
        "reference": records(),
        "replay": records(),
        "trial": [r for r in records(resumed_at=3) if r["event"] != "start"],
    }
    report = judge(recs, result(tier=2))
    assert report["passed"] is False and "wrote no start record" in report["verdict"], report["verdict"]
    assert judge(recs, result(tier=1))["passed"] is True  # control: Tier 1 compares every tensor exactly


def test_back_after_is_never_negative():
    """A later attempt's step record timed before the eviction's request (another node's clock, or a
    record of the wrong attempt) is not the group coming back. Control: one after it is."""
    evictions = {
        "evictions": [
            {"point": 3, "attempt": 1, "time": 10.0, "pod": "p", "node": 1, "ended": {"exit_code": 75}}
        ]
    }
    trial = [
        {"event": "step", "step": 4, "attempt": 2, "time": 7.2},
        {"event": "step", "step": 5, "attempt": 2, "time": 12.5},
    ]
    (c,) = comebacks(evictions, trial)
    assert c["back_s"] == 2.5 and c["back_at_step"] == 5
    (c,) = comebacks(evictions, trial[:1])
    assert c["back_s"] is None


def test_start_digests_see_the_initial_model_and_the_optimizer_state():
    import torch

    from trainer.trajectory import start_digests

    def built(seed: int | None) -> torch.nn.Module:
        if seed is not None:
            torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))

    a, b = built(0), built(0)
    assert start_digests(a) == start_digests(b)  # control: one seed, one start
    assert start_digests(built(0))["weights_sha"] != start_digests(built(1))["weights_sha"]
    torch.manual_seed(5)
    unseeded = [start_digests(built(None))["weights_sha"] for _ in range(2)]
    assert unseeded[0] != unseeded[1]  # built before seeding: a new model at every build
    oa, ob = torch.optim.AdamW(a.parameters()), torch.optim.AdamW(b.parameters())
    assert start_digests(a, oa) == start_digests(b, ob)
    ob.state[next(b.parameters())]["exp_avg"] = torch.ones(3, 4)
    assert start_digests(a, oa)["optim_sha"] != start_digests(b, ob)["optim_sha"]
    ob.param_groups[0]["lr"] = 0.5
    assert start_digests(a, oa)["weights_sha"] == start_digests(b, ob)["weights_sha"]
