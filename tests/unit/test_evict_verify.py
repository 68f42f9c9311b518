"""Eviction points obey their rules, and verify counts what the records say."""

from __future__ import annotations

import pytest

from steps.evict import bands, eviction_nodes, eviction_points, latest
from steps.verify import verify


@pytest.mark.parametrize("total, n", [(200, 3), (40, 2), (300, 20), (10, 8), (1000, 1)])
def test_default_points_are_evenly_spaced_distinct_and_within_80_percent(total, n):
    pts = eviction_points(total, n)
    assert len(pts) == n and pts == sorted(set(pts)), "distinct and increasing: work behind each"
    assert pts[0] >= 1 and pts[-1] <= int(0.8 * total)
    gaps = [b - a for a, b in zip([0, *pts], pts, strict=False)]
    assert max(gaps) - min(gaps) <= 1, f"evenly spaced: {gaps}"
    assert pts == [hi for _, hi in bands(total, n)]


@pytest.mark.parametrize("seed", range(20))
def test_jittered_points_stay_inside_their_bands_and_follow_the_seed(seed):
    total, n = 200, 4
    pts = eviction_points(total, n, seed=seed, jitter=True)
    for p, (lo, hi) in zip(pts, bands(total, n), strict=True):
        assert lo <= p <= hi
    assert pts == eviction_points(total, n, seed=seed, jitter=True)
    assert pts[-1] <= 160 and len(set(pts)) == n


def test_jitter_actually_moves_points():
    draws = {tuple(eviction_points(200, 4, seed=s, jitter=True)) for s in range(10)}
    assert len(draws) > 5


@pytest.mark.parametrize("seed", range(10))
def test_edges_put_step_1_and_a_checkpoint_step_in_the_plan(seed):
    total, n, every = 200, 20, 10
    pts = eviction_points(total, n, seed=seed, jitter="edges", every_steps=every)
    jittered = eviction_points(total, n, seed=seed, jitter=True)
    assert pts[0] == 1 and pts[1] % every == 0 and pts[2:] == jittered[2:]
    for p, (lo, hi) in zip(pts, bands(total, n), strict=True):
        assert lo <= p <= hi
    assert len(set(pts)) == n and pts == sorted(pts)
    # Without a checkpoint step inside the second band, that point stays where the jitter drew it.
    assert eviction_points(200, 20, seed=seed, jitter="edges", every_steps=50)[1] == jittered[1]
    with pytest.raises(ValueError, match="jitter must be one of"):
        eviction_points(total, n, jitter="sometimes")


@pytest.mark.parametrize("total, n, msg", [(40, 33, "do not fit"), (1, 0, "total_steps"), (40, -1, ">= 0")])
def test_impossible_plans_are_refused(total, n, msg):
    with pytest.raises(ValueError, match=msg):
        eviction_points(total, n)


def _rec(event, step, attempt, **kw):
    return {"event": event, "step": step, "attempt": attempt, "time": attempt * 100 + step, **kw}


def _clean_run(total=10, stops=(3, 7)):
    recs, attempt, start = [], 1, 0
    for stop in [*stops, total]:
        recs.append(
            _rec("resume", start, attempt, from_step=start, **({"fresh": True} if start == 0 else {}))
        )
        recs += [_rec("step", s, attempt, loss=1.0) for s in range(start + 1, stop + 1)]
        if stop != total:
            recs.append(_rec("preempt", stop, attempt, save_ms=5, grace_left_s=29, exit=75, outcome="saved"))
        attempt, start = attempt + 1, stop
    recs.append(_rec("done", total, attempt - 1))
    return recs


def test_verify_passes_a_clean_run():
    v = verify(_clean_run(), 10, evictions=2)
    assert v["passed"], v["problems"]
    assert (v["total"], v["distinct"], v["replayed"], v["preemptions"], v["resumed_from"]) == (
        10,
        10,
        0,
        2,
        [3, 7],
    )


