"""Compare the final checkpoints tensor by tensor, and write the drill's report.

    python -m steps.compare --reference URI --replay URI --trial URI --evidence URI --verify URI
                            --evictions URI --total-steps T --out DIR [--report-uri URI]

Tier 1 (CPU, gloo): every model and optimizer tensor of the trial equals the reference's (torch.equal).
Tier 2 (CUDA, or `deterministic: false`): the floor is the L2 distance between the reference and its
replay (the run's own nondeterminism), and the trial's L2 distance to the reference may be at most
1.5x that floor (steps/judge.py). HF `checkpoint-N/` roots are judged the same way, over every entry.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from steps.evidence import read_evidence, read_json
from steps.judge import judge, resolve_tier
from steps.report import write_report
from trainer.checkpoint import CorruptCheckpoint, final_committed, load_flat


def final_checkpoint(root: str) -> tuple[str, dict[str, Any]]:
    """The newest committed checkpoint under a checkpoint root (one run inside), and its manifest,
    checked against its _COMMIT (trainer.checkpoint.final_committed)."""
    return final_committed(root)


def compared_keys(t: dict[str, torch.Tensor]) -> list[str]:
    return sorted(k for k in t if k.startswith(("model.", "optim.", "optim_lr")))


def compare(reference: str, replay: str, trial: str, total_steps: int | None = None,
            tier: str = "auto") -> dict[str, Any]:
    """Either checkpoint format, told apart by the reference's layout: baton's DCP (`runs/`) or HF
    `checkpoint-N/` folders (steps/hf_checkpoint.py). `tier`: 1, 2, or auto (1 when the trial ran on a
    CPU with deterministic kernels, else 2; steps/judge.py)."""
    from steps.hf_checkpoint import compare_hf, is_hf_root

    if is_hf_root(reference):
        return compare_hf(reference, replay, trial, total_steps, tier)
    finals, flats = {}, {}
    for role, root in (("reference", reference), ("replay", replay), ("trial", trial)):
        try:
            finals[role] = final_checkpoint(root)
            flats[role] = load_flat(finals[role][0], finals[role][1]["files"])
        except (FileNotFoundError, CorruptCheckpoint) as e:  # a verdict, not a crash: the report says which run
            return {"equivalent": False, "format": "dcp", "tier": 1, "tensors": 0, "max_abs_diff": float("inf"),
                    "floor": 0.0, "differing": [], "problem": f"{role}: {e}"}
    (ref_url, ref_m), (rep_url, rep_m), (tri_url, tri_m) = finals["reference"], finals["replay"], finals["trial"]
    ref, rep, tri = flats["reference"], flats["replay"], flats["trial"]
    keys = compared_keys(ref)
    steps = {"reference": ref_m["step"], "replay": rep_m["step"], "trial": tri_m["step"]}
    if total_steps is not None and set(steps.values()) != {total_steps}:
        return {"equivalent": False, "tier": 1, "tensors": len(keys), "max_abs_diff": float("inf"), "floor": 0.0,
                "differing": [], "problem": f"final checkpoints are not all at step {total_steps}: {steps}"}
    missing = sorted(set(keys) - set(tri))
    if missing:
        return {"equivalent": False, "tier": 1, "tensors": len(keys), "max_abs_diff": float("inf"), "floor": 0.0,
                "differing": missing[:20], "problem": f"trial checkpoint lacks {len(missing)} tensors"}
    return {
        **judge(ref, rep, tri, keys, resolve_tier(tier, tri_m)), "format": "dcp",
        "steps_compared": {"reference": ref_m["step"], "trial": tri_m["step"]},
        "checkpoints": {"reference": ref_url, "replay": rep_url, "trial": tri_url},
    }


def lost_steps(trial_records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per attempt that ended without a preempt or done record: the last step it reached, its last save
    (a checkpoint record, else where it resumed), where the next attempt resumed (None: no next one),
    and the steps lost: trained, then gone with the process."""
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for r in trial_records:
        by_attempt.setdefault(r.get("attempt", 0), []).append(r)
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
        resumed = next((r["from_step"] for r in by_attempt[nxt] if r.get("event") == "resume"), 0) if nxt else None
        out.append({"attempt": a, "reached": reached, "last_save": saved, "resumed_from": resumed,
                    "lost": max(0, reached - (saved if resumed is None else resumed))})
    return out


