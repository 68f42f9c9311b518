"""Compare the final checkpoints entry by entry, and write the drill's report.

    python -m steps.compare --reference URI --replay URI --trial URI --evidence URI --verify URI
                            --evictions URI --total-steps T --out DIR [--report-uri URI]

Tier 1 (CPU, gloo): every model and optimizer tensor of the trial equals the reference's (torch.equal).
Tier 2 (CUDA, or `deterministic: false`): the floor is the L2 distance between the reference and its
replay (the run's own nondeterminism), and the trial's L2 distance to the reference may be at most
1.5x that floor (steps/lib/judge.py). HF `checkpoint-N/` roots are judged the same way, over every entry.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException

from steps.lib.contract import BOUNDS, ROLES
from steps.lib.evidence import read_evidence, read_json
from steps.lib.judge import judge, resolve_tier
from steps.lib.report import write_report
from steps.lib.verdict import assemble, verdict_of  # noqa: F401 - verdict_of: compare's API before steps/lib/verdict.py
from steps.verify import evictions_record
from trainer import env as baton_env
from trainer.bounded import ArgParser, Bound, flag_type
from trainer.checkpoint import CorruptCheckpoint, open_root, wrapped_failures
from trainer.untrusted import Refused


def final_checkpoint(root: str) -> tuple[str, dict[str, Any]]:
    """The newest committed checkpoint under a checkpoint root of either format, and its manifest,
    checked against its commit marker (trainer.checkpoint.open_root)."""
    return open_root(root).final()


def compared_keys(t: dict[str, torch.Tensor]) -> list[str]:
    """The model's and the optimizer's tensors (the floor-judged entries and the optimizer's counters)."""
    return sorted(k for k in t if k.startswith(("model.", "optim.", "optim_lr")))


def compare(
    reference: str, replay: str, trial: str, total_steps: int | None = None, tier: str = "auto"
) -> dict[str, Any]:
    """The three final checkpoints judged entry by entry (steps/lib/judge.py), in either format, told apart by
    the reference's layout (trainer.checkpoint.open_root): baton's DCP (`runs/`) or HF `checkpoint-N/`.
    `tier`: 1, 2, or auto (1 when the trial ran on a CPU with deterministic kernels, else 2). A role
    without a usable final checkpoint is a `problem` naming it, not an exception."""
    kind = type(
        open_root(reference)
    )  # the reference's format for all three: a trial may have no checkpoint yet
    fmt = kind.format
    base: dict[str, Any] = {
        "equivalent": False,
        "format": fmt,
        "tier": int(tier) if tier in ("1", "2") else 1,
        "tensors": 0,
        "max_abs_diff": float("inf"),
        "floor": 0.0,
        "differing": [],
    }
    finals, flats, parts = {}, {}, {}
    for role, uri in (("reference", reference), ("replay", replay), ("trial", trial)):
        root = kind(uri)
        try:
            finals[role] = root.final()
            flats[role], parts[role] = root.load(*finals[role])
        except (FileNotFoundError, CorruptCheckpoint, Refused) as e:
            return {**base, "problem": f"{role}: {e}"}
        except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
            return {**base, "problem": f"{role}: its final checkpoint cannot be read: {failure(e)}"}
    steps = {role: m["step"] for role, (_, m) in finals.items()}
    if total_steps is not None and set(steps.values()) != {total_steps}:
        return {**base, "problem": f"final checkpoints are not all at step {total_steps}: {steps}"}
    verdict = judge(
        flats["reference"], flats["replay"], flats["trial"], None, resolve_tier(tier, finals["trial"][1])
    )
    return {
        **base,
        **verdict,
        "parts": parts["reference"],
        "steps_compared": {"reference": steps["reference"], "trial": steps["trial"]},
        "checkpoints": {role: url for role, (url, _) in finals.items()},
    }


def failure(e: BaseException) -> str:
    """An exception as one line: its type and message, or the first failure a DCP CheckpointException wraps."""
    e = next(iter(wrapped_failures(e)), e)
    return f"{type(e).__name__}: {e}".splitlines()[0][:300]


# What compare reads of verify.json, with its type: a file that lacks one is refused and judged as failed.
VERIFY_FIELDS = {
    "passed": bool,
    "problems": list,
    "inconclusive": list,
    "preempt": list,
    "attempts": int,
    "total": int,
    "distinct": int,
    "replayed": int,
    "resumed_from": list,
    "preemptions": int,
}


def verify_result(uri: str, refused: list[str]) -> dict[str, Any]:
    """verify.json, its fields checked by type; a failed verification naming the reason when it is absent
    or refused (compare always writes a report)."""
    try:
        doc = read_json(uri)
        bad = [
            k
            for k, t in VERIFY_FIELDS.items()
            if not isinstance(doc.get(k), t) or (t is int and isinstance(doc.get(k), bool))
        ]
        if bad:
            raise Refused(f"verify.json field(s) {bad} are missing or of the wrong type")
        if not all(isinstance(p, dict) and isinstance(p.get("step"), int) for p in doc["preempt"]):
            raise Refused("verify.json field 'preempt' must list objects with a step")
        return doc
    except (FileNotFoundError, Refused) as e:
        why = f"verify.json is {'missing' if isinstance(e, FileNotFoundError) else 'refused'}: {e}"
        refused.append(why)
        return {
            "passed": False,
            "problems": [why],
            "inconclusive": [],
            "preempt": [],
            "attempts": 0,
            "total": 0,
            "distinct": 0,
            "replayed": 0,
            "resumed_from": [],
            "preemptions": 0,
        }


def evictions_of(uri: str | None, refused: list[str]) -> dict[str, Any]:
    if not uri:
        return {}
    try:
        return evictions_record(read_json(uri))
    except FileNotFoundError:
        return {}
    except Refused as e:
        refused.append(f"evictions.json is refused: {e}")
        return {}


def main(argv: list[str] | None = None) -> int:
    baton_env.check_or_exit()
    ap = ArgParser(
        prog="python -m steps.compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--reference", required=True, help="checkpoint root of the reference run")
    ap.add_argument("--replay", required=True, help="checkpoint root of the reference's replay")
    ap.add_argument("--trial", required=True, help="checkpoint root of the evicted trial")
    ap.add_argument("--evidence", required=True, help="evidence root (reference/, replay/ and trial/ inside)")
    ap.add_argument("--verify", required=True, help="verify.json written by steps.verify")
    ap.add_argument("--evictions", help="evictions JSON written by steps.evict")
    ap.add_argument(
        "--total-steps", type=flag_type(Bound(1, BOUNDS["total_steps"].high, integer=True)), required=True
    )
    ap.add_argument(
        "--tier",
        default="auto",
        choices=("auto", "1", "2"),
        help="1: every tensor equal; 2: within the measured floor (steps/lib/judge.py); "
        "auto: 1 on a CPU with deterministic kernels, else 2",
    )
    ap.add_argument("--out", required=True, help="local folder for report.json, report.md, loss.png")
    ap.add_argument("--report-uri", help="also copy the report there (the bucket)")
    args = ap.parse_args(argv)

    failed = {
        "equivalent": False,
        "tier": 1,
        "tensors": 0,
        "max_abs_diff": float("inf"),
        "floor": 0.0,
        "differing": [],
    }
    try:
        result = compare(args.reference, args.replay, args.trial, args.total_steps, args.tier)
    except FileNotFoundError as e:  # e.g. a trial that died before its first checkpoint: still a report
        result = {**failed, "problem": str(e)}
    except (Exception, CheckpointException) as e:  # whatever the checkpoints hold, a report comes out
        result = {**failed, "problem": f"comparing the final checkpoints failed: {failure(e)}"}
    refused: list[str] = []
    verify = verify_result(args.verify, refused)
    evictions = evictions_of(args.evictions, refused)
    ev_root = args.evidence.rstrip("/")
    records = {role: read_evidence(f"{ev_root}/{role}", refused, role) for role in ROLES}
    report = assemble(result, verify, evictions, records, args.total_steps, refused)
    write_report(Path(args.out), report, records["reference"], records["trial"], args.report_uri)
    print(report["verdict"], file=sys.stderr)
    verdict = (
        "bit-identical"
        if result["tier"] == 1 and result["equivalent"]
        else ("within the floor" if result["equivalent"] else "NOT equivalent")
    )
    print(
        f"{verdict}: {result.get('equal_tensors', 0)}/{result['tensors']} tensors equal, "
        f"max |diff| {result['max_abs_diff']:.3g}, floor {result['floor']:.3g} (tier {result['tier']})",
        file=sys.stderr,
    )
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