def test_verify_catches_replays_gaps_lost_preemptions_and_wrong_resumes():
    recs = _clean_run()
    recs.append(_rec("step", 5, 3, loss=1.0))
    assert "replayed" in " ".join(verify(recs, 10)["problems"])
    recs = [r for r in _clean_run() if not (r["event"] == "step" and r["step"] == 6)]
    assert "missing" in " ".join(verify(recs, 10)["problems"])
    recs = [r for r in _clean_run() if r["event"] != "done"]
    assert "did not finish" in " ".join(verify(recs, 10)["problems"])
    assert "clean preemptions" in " ".join(verify(_clean_run(), 10, evictions=3)["problems"])
    recs = _clean_run()
    for r in recs:
        if r["event"] == "resume" and r["from_step"] == 7:
            r["from_step"] = 6
    assert "resumed from 6" in " ".join(verify(recs, 10)["problems"])


def test_verify_requires_every_node_to_stop_at_the_same_step():
    from trainer.records import once

    def two_nodes(node1_stop: int) -> list[dict]:
        recs = _clean_run()
        copies = [
            {**r, "rank": 1, "step": node1_stop if r["step"] == 3 else r["step"]}
            for r in recs
            if r["event"] == "preempt"
        ]
        return once([{**r, "rank": 0} for r in recs] + copies)

    agreeing = verify(two_nodes(3), 10, evictions=2)  # node 1's copies collapse into rank 0's
    assert agreeing["passed"] and agreeing["preemptions"] == 2, agreeing["problems"]
    v = verify(two_nodes(4), 10, evictions=2)
    assert "attempt 1: the nodes stopped at different steps (rank 0 at 3, rank 1 at 4)" in v["problems"]


def test_latest_follows_the_newest_attempt():
    assert latest(_clean_run()) == (10, 3, True)
    assert latest([_rec("step", 4, 1), _rec("step", 4, 2)]) == (4, 2, False)


def _evict_with_pod(tmp_path, monkeypatch, phase):
    """steps.evict against a local pod registry whose one trial pod is in `phase`, the trial at step 2
    of 10 and never further: its exit code."""
    import json

    from steps import evict

    pods, evidence = tmp_path / "pods", tmp_path / "evidence"
    pods.mkdir()
    evidence.mkdir()
    (pods / "wf-trial-0.json").write_text(
        json.dumps({"name": "wf-trial-0", "workflow": "wf", "task": "trial", "phase": phase})
    )
    (evidence / "wf-trial-0.jsonl").write_text(json.dumps(_rec("step", 2, 1, loss=1.0)) + "\n")
    monkeypatch.setenv("BATON_LOCAL_PODS", str(pods))
    return evict.main(
        [
            "--evidence",
            str(evidence),
            "--total-steps",
            "10",
            "--evictions",
            "1",
            "--workflow",
            "wf",
            "--poll",
            "0.05",
            "--gone-timeout",
            "0.5",
            "--timeout",
            "3",
        ]
    )


def test_evict_gives_up_when_the_trial_failed_for_good(tmp_path, monkeypatch, capsys):
    assert _evict_with_pod(tmp_path, monkeypatch, "Failed") == 1
    assert "has had no pod for 0.5 s and has not finished" in capsys.readouterr().err


def test_evict_keeps_waiting_while_the_trial_has_a_live_pod(tmp_path, monkeypatch, capsys):
    assert _evict_with_pod(tmp_path, monkeypatch, "Running") == 1
    err = capsys.readouterr().err
    assert "has had no pod" not in err, "a live pod that has not reached the point yet is waited for"
    assert "timed out waiting for step 8" in err


def _died_on_sigterm():
    """The negative control's evidence: attempt 1 trains to step 4, is evicted, and ends without a
    preemption save; nothing retries it."""
    recs = [_rec("resume", 0, 1, from_step=0, fresh=True)] + [
        _rec("step", s, 1, loss=1.0) for s in range(1, 5)
    ]
    evictions = [
        {
            "event": "evict",
            "point": 4,
            "observed_step": 4,
            "attempt": 1,
            "pod": "wf-trial-0",
            "ended": {
                "phase": "Failed",
                "status": "Failed",
                "exit_code": 1,
                "message": "main: Error (exit code 1)",
            },
        }
    ]
    return recs, evictions