def verdict_of(report: dict[str, Any], evictions: dict[str, Any], trial_records: list[dict[str, Any]]) -> str:
    """One sentence on whether the trial's job is preemption-safe, and if not, why."""
    happened = len(evictions.get("evictions", []))
    clean = report["steps"]["preemptions"]
    met = report.get("evictions_met")
    # Evictions that met no preemption save: from verify's classification, which leaves out those that
    # reached a trainer after it finished (missed); without it, every eviction short of a preempt record.
    lost = met["lost"] if met else max(0, happened - clean)
    if lost:
        detail = "; ".join(
            f"attempt {x['attempt']} reached step {x['reached']}, its last save was step {x['last_save']} "
            + (f"and the next attempt resumed from {x['resumed_from']}" if x["resumed_from"] is not None
               else "and no attempt came after it") + f" ({x['lost']} step(s) lost)"
            for x in lost_steps(trial_records))
        return (f"NOT preemption-safe: {lost} of {happened} evictions ended without a preempt record "
                f"(the trial died on SIGTERM without committing the step it had reached); "
                f"{report['steps']['replayed']} step(s) replayed" + (f"; {detail}" if detail else ""))
    if report["equivalent"] and not report.get("verify_problems") and report.get("inconclusive"):
        return "INCONCLUSIVE (the trainer is not blamed): " + "; ".join(report["inconclusive"])
    if not report["passed"]:
        return "NOT certified: " + "; ".join([*report.get("verify_problems", []),
                                              *([report["problem"]] if report.get("problem") else []),
                                              *([] if report["equivalent"] else ["final checkpoints differ"])])
    return (f"preemption-safe in this drill: {clean} eviction(s), each saved and resumed, 0 steps replayed, "
            f"final checkpoints ({report.get('format', 'dcp')}) equal")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m steps.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", required=True, help="checkpoint root of the reference run")
    ap.add_argument("--replay", required=True, help="checkpoint root of the reference's replay")
    ap.add_argument("--trial", required=True, help="checkpoint root of the evicted trial")
    ap.add_argument("--evidence", required=True, help="evidence root (reference/ and trial/ inside)")
    ap.add_argument("--verify", required=True, help="verify.json written by steps.verify")
    ap.add_argument("--evictions", help="evictions JSON written by steps.evict")
    ap.add_argument("--total-steps", type=int, required=True)
    ap.add_argument("--tier", default="auto", choices=("auto", "1", "2"),
                    help="1: every tensor equal; 2: within the measured floor (steps/judge.py); "
                         "auto: 1 on a CPU with deterministic kernels, else 2")
    ap.add_argument("--out", required=True, help="local folder for report.json, report.md, loss.png")
    ap.add_argument("--report-uri", help="also copy the report there (the bucket)")
    args = ap.parse_args(argv)

    try:
        result = compare(args.reference, args.replay, args.trial, args.total_steps, args.tier)
    except FileNotFoundError as e:  # e.g. a trial that died before its first checkpoint: still a report
        result = {"equivalent": False, "tier": 1, "tensors": 0, "max_abs_diff": float("inf"), "floor": 0.0,
                  "differing": [], "problem": str(e)}
    verify = read_json(args.verify)
    evictions = read_json(args.evictions) if args.evictions else {}
    steps = {k: verify[k] for k in ("total", "distinct", "replayed", "resumed_from", "preemptions")}
    report = {**result, "steps": steps, "verify_passed": verify["passed"], "verify_problems": verify["problems"],
              "preempt": verify["preempt"], "evictions": evictions,
              "inconclusive": verify.get("inconclusive", []), "evictions_met": verify.get("evictions_met"), "total_steps": args.total_steps,
              "trial_outcome": verify.get("trial_outcome"), "trial_retries": max(verify["attempts"] - 1, 0)}
    report["passed"] = bool(result["equivalent"] and verify["passed"] and not report["inconclusive"])
    ev_root = args.evidence.rstrip("/")
    trial_records = read_evidence(f"{ev_root}/trial")
    report["verdict"] = verdict_of(report, evictions, trial_records)
    write_report(Path(args.out), report, read_evidence(f"{ev_root}/reference"), trial_records, args.report_uri)
    print(report["verdict"], file=sys.stderr)
    verdict = "bit-identical" if result["tier"] == 1 and result["equivalent"] else (
        "within the floor" if result["equivalent"] else "NOT equivalent")
    print(f"{verdict}: {result.get('equal_tensors', 0)}/{result['tensors']} tensors equal, "
          f"max |diff| {result['max_abs_diff']:.3g}, floor {result['floor']:.3g} (tier {result['tier']})",
          file=sys.stderr)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
