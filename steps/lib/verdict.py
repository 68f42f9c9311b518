"""The drill's verdict: one sentence that says whether the trial's job is preemption-safe, and if not,
what broke, from everything the drill gathered: the checkpoint comparison (steps/lib/judge.py), the
trajectory (steps/lib/trajectory.py), the trial's records (steps/verify.py) and the roles' contract.

The first finding that explains a failure wins, in this order: an eviction the trial did not survive, a
role that broke the contract (no step records, no resume record, no `done`, no committed checkpoint), a
trainer whose every start differs (not certifiable), the first step where the trial left the reference's
trajectory (at Tier 1 its loss too: the same batch and RNG with another loss is state outside the
checkpoint, named with the checkpoint entries that differ), a Tier 2 judgment without a trajectory, final checkpoints that differ (grouped by component),
the rest of verify's problems. An eviction that reached a finished trainer makes the drill inconclusive,
never a failure of the trainer.
"""

from __future__ import annotations

from typing import Any

from steps.lib import trajectory
from steps.lib.contract import ROLES
from steps.lib.judge import component_of
from steps.verify import after_it
from trainer.exits import EXIT_SIGKILL
from trainer.records import LOADER_WORKERS_KILLED, UNCOMMITTED_FILE


def lost_steps(trial_records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per attempt that ended without a preempt or done record: the last step it reached, its last save
    (a checkpoint record, else where it resumed), where the next attempt resumed (None: no next one),
    and the steps lost: trained, then gone with the process."""
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for r in trial_records:
        if isinstance(r.get("attempt"), int):  # steps.train's own retry_later has none: no trainer ran
            by_attempt.setdefault(r["attempt"], []).append(r)
    out = []
    attempts = sorted(by_attempt)
    for i, a in enumerate(attempts):
        recs = by_attempt[a]
        if any(r.get("event") in ("preempt", "done") for r in recs):
            continue
        reached = max((r["step"] for r in recs if r.get("event") == "step"), default=0)
        start = next((r["from_step"] for r in recs if r.get("event") == "resume"), 0)
        saved = max([start, *(r["step"] for r in recs if r.get("event") == "checkpoint")])
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        resumed = (
            next((r["from_step"] for r in by_attempt[nxt] if r.get("event") == "resume"), 0) if nxt else None
        )
        out.append(
            {
                "attempt": a,
                "reached": reached,
                "last_save": saved,
                "resumed_from": resumed,
                "lost": max(0, reached - (saved if resumed is None else resumed)),
            }
        )
    return out


def contract_breaks(records: dict[str, list[dict[str, Any]]], result: dict[str, Any]) -> list[str]:
    """Each clause of "the contract, for any trainer" (docs/own-trainer.md) that a role broke, as a sentence
    naming the role: its records are what the drill judges, and a role without them cannot be judged at all."""
    out = []
    for role in ROLES:
        recs = records.get(role, [])
        steps = [r for r in recs if r.get("event") == "step"]
        if not steps:
            failed = next(
                (r for r in recs if r.get("event") == "failed" and r.get("reason") == "trainer_error"), None
            )
            if failed:  # steps.train's own record: the trainer ended before its first record, and said why
                out.append(
                    f"the {role} wrote no step records: its trainer exited {failed.get('launcher_exit')} "
                    f"before its first record: {str(failed.get('error'))[:300]}"
                )
            else:
                out.append(
                    f"the {role} wrote no step records (an HF script: is BatonCallback attached and "
                    "baton.run(trainer) called? see the role's log)"
                )
            continue
        stepped = sorted({r.get("attempt", 0) for r in steps})
        resumed = {r.get("attempt", 0) for r in recs if r.get("event") == "resume"}
        if set(stepped) - resumed:
            out.append(
                f"the {role} trained without a resume record in attempt(s) "
                f"{sorted(set(stepped) - resumed)} (an HF script: is baton.run(trainer) called instead "
                "of trainer.train()?)"
            )
        if role != "trial" and not any(r.get("event") == "done" for r in recs):  # the trial's is verify's
            out.append(f"the {role} did not finish (no done record)")
        late = sorted(
            {(r.get("step"), str(r.get("file"))) for r in recs if r.get("event") == UNCOMMITTED_FILE},
            key=lambda x: (x[0] if isinstance(x[0], int) else -1, x[1]),
        )
        if late:
            shown = ", ".join(f"checkpoint-{step}/{name}" for step, name in late[:3]) + (
                " ..." if len(late) > 3 else ""
            )
            out.append(
                f"the {role} wrote {shown} after the commit: in no manifest, so a resume never sees it (a "
                "callback that saves its state outside on_save; docs/own-trainer.md)"
            )
    problem = str(result.get("problem") or "")
    for role in ROLES:
        if problem.startswith(f"{role}:"):
            out.append(
                f"the {role}'s final checkpoint cannot be judged: {problem.removeprefix(role + ':').strip()}"
            )
    return out


def _checkpoints_differ(report: dict[str, Any]) -> str:
    rows = [c for c in report.get("components", []) if c["differing"]]
    if not rows:
        return "final checkpoints differ"
    if report.get(
        "differing"
    ):  # the component of the most telling entry first (an exact one: a counter, an RNG)
        lead = component_of(report["differing"][0])
        rows.sort(key=lambda c: c["component"] != lead)
    parts = [
        f"{c['component']} {c['differing']} of {c['entries']}"
        + (f" ({c['l2_share']:.0%} of the L2)" if c["l2_share"] else "")
        for c in rows
    ]
    first = report.get("differing", [])[:3]
    return f"final checkpoints differ: {'; '.join(parts)}" + (f"; first: {', '.join(first)}" if first else "")


def verdict_of(report: dict[str, Any], evictions: dict[str, Any], trial_records: list[dict[str, Any]]) -> str:
    """One sentence on whether the trial's job is preemption-safe, and if not, why."""
    happened = len(evictions.get("evictions", []))
    clean = report["steps"]["preemptions"]
    met = report.get("evictions_met")
    # Evictions that met no preemption save: from verify's classification, which leaves out those that
    # reached a trainer after it finished (missed); without it, every eviction short of a preempt record.
    lost = met["lost"] if met else max(0, happened - clean)
    if met and met.get("killed"):
        return (
            f"NOT preemption-safe: {met['killed']} of {happened} evictions ended in SIGKILL after the grace "
            f"(exit {EXIT_SIGKILL}): the preemption save did not finish in time; the retry resumed from the last commit, "
            f"{report['steps']['replayed']} step(s) replayed"
        )
    if lost:
        detail = "; ".join(
            f"attempt {x['attempt']} reached step {x['reached']}, its last save was step {x['last_save']} "
            + (
                f"and the next attempt resumed from {x['resumed_from']}"
                if x["resumed_from"] is not None
                else f"and {after_it(trial_records)}"
            )
            + f" ({x['lost']} step(s) lost)"
            for x in lost_steps(trial_records)
        )
        workers = next(
            (
                str(r.get("error"))
                for r in trial_records
                if r.get("event") == "failed" and r.get("reason") == LOADER_WORKERS_KILLED
            ),
            None,
        )
        why = workers if workers else "the trial died on SIGTERM without committing the step it had reached"
        return (
            f"NOT preemption-safe: {lost} of {happened} evictions ended without a preempt record "
            f"({why}); {report['steps']['replayed']} step(s) replayed" + (f"; {detail}" if detail else "")
        )
    if report.get("contract"):
        return "NOT certified: " + "; ".join(report["contract"])
    traj = report.get("trajectory") or {}
    if traj.get("replay"):
        return f"NOT certifiable: {traj['finding'].removeprefix('not certifiable: ')}"
    if traj.get("trial"):
        if traj["trial"]["field"] == "loss" and not report["equivalent"] and not report.get("problem"):
            # The trajectory agrees: the loss says where it began, the checkpoints what was lost.
            return f"NOT preemption-safe: {traj['finding']}; {_checkpoints_differ(report)}"
        return f"NOT preemption-safe: {traj['finding']}"
    if report.get("tier") == 2 and traj and not traj.get("recorded"):
        return f"NOT certifiable at Tier 2: {traj['finding']}"
    if report.get("tier") == 1 and report.get("floor_differing"):
        return (
            f"NOT certifiable at Tier 1: the reference and its replay, two uninterrupted runs, already "
            f"differ in {report['floor_differing']} entries (this run is not deterministic here: use Tier 2)"
        )
    if report.get("tier") == 2 and report.get("replay_exact_differing"):
        return (
            "NOT certifiable: the reference and its replay differ in entries kernels cannot change: "
            f"{', '.join(report['replay_exact_differing'][:3])} (the trainer is nondeterministic across starts)"
        )
    if not report["equivalent"] and not report.get("problem"):
        return f"NOT preemption-safe: {_checkpoints_differ(report)}"
    if report["equivalent"] and not report.get("verify_problems") and report.get("inconclusive"):
        return "INCONCLUSIVE (the trainer is not blamed): " + "; ".join(report["inconclusive"])
    if not report["passed"]:
        return "NOT certified: " + "; ".join(
            [*report.get("verify_problems", []), *([report["problem"]] if report.get("problem") else [])]
        )
    return (
        f"preemption-safe in this drill: {clean} eviction(s), each saved and resumed, 0 steps replayed, "
        f"the trajectory and the final checkpoints ({report.get('format', 'dcp')}, tier {report['tier']}) equal"
    )


def baseline_interruptions(records: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, list[int]]]:
    """For the reference and its replay: the steps they were preempted at and resumed from (both empty for a
    baseline that ran uninterrupted). On Spot capacity they are preempted like the trial, on purpose."""
    out = {}
    for role in ("reference", "replay"):
        recs = records.get(role, [])
        out[role] = {
            "preempted_at": sorted(r["step"] for r in recs if r.get("event") == "preempt"),
            "resumed_from": sorted(
                r["from_step"] for r in recs if r.get("event") == "resume" and not r.get("fresh")
            ),
        }
    return out