def test_verify_says_the_trial_died_on_sigterm_and_was_not_resumable():
    recs, evictions = _died_on_sigterm()
    v = verify(recs, 10, evictions=1, planned=2, eviction_list=evictions)
    assert v["passed"] is False and v["trial_outcome"] == "died_on_sigterm"
    said = " ".join(v["problems"])
    assert "the trial died on SIGTERM and was not resumable" in said
    assert "attempt 1 was evicted at step 4" in said and "main: Error (exit code 1)" in said
    assert "the trial ended first" in said and "finished first" not in said


def test_a_retry_that_failed_before_any_record_is_counted_and_named_not_called_absent():
    """Seen in the suite: the stock HF script died on SIGTERM mid-save, Argo retried it, and the retry failed at
    its start on the torn checkpoint (exit 1, before any record): steps.train's own `failed` record, attempt
    null, is the only trace. verify counts that attempt and the sentence names it. Controls: without that record
    the sentence says no attempt came; the same record from before the evicted attempt's records is not one."""
    from steps.lib.verdict import verdict_of

    recs, evictions = _died_on_sigterm()
    own = {
        "event": "failed",
        "reason": "trainer_error",
        "step": 0,
        "launcher_exit": 1,
        "attempt": None,
        "time": 1000,
        "source": "steps.train",
        "error": "the trainer exited 1 before writing any record",
    }
    v = verify([*recs, own], 10, evictions=1, planned=1, eviction_list=evictions)
    said = " ".join(v["problems"])
    assert v["attempts"] == 2 and v["trial_outcome"] == "died_on_sigterm", v
    assert "and the attempt after it failed before writing any record (exit 1; its log says why)" in said, (
        said
    )
    assert "no attempt came after it" not in said
    report = {"steps": {**v, "replayed": 0}, "evictions_met": {"lost": 1, "killed": 0}}
    sentence = verdict_of(report, {"evictions": evictions}, [*recs, own])
    assert "attempt 1 reached step 4" in sentence and "the attempt after it failed before writing" in sentence
    # Controls.
    v = verify(recs, 10, evictions=1, planned=1, eviction_list=evictions)
    assert v["attempts"] == 1 and "and no attempt came after it" in " ".join(v["problems"])
    assert "no attempt came after it" in verdict_of(report, {"evictions": evictions}, recs)
    v = verify([{**own, "time": 50}, *recs], 10, evictions=1, planned=1, eviction_list=evictions)
    assert v["attempts"] == 1 and "and no attempt came after it" in " ".join(v["problems"])


def test_a_trial_that_was_retried_after_its_eviction_did_not_die_on_sigterm():
    recs, evictions = _died_on_sigterm()
    recs += [_rec("resume", 0, 2, from_step=0, fresh=True), _rec("step", 1, 2, loss=1.0)]  # a retry came
    assert verify(recs, 10, eviction_list=evictions)["trial_outcome"] == "failed"
    assert verify(_clean_run(), 10, eviction_list=evictions)["trial_outcome"] == "finished"


