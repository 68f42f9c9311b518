"""Count the trial's records across every attempt: the evidence that resume lost nothing.

    python -m steps.verify --evidence URI --total-steps T [--out URI]

Passes when every step 1..T has exactly one step record (0 replayed, none missing), each resume
started from the step of the preemption before it, every eviction met a running trainer that saved
(a `preempt` record), and the run finished. An eviction that reached the trial after it had finished,
or planned evictions that never happened because it finished first, make the result inconclusive,
never a failure of the trainer. Exit 0 or 1.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

from steps.lib.contract import BOUNDS
from steps.lib.evidence import read_evidence, read_json, shown, write_json
from trainer import env as baton_env
from trainer.bounded import ArgParser, Bound, flag_type
from trainer.exits import EXIT_SIGKILL
from trainer.faults import PEER_LOST
from trainer.untrusted import Refused


def _time(r: dict[str, Any]) -> float:
    t = r.get("time")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0


def failed_start(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """steps.train's own `failed` record (attempt null: its trainer exited before writing any record, so it
    claimed no attempt) written after every record of a claimed attempt: the trial's last attempt, which
    failed at its start (a torn checkpoint it could not read, a config error). Exit 1 is never retried, so
    there is at most one such attempt; at several nodes each node's copy of it is the same attempt."""
    claimed = max((_time(r) for r in records if isinstance(r.get("attempt"), int)), default=None)
    return next(
        (
            r
            for r in records
            if r.get("event") == "failed"
            and r.get("source") == "steps.train"
            and r.get("attempt") is None
            and (claimed is None or _time(r) > claimed)
        ),
        None,
    )


def attempts_of(records: list[dict[str, Any]]) -> int:
    """The trial's attempts: those that claimed a number, and a last one that failed before it could."""
    claimed = {r["attempt"] for r in records if isinstance(r.get("attempt"), int)}
    return len(claimed) + (1 if failed_start(records) is not None else 0)


def after_it(records: list[dict[str, Any]]) -> str:
    """What came after the trial's last claimed attempt, for a sentence that ends in it."""
    after = failed_start(records)
    if after is None:
        return "no attempt came after it"
    return (
        f"the attempt after it failed before writing any record (exit {shown(after.get('launcher_exit'))}; "
        "its log says why)"
    )


def trial_outcome(records: list[dict[str, Any]], eviction_list: list[dict[str, Any]]) -> tuple[str, str]:
    """(outcome, why): finished; died_on_sigterm (an evicted attempt ended without a preemption save and no
    attempt resumed after it: the drill's negative control, a trainer that dies on SIGTERM); or failed."""
    if any(r.get("event") == "done" for r in records):
        return "finished", ""
    attempts = [r["attempt"] for r in records if isinstance(r.get("attempt"), int)]
    last = max(attempts, default=None)
    saved = {r["attempt"] for r in records if r.get("event") == "preempt"}
    for ev in reversed(eviction_list):
        if ev.get("attempt") == last and last not in saved:
            ended = ev.get("ended") or {}
            how = ", ".join(
                f"{k} {ended[k]}" for k in ("exit_code", "message") if ended.get(k) not in (None, "")
            )
            return "died_on_sigterm", (
                f"the trial died on SIGTERM and was not resumable: attempt {last} was evicted at step "
                f"{ev.get('observed_step')} and ended without a preemption save ({how or 'no exit recorded'}), "
                f"and {after_it(records)}"
            )
    return "failed", "the trial ended without finishing and without an eviction to blame"


def _where(eviction: dict[str, Any]) -> str:
    """The step an eviction found its attempt at: from the attempt's own records, else what evict saw."""
    reached = eviction.get("reached_step")
    return str(reached if reached is not None else eviction.get("observed_step"))


