"""Compare the final checkpoints entry by entry, and write the drill's report.

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
from steps.verdict import assemble, verdict_of  # noqa: F401 - verdict_of: compare's API before steps/verdict.py
from trainer.checkpoint import CorruptCheckpoint, open_root
from trainer.checkpoint.hf_read import BadCheckpoint


def final_checkpoint(root: str) -> tuple[str, dict[str, Any]]:
    """The newest committed checkpoint under a checkpoint root of either format, and its manifest,
    checked against its commit marker (trainer.checkpoint.open_root)."""
    return open_root(root).final()


def compared_keys(t: dict[str, torch.Tensor]) -> list[str]:
    """The model's and the optimizer's tensors (the floor-judged entries and the optimizer's counters)."""
    return sorted(k for k in t if k.startswith(("model.", "optim.", "optim_lr")))


def compare(reference: str, replay: str, trial: str, total_steps: int | None = None,
            tier: str = "auto") -> dict[str, Any]:
    """The three final checkpoints judged entry by entry (steps/judge.py), in either format, told apart by
    the reference's layout (trainer.checkpoint.open_root): baton's DCP (`runs/`) or HF `checkpoint-N/`.
    `tier`: 1, 2, or auto (1 when the trial ran on a CPU with deterministic kernels, else 2). A role
    without a usable final checkpoint is a `problem` naming it, not an exception."""
    kind = type(open_root(reference))  # the reference's format for all three: a trial may have no checkpoint yet
    fmt = kind.format
    base: dict[str, Any] = {"equivalent": False, "format": fmt, "tier": int(tier) if tier in ("1", "2") else 1,
                            "tensors": 0, "max_abs_diff": float("inf"), "floor": 0.0, "differing": []}
    finals, flats, parts = {}, {}, {}
    for role, uri in (("reference", reference), ("replay", replay), ("trial", trial)):
        root = kind(uri)
        try:
            finals[role] = root.final()
            flats[role], parts[role] = root.load(*finals[role])
        except (FileNotFoundError, CorruptCheckpoint, BadCheckpoint) as e:
            return {**base, "problem": f"{role}: {e}"}
    steps = {role: m["step"] for role, (_, m) in finals.items()}
    if total_steps is not None and set(steps.values()) != {total_steps}:
        return {**base, "problem": f"final checkpoints are not all at step {total_steps}: {steps}"}
    verdict = judge(flats["reference"], flats["replay"], flats["trial"], None, resolve_tier(tier, finals["trial"][1]))
    return {
        **base, **verdict, "parts": parts["reference"],
        "steps_compared": {"reference": steps["reference"], "trial": steps["trial"]},
        "checkpoints": {role: url for role, (url, _) in finals.items()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m steps.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", required=True, help="checkpoint root of the reference run")
    ap.add_argument("--replay", required=True, help="checkpoint root of the reference's replay")
    ap.add_argument("--trial", required=True, help="checkpoint root of the evicted trial")
    ap.add_argument("--evidence", required=True, help="evidence root (reference/, replay/ and trial/ inside)")
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
    ev_root = args.evidence.rstrip("/")
    records = {role: read_evidence(f"{ev_root}/{role}") for role in ("reference", "replay", "trial")}
    report = assemble(result, verify, evictions, records, args.total_steps)
    write_report(Path(args.out), report, records["reference"], records["trial"], args.report_uri)
    print(report["verdict"], file=sys.stderr)
    verdict = "bit-identical" if result["tier"] == 1 and result["equivalent"] else (
        "within the floor" if result["equivalent"] else "NOT equivalent")
    print(f"{verdict}: {result.get('equal_tensors', 0)}/{result['tensors']} tensors equal, "
          f"max |diff| {result['max_abs_diff']:.3g}, floor {result['floor']:.3g} (tier {result['tier']})",
          file=sys.stderr)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