def test_evict_writes_its_record_even_when_it_gives_up_and_resumes_from_it(tmp_path, monkeypatch):
    import json

    from steps import evict

    out = tmp_path / "evictions.json"
    pods, evidence = tmp_path / "pods", tmp_path / "evidence"
    pods.mkdir()
    evidence.mkdir()
    (pods / "wf-trial-1.json").write_text(
        json.dumps({"name": "wf-trial-1", "workflow": "wf", "task": "trial", "phase": "Failed"})
    )
    (evidence / "wf-trial-1.jsonl").write_text(json.dumps(_rec("step", 5, 2, loss=1.0)) + "\n")
    monkeypatch.setenv("BATON_LOCAL_PODS", str(pods))
    # An earlier attempt of this step evicted at the first point (4 of 10 steps, 2 evictions), then died.
    earlier = {"event": "evict", "point": 4, "observed_step": 4, "attempt": 1, "pod": "wf-trial-0"}
    out.write_text(json.dumps({"points": [4, 8], "evictions": [earlier], "planned": 2}))
    rc = evict.main(
        [
            "--evidence",
            str(evidence),
            "--total-steps",
            "10",
            "--evictions",
            "2",
            "--workflow",
            "wf",
            "--poll",
            "0.05",
            "--gone-timeout",
            "0.5",
            "--timeout",
            "3",
            "--out",
            str(out),
        ]
    )
    assert rc == 1  # the trial has no pod: it failed for good
    record = json.loads(out.read_text())
    assert record["evictions"] == [earlier]  # resumed, not redone: no second eviction at point 4
    assert "failed for good" in record["problem"]


def _evicted(attempt, point, exit_code, message=""):
    return {
        "event": "evict",
        "point": point,
        "observed_step": point,
        "attempt": attempt,
        "pod": f"wf-trial-{attempt}",
        "ended": {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "exit_code": exit_code,
            "message": message,
        },
    }


def test_an_eviction_that_reaches_a_finished_trainer_is_missed_and_inconclusive_never_the_trainers_fault():
    # Two evictions landed (attempts 1 and 2 saved); the third reached attempt 3 after its `done`: exit 0.
    recs = _clean_run(total=10, stops=(3, 7))
    evictions = [_evicted(1, 3, 75), _evicted(2, 7, 75), _evicted(3, 8, 0)]
    v = verify(recs, 10, evictions=3, planned=3, eviction_list=evictions)
    assert v["problems"] == [], "the trainer did nothing wrong"
    assert v["passed"] is False and v["evictions_met"] == {"landed": 2, "missed": 1, "killed": 0, "lost": 0}
    assert "reached the trial after it had finished" in v["inconclusive"][0]
    assert "run more total_steps" in v["inconclusive"][0]
    # Control: the same eviction with no `done` behind it and no preempt record is the trainer's failure.
    broken = [r for r in recs if not (r["event"] == "done")] + [_rec("step", s, 4) for s in range(8, 11)]
    broken.append(_rec("done", 10, 4))
    lost = [_evicted(1, 3, 75), _evicted(2, 7, 75), _evicted(3, 8, 1, "main: Error (exit code 1)")]
    v = verify(broken, 10, evictions=3, planned=3, eviction_list=lost)
    assert v["evictions_met"]["lost"] == 1
    assert any("died without committing its step" in p for p in v["problems"]), v


def test_planned_evictions_that_never_happened_because_the_trial_finished_are_inconclusive():
    v = verify(
        _clean_run(total=10, stops=(3,)), 10, evictions=1, planned=3, eviction_list=[_evicted(1, 3, 75)]
    )
    assert v["problems"] == [] and "1 of 3 planned evictions happened" in v["inconclusive"][0]
    # A trial that did not finish is another matter: that is a problem.
    recs = [r for r in _clean_run(total=10, stops=(3,)) if r["event"] != "done"]
    v = verify(recs, 10, evictions=1, planned=3, eviction_list=[_evicted(1, 3, 75)])
    assert any("the trial ended first" in p for p in v["problems"])


def test_compare_calls_a_missed_eviction_inconclusive_and_a_lost_one_not_preemption_safe():
    from steps.compare import verdict_of

    base = {
        "equivalent": True,
        "passed": False,
        "verify_problems": [],
        "steps": {"preemptions": 2, "replayed": 0},
        "evictions_met": {"landed": 2, "missed": 1, "lost": 0},
        "inconclusive": ["1 eviction(s) reached the trial after it had finished"],
    }
    assert verdict_of(base, {"evictions": [{}, {}, {}]}, _clean_run()).startswith("INCONCLUSIVE")
    broken = {
        **base,
        "inconclusive": [],
        "verify_problems": ["an evicted attempt died without committing its step"],
        "evictions_met": {"landed": 2, "missed": 0, "lost": 1},
    }
    assert verdict_of(broken, {"evictions": [{}, {}, {}]}, _clean_run()).startswith("NOT preemption-safe")