def baseline_doubts(
    tier: int, baseline: dict[str, dict[str, list[int]]], trial_resumed: list[int]
) -> list[str]:
    """Why an interrupted baseline leaves the verdict open. A resumed baseline is no longer a clean
    reference: a resume bug can produce the same tensors on both sides. A pass needs the trial equal to the
    reference and the replay equal to the reference, so one clean witness is enough: a baseline that ran
    uninterrupted (Tier 1 and Tier 2), or (Tier 1) one that resumed only at steps the trial did not resume
    at. At Tier 2 resumes in both baselines put resumes into the floor itself."""
    interrupted = {role: b["resumed_from"] for role, b in baseline.items() if b["resumed_from"]}
    if len(interrupted) < 2:
        return []
    if tier == 2:
        return [
            "both the reference and its replay were preempted and resumed (at steps "
            f"{interrupted['reference']} and {interrupted['replay']}): the floor holds resumes, so a resume "
            "bug could hide in it; run the baseline on the on-demand pool (-p baseline_pool=on-demand)"
        ]
    shared = {role: sorted(set(steps) & set(trial_resumed)) for role, steps in interrupted.items()}
    if all(shared.values()):
        return [
            f"the reference and its replay were both preempted and resumed where the trial resumed too "
            f"(reference at {shared['reference']}, replay at {shared['replay']}): a resume bug could give all "
            "three the same tensors; run again, or run the baseline on the on-demand pool "
            "(-p baseline_pool=on-demand)"
        ]
    return []