def classify_evictions(
    records: list[dict[str, Any]], eviction_list: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each eviction with what it met: `landed` (the evicted attempt wrote a `preempt` or `retry_later`
    record: it saved or ended retry-safe; a `retry_later` for a lost peer does not count, since with several
    ranks or nodes the survivors write it when the evicted one died without saving), `missed` (the signal reached a trainer that had already
    finished: the attempt wrote `done`, or its pod ended with exit 0; it says nothing about the
    trainer), `killed` (SIGKILLed after its grace, exit 137: its preemption save did not finish in time),
    or `lost` (none of these: the attempt died without committing the step it reached).

    Each also gets `reached_step`: the last step the evicted attempt's own records show (None without any),
    where the signal found it. `observed_step` is what evict saw in the evidence, which lags, and evict may
    fire ahead of its point at a fast trainer: the two can be tens of steps apart."""
    by_attempt: dict[int, set[str]] = {}
    reached: dict[Any, int] = {}
    for r in records:
        if r.get("event") == "step":
            reached[r.get("attempt")] = max(reached.get(r.get("attempt"), 0), r["step"])
        if r.get("event") == "retry_later" and r.get("reason") == PEER_LOST:
            continue
        by_attempt.setdefault(r.get("attempt"), set()).add(str(r.get("event")))
    out = []
    for ev in eviction_list:
        events = by_attempt.get(ev.get("attempt"), set())
        ended = ev.get("ended") or {}
        if events & {"preempt", "retry_later"}:
            met = "landed"
        elif "done" in events or ended.get("exit_code") == 0:
            met = "missed"
        elif ended.get("exit_code") == EXIT_SIGKILL:
            met = "killed"
        else:
            met = "lost"
        out.append({**ev, "met": met, "reached_step": reached.get(ev.get("attempt"))})
    return out


def verify(
    records: list[dict[str, Any]],
    total_steps: int,
    evictions: int | None = None,
    planned: int | None = None,
    eviction_list: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The trial's evidence against its evictions. `problems` are the trainer's failures; `inconclusive`
    says why the drill could not judge it (an eviction that reached it after it finished, or planned
    evictions that never happened because it finished first): that is never the trainer's fault."""
    steps = [r["step"] for r in records if r.get("event") == "step"]
    counts = Counter(steps)
    resumes = sorted(
        (r for r in records if r.get("event") == "resume"), key=lambda r: (r["attempt"], r["time"])
    )
    preempts = sorted(
        (r for r in records if r.get("event") == "preempt"), key=lambda r: (r["attempt"], r["time"])
    )
    resumed_from = [r["from_step"] for r in resumes if not r.get("fresh")]
    missing = sorted(set(range(1, total_steps + 1)) - set(counts))
    problems: list[str] = []
    inconclusive: list[str] = []
    outcome, why = trial_outcome(records, eviction_list or [])
    replayed = len(steps) - len(counts)
    if replayed:
        problems.append(f"{replayed} step(s) replayed: {sorted(s for s, n in counts.items() if n > 1)[:10]}")
    if missing:
        problems.append(f"{len(missing)} step(s) missing: {missing[:10]}")
    if outcome == "died_on_sigterm":
        problems.append(why)
    elif outcome != "finished":
        problems.append("no done record: the trial did not finish")
    met = classify_evictions(records, eviction_list) if eviction_list is not None else None
    missed = [e for e in met or [] if e["met"] == "missed"]
    if missed:
        inconclusive.append(
            f"{len(missed)} eviction(s) reached the trial after it had finished (planned at step "
            f"{', '.join(str(e.get('point')) for e in missed)}; the trial outran them): they say nothing about "
            "the trainer; run more total_steps or fewer evictions"
        )
    if planned is not None and evictions is not None and evictions < planned:
        if outcome == "finished":
            inconclusive.append(
                f"{evictions} of {planned} planned evictions happened: the trial finished first "
                "(run more total_steps or fewer evictions)"
            )
        else:
            problems.append(f"{evictions} of {planned} planned evictions happened: the trial ended first")
    killed = [e for e in met or [] if e["met"] == "killed"]
    if killed:
        problems.append(
            f"{len(killed)} eviction(s) ended in SIGKILL after the grace (exit {EXIT_SIGKILL}, at step "
            f"{', '.join(_where(e) for e in killed)}): the preemption save did not "
            "finish in time (a faster save, async saves, or a longer grace)"
        )
    lost = [e for e in met if e["met"] == "lost"] if met is not None else None
    if lost is not None and lost and outcome != "died_on_sigterm":
        problems.append(
            f"{len(lost)} eviction(s) ended an attempt without a preempt record (at step "
            f"{', '.join(_where(e) for e in lost)}): an evicted attempt died without "
            "committing its step"
        )
    elif lost is None and evictions is not None and len(preempts) < evictions:
        problems.append(
            f"{evictions} evictions but {len(preempts)} clean preemptions: "
            "an evicted attempt died without committing its step"
        )
    # On several nodes every node stops at the same step: the nodes' copies of an attempt's `preempt`
    # agree (steps.lib.evidence keeps one copy per attempt and step, so copies that disagree are all here).
    for attempt in sorted({r["attempt"] for r in preempts}):
        stops = sorted({(r["step"], r.get("rank")) for r in preempts if r["attempt"] == attempt})
        if len({step for step, _ in stops}) > 1:
            problems.append(
                f"attempt {attempt}: the nodes stopped at different steps ("
                + ", ".join(f"rank {rank} at {step}" for step, rank in stops)
                + ")"
            )
    # Each attempt after a preemption must resume exactly where that preemption saved.
    by_attempt = {r["attempt"]: r for r in preempts}
    for r in resumes:
        prev = by_attempt.get(r["attempt"] - 1)
        if prev is not None and prev["step"] != r["from_step"]:
            problems.append(
                f"attempt {r['attempt']} resumed from {r['from_step']}, "
                f"but attempt {prev['attempt']} was preempted at {prev['step']}"
            )
    return {
        "total": len(steps),
        "distinct": len(counts),
        "replayed": replayed,
        "missing": missing[:50],
        "resumed_from": resumed_from,
        "preemptions": len(preempts),
        "preempt": [
            {
                "step": p["step"],
                "save_ms": p.get("save_ms"),
                "grace_left_s": p.get("grace_left_s"),
                "exit": p.get("exit"),
                "outcome": p.get("outcome"),
                "attempt": p["attempt"],
                "during": p.get("during"),
            }
            for p in preempts
        ],
        "attempts": attempts_of(records),
        "trial_outcome": outcome,
        "evictions_met": {
            k: sum(1 for e in met if e["met"] == k) for k in ("landed", "missed", "killed", "lost")
        }
        if met is not None
        else None,
        "passed": not problems and not inconclusive,
        "problems": problems,
        "inconclusive": inconclusive,
    }


def evictions_record(doc: dict[str, Any]) -> dict[str, Any]:
    """evictions.json (steps.evict) with the fields verify reads checked: `evictions`, a list of objects,
    and `planned`, a count; Refused for anything else."""
    evs, planned = doc.get("evictions"), doc.get("planned")
    if not isinstance(evs, list) or not all(isinstance(e, dict) for e in evs):
        raise Refused("evictions.json field 'evictions' must be a list of objects")
    if isinstance(planned, bool) or not isinstance(planned, int) or planned < 0:
        raise Refused("evictions.json field 'planned' must be a non-negative integer")
    for i, e in enumerate(evs):
        if (
            "attempt" in e
            and e["attempt"] is not None
            and (isinstance(e["attempt"], bool) or not isinstance(e["attempt"], int))
        ):
            raise Refused(f"evictions.json evictions[{i}].attempt must be an integer")
        if not isinstance(e.get("ended") or {}, dict):
            raise Refused(f"evictions.json evictions[{i}].ended must be an object")
    return doc


def summary(v: dict[str, Any]) -> str:
    lines = [
        f"step records {v['total']} total, {v['distinct']} distinct",
        f"resumed from {v['resumed_from']}",
        f"replayed {v['replayed']} steps",
        f"preemptions {v['preemptions']}",
    ]
    for p in v["preempt"]:
        lines.append(
            f"  step {p['step']}: save {p['save_ms']} ms, grace left {p['grace_left_s']} s, "
            f"exit {p['exit']} ({p['outcome']})"
        )
    lines += [f"problem: {x}" for x in v["problems"]]
    lines += [f"inconclusive: {x}" for x in v.get("inconclusive", [])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    baton_env.check_or_exit()
    ap = ArgParser(
        prog="python -m steps.verify",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--evidence", required=True, help="the trial's evidence folder")
    ap.add_argument(
        "--total-steps", type=flag_type(Bound(1, BOUNDS["total_steps"].high, integer=True)), required=True
    )
    ap.add_argument("--out", help="where to write verify.json")
    ap.add_argument(
        "--evictions", help="evictions JSON written by steps.evict: each must show as a preemption"
    )
    ap.add_argument(
        "--no-fail",
        action="store_true",
        help="exit 0 whenever a verdict was written (the drill's compare step is the gate)",
    )
    args = ap.parse_args(argv)
    ev, refused = None, None
    if args.evictions:
        try:
            ev = evictions_record(read_json(args.evictions))
        except FileNotFoundError:  # evict failed before its first write; say so rather than crash
            print(f"[verify] no evictions record at {args.evictions}", file=sys.stderr)
        except Refused as e:
            refused = str(e)
    malformed: list[str] = []
    v = verify(
        read_evidence(args.evidence, malformed, "trial"),
        args.total_steps,
        len(ev["evictions"]) if ev else None,
        ev["planned"] if ev else None,
        ev["evictions"] if ev else None,
    )
    v["problems"] += malformed
    if refused:
        v["problems"].append(f"the evictions record is refused: {refused}")
    elif args.evictions and ev is None:
        v["problems"].append("no evictions record: the evict step failed before it wrote one")
    elif ev and ev.get("problem"):
        v["problems"].append(f"evict: {ev['problem']}")
    v["passed"] = not v["problems"] and not v["inconclusive"]
    print(summary(v), file=sys.stderr)
    if args.out:
        write_json(args.out, v)
    return 0 if v["passed"] or args.no_fail else 1


if __name__ == "__main__":
    sys.exit(main())