def test_step_rate_comes_from_the_newest_attempt_and_needs_three_records():
    from steps.evict import step_rate

    recs = [{"event": "step", "step": s, "attempt": 2, "time": 100 + s / 50} for s in range(10, 20)]
    recs += [{"event": "step", "step": s, "attempt": 1, "time": 10 + s} for s in range(1, 10)]
    assert step_rate(recs, 2) == pytest.approx(50)
    assert step_rate(recs, 1) == pytest.approx(1)
    assert step_rate(recs[:2], 2) is None


def test_a_slow_look_widens_the_finish_guard():
    """A trainer at 5 steps/s at step 30 of 48 finishes in 3.6 s, before its point (38) if evict's looks take
    2 s each (a loaded machine, a slow store): it is evicted now, and the reason names the looks. Controls:
    with looks of 10 ms it waits for its point (the fixed 1 s guard); at its point there is no early reason;
    an unknown rate never fires early."""
    from steps.evict import FINISH_GUARD_S, LOOKS_AHEAD, early_reason

    why = early_reason(30, 38, 48, 5.0, look_s=2.0)
    assert why is not None and f"{LOOKS_AHEAD} looks of 2 s" in why, why
    assert early_reason(30, 38, 48, 5.0, look_s=0.01) is None
    assert early_reason(46, 38, 48, 5.0, look_s=2.0) is None  # at or past its point: evicted as planned
    assert early_reason(30, 38, 48, None, look_s=2.0) is None
    fast = early_reason(46, 47, 48, 5.0, look_s=0.01)  # 0.4 s left: the fixed guard alone
    assert fast is not None and "looks" not in fast and f"{FINISH_GUARD_S:.3g} s" in fast, fast


def test_evidence_seen_late_counts_against_the_time_left():
    """Records on a store are flushed every 2 s (BATON_EVIDENCE_FLUSH_S): a trainer last seen at step 30 of 48
    at 5 steps/s, 2 s ago, is at about step 40, with 1.6 s left, less than two looks of 1 s: evicted now.
    Control: the same view seen at once (3.6 s left) waits for its point. The lag is the newest record's age,
    clamped."""
    from steps.evict import MAX_LAG_S, early_reason, evidence_lag

    why = early_reason(30, 38, 48, 5.0, look_s=1.0, lag_s=2.0)
    assert why is not None and "seen 2 s late" in why, why
    assert early_reason(30, 38, 48, 5.0, look_s=1.0, lag_s=0.0) is None
    recs = [{"event": "step", "step": s, "attempt": 2, "time": 100.0 + s} for s in range(1, 5)]
    recs.append({"event": "step", "step": 9, "attempt": 1, "time": 500.0})  # another attempt: not this one's
    assert evidence_lag(recs, 2, now=106.5) == pytest.approx(2.5)
    assert evidence_lag(recs, 2, now=50.0) == 0.0  # a clock behind the trainer's
    assert evidence_lag(recs, 2, now=1e9) == MAX_LAG_S
    assert evidence_lag(recs, 3, now=106.5) == 0.0