def comebacks(evictions: dict[str, Any], trial: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each eviction: the pod (and node of the group) it ended, how that pod ended, and how long the group
    took to come back (`back_s`): from the eviction's request (its `time` in evictions.json) to the first
    step record of a later attempt written after that request; never negative. None: it never came back,
    or the eviction has no time."""
    out = []
    for ev in evictions.get("evictions", []):
        at = (
            ev.get("time")
            if isinstance(ev.get("time"), int | float) and not isinstance(ev.get("time"), bool)
            else None
        )
        after = [
            r
            for r in trial
            if r.get("event") == "step"
            and isinstance(r.get("attempt"), int)
            and isinstance(ev.get("attempt"), int)
            and r["attempt"] > ev["attempt"]
            and isinstance(r.get("time"), int | float)
            and at is not None
            and r["time"] >= at
        ]
        first = min(after, key=lambda r: r["time"], default=None)
        ended = ev.get("ended") or {}
        out.append(
            {
                "point": ev.get("point"),
                "pod": ev.get("pod"),
                "node": ev.get("node"),
                "attempt": ev.get("attempt"),
                "exit_code": ended.get("exit_code"),
                "back_s": round(first["time"] - at, 2) if first and at is not None else None,
                "back_at_step": first["step"] if first else None,
            }
        )
    return out


def assemble(
    result: dict[str, Any],
    verify: dict[str, Any],
    evictions: dict[str, Any],
    records: dict[str, list[dict[str, Any]]],
    total_steps: int,
    refused: list[str] | tuple[str, ...] = (),
) -> dict[str, Any]:
    """report.json: the comparison, verify's counts, the trajectory, the contract, and the verdict.
    `refused`: the records and files that were refused as malformed (steps/lib/evidence.py), each naming the
    role and the field; any makes the drill fail, since what was refused may have been the evidence."""
    steps = {k: verify[k] for k in ("total", "distinct", "replayed", "resumed_from", "preemptions")}
    report = {
        **result,
        "steps": steps,
        "verify_passed": verify["passed"],
        "verify_problems": verify["problems"],
        "preempt": verify["preempt"],
        "evictions": evictions,
        "total_steps": total_steps,
        "inconclusive": verify.get("inconclusive", []),
        "evictions_met": verify.get("evictions_met"),
        "trial_outcome": verify.get("trial_outcome"),
        "trial_retries": max(verify["attempts"] - 1, 0),
        "trajectory": trajectory.check(
            records.get("reference", []), records.get("replay", []), records.get("trial", []), result["tier"]
        ),
        "contract": [*contract_breaks(records, result), *(f"refused: {x}" for x in refused)],
        "baseline": baseline_interruptions(records),
        "comebacks": comebacks(evictions, records.get("trial", [])),
    }
    report["inconclusive"] = [
        *report["inconclusive"],
        *baseline_doubts(result["tier"], report["baseline"], verify.get("resumed_from", [])),
    ]
    traj = report["trajectory"]
    trajectory_ok = not traj["replay"] and not traj["trial"] and (traj["recorded"] or result["tier"] == 1)
    certifiable = not (result["tier"] == 1 and result.get("floor_differing")) and not result.get(
        "replay_exact_differing"
    )
    report["passed"] = bool(
        result["equivalent"]
        and verify["passed"]
        and not report["inconclusive"]
        and trajectory_ok
        and certifiable
        and not report["contract"]
    )
    report["verdict"] = verdict_of(report, evictions, records.get("trial", []))
    return report