def test_evict_fires_before_its_point_at_a_trainer_about_to_finish(tmp_path, monkeypatch):
    """A trial at step 5 of 40 that trains 100 steps a second finishes in 0.35 s, long before the point
    (step 32) could be seen and signalled: evict asks for the eviction now. Control: the same trial at
    1 step a second is left alone until its point (the run times out instead)."""
    import json

    from steps import evict

    def run(seconds_per_step, out):
        pods, evidence = tmp_path / f"pods-{out}", tmp_path / f"evidence-{out}"
        pods.mkdir()
        evidence.mkdir()
        (pods / "wf-trial-0.json").write_text(
            json.dumps({"name": "wf-trial-0", "workflow": "wf", "task": "trial", "phase": "Running"})
        )
        lines = [
            json.dumps({"event": "step", "step": s, "attempt": 1, "time": 1000 + s * seconds_per_step})
            for s in range(1, 6)
        ]
        (evidence / "wf-trial-0.jsonl").write_text("\n".join(lines) + "\n")
        monkeypatch.setenv("BATON_LOCAL_PODS", str(pods))
        rc = evict.main(
            [
                "--evidence",
                str(evidence),
                "--total-steps",
                "40",
                "--evictions",
                "1",
                "--workflow",
                "wf",
                "--poll",
                "0.02",
                "--timeout",
                "1",
                "--gone-timeout",
                "5",
                "--out",
                str(tmp_path / out),
            ]
        )
        return rc, (pods / "wf-trial-0.delete").exists(), json.loads((tmp_path / out).read_text())

    rc, requested, record = run(0.01, "fast.json")
    assert requested and record["evictions"][0]["observed_step"] == 5 and record["points"] == [32]
    assert "predicted to finish" in record["evictions"][0]["early"]
    rc, requested, record = run(1.0, "slow.json")
    assert rc == 1 and not requested and record["evictions"] == []


def test_an_eviction_sigkilled_after_its_grace_is_a_save_that_did_not_finish_in_time():
    from steps.lib.verdict import verdict_of

    recs = _clean_run(total=10, stops=(3,))
    recs = [r for r in recs if not (r["event"] == "preempt")]  # attempt 1 wrote no preempt record
    # evict fired early, having seen step 1 in the lagging evidence; the attempt's own records reached step 3,
    # and that is where the problem places the kill (the real-node test: evict saw 111, the kill came at 160).
    killed = [{**_evicted(1, 3, 137, "main: Error (exit code 137)"), "observed_step": 1}]
    v = verify(recs, 10, evictions=1, planned=1, eviction_list=killed)
    assert v["evictions_met"]["killed"] == 1 and any("did not finish in time" in p for p in v["problems"])
    assert any("(exit 137, at step 3)" in p for p in v["problems"]), v["problems"]
    # Control: an attempt with no step records of its own is placed where evict saw it.
    bare = [r for r in recs if not (r["event"] == "step" and r["attempt"] == 1)]
    problems = verify(bare, 10, evictions=1, planned=1, eviction_list=killed)["problems"]
    assert any("(exit 137, at step 1)" in p for p in problems), problems
    report = {
        "equivalent": True,
        "passed": False,
        "steps": {"preemptions": 0, "replayed": 0},
        "evictions_met": v["evictions_met"],
        "verify_problems": v["problems"],
    }
    assert verdict_of(report, {"evictions": killed}, recs).startswith(
        "NOT preemption-safe: 1 of 1 evictions ended in SIGKILL after the grace (exit 137)"
    )


def _baseline(resumes):
    """A baseline's records: preempted at each step in `resumes`, resumed there, finished at 10."""
    recs = _clean_run(total=10, stops=tuple(resumes))
    return recs


def test_an_interrupted_baseline_leaves_the_verdict_open_where_a_resume_bug_could_hide():
    from steps.lib.verdict import baseline_doubts, baseline_interruptions

    clean = baseline_interruptions({"reference": _clean_run(10, ()), "replay": _clean_run(10, ())})
    assert clean == {
        "reference": {"preempted_at": [], "resumed_from": []},
        "replay": {"preempted_at": [], "resumed_from": []},
    }
    assert baseline_doubts(1, clean, [3, 7]) == [] and baseline_doubts(2, clean, [3, 7]) == []
    ref_at_3 = baseline_interruptions({"reference": _baseline([3]), "replay": _clean_run(10, ())})
    assert ref_at_3["reference"] == {"preempted_at": [3], "resumed_from": [3]}
    # One clean witness is enough (the replay ran uninterrupted), at either tier.
    assert baseline_doubts(1, ref_at_3, [3, 7]) == [] and baseline_doubts(2, ref_at_3, [3, 7]) == []
    # Tier 1: both resumed where the trial did (3 and 7): open. One of them elsewhere (at 5): it stands.
    both_shared = baseline_interruptions({"reference": _baseline([3]), "replay": _baseline([7])})
    assert (
        "both preempted and resumed where the trial resumed too" in baseline_doubts(1, both_shared, [3, 7])[0]
    )
    assert (
        baseline_doubts(
            1, baseline_interruptions({"reference": _baseline([3]), "replay": _baseline([5])}), [3, 7]
        )
        == []
    )
    # Tier 2: both resumed, wherever: the floor holds resumes.
    both = baseline_interruptions({"reference": _baseline([3]), "replay": _baseline([6])})
    assert "the floor holds resumes" in baseline_doubts(2, both, [5])[0]


def test_the_summary_names_an_interrupted_baseline_and_is_silent_for_a_clean_one():
    from steps.lib.report import summary
    from steps.lib.verdict import baseline_interruptions

    def report(baseline):
        return {
            "steps": {"total": 10, "distinct": 10, "resumed_from": [], "replayed": 0, "preemptions": 0},
            "tier": 2,
            "equivalent": True,
            "max_abs_diff": 0.0,
            "floor": 0.0,
            "baseline": baseline,
        }

    interrupted = baseline_interruptions({"reference": _baseline([3]), "replay": _clean_run(10, ())})
    assert "baseline reference: preempted at [3], resumed from [3]" in summary(report(interrupted))
    assert "baseline replay" not in summary(report(interrupted))
    clean = baseline_interruptions({"reference": _clean_run(10, ()), "replay": _clean_run(10, ())})
    assert "baseline" not in summary(report(clean))


def test_the_node_each_eviction_ends_is_drawn_under_the_seed_or_pinned():
    assert eviction_nodes(3, 1, seed=0) == [None, None, None]  # one pod: no choice to make
    drawn = eviction_nodes(8, 2, seed=0)
    assert drawn == eviction_nodes(8, 2, seed=0) and set(drawn) == {
        0,
        1,
    }  # repeatable, and both nodes come up
    assert drawn != eviction_nodes(8, 2, seed=1)
    assert eviction_nodes(3, 4, seed=0, pinned=3) == [3, 3, 3]


def test_a_survivors_peer_lost_record_is_not_the_evicted_nodes_save():
    """nodes=2, the negative control: node 1 is evicted and dies on SIGTERM; node 0's rank writes `retry_later`
    `peer_lost` and exits 75. That says nothing of node 1: the eviction is lost, and the verdict says the
    trial died without its preempt record (it said "landed", then blamed the replayed steps)."""
    from steps.lib.verdict import verdict_of

    recs = _clean_run(total=10, stops=(3,))
    recs = [r for r in recs if r["event"] != "preempt"]
    recs.append(_rec("retry_later", 3, 1, reason="peer_lost", rank=0, exit=75))
    died = [dict(_evicted(1, 3, 1, "pod deleted"), node=1)]
    v = verify(recs, 10, evictions=1, planned=1, eviction_list=died)
    assert v["evictions_met"] == {"landed": 0, "missed": 0, "killed": 0, "lost": 1}, v
    report = {
        "equivalent": False,
        "passed": False,
        "steps": {"preemptions": 0, "replayed": 0},
        "evictions_met": v["evictions_met"],
        "verify_problems": v["problems"],
    }
    assert verdict_of(report, {"evictions": died}, recs).startswith(
        "NOT preemption-safe: 1 of 1 evictions ended without a preempt record"
    )
    # Controls: a retry_later for another reason (a store that failed every save) is the evicted attempt
    # ending retry-safe, and so is a preempt record beside the survivor's peer_lost.
    for extra in (
        _rec("retry_later", 3, 1, reason="save_failed", rank=0, exit=75),
        _rec("preempt", 3, 1, outcome="saved", exit=75, rank=1),
    ):
        v = verify([*recs, extra], 10, evictions=1, planned=1, eviction_list=died)
        assert v["evictions_met"]["landed"] == 1 and v["evictions_met"]["lost"] == 0, (extra, v)
