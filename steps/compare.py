"""Compare the final checkpoints tensor by tensor, and write the drill's report.

    python -m steps.compare --reference URI --replay URI --trial URI --evidence URI --verify URI
                            --evictions URI --total-steps T --out DIR [--report-uri URI]

Tier 1 (CPU, gloo): every model and optimizer tensor of the trial equals the reference's (torch.equal).
Tier 2 (CUDA): the floor is the largest difference between the reference and its replay (the run's own
nondeterminism), and the trial may differ from the reference by no more than that floor.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from steps.evidence import read_evidence, read_json
from steps.judge import judge
from steps.report import write_report
from trainer.checkpoint import COMMIT, load_flat
from trainer.storage import full_url, url_to_fs


def final_checkpoint(root: str) -> tuple[str, dict[str, Any]]:
    """The newest committed checkpoint under a checkpoint root (one run inside), and its manifest."""
    import json

    fs, base = url_to_fs(root)
    fs.invalidate_cache()
    commits = fs.glob(f"{base.rstrip('/')}/runs/*/step-*/{COMMIT}")
    if not commits:
        raise FileNotFoundError(f"no committed checkpoint under {root}")
    newest = max(commits, key=lambda p: int(p.rstrip("/").split("/")[-2].removeprefix("step-")))
    folder = newest.rsplit("/", 1)[0]
    with fs.open(f"{folder}/manifest.json", "r") as f:
        manifest = json.loads(f.read())
    return full_url(fs, folder), manifest


def compared_keys(t: dict[str, torch.Tensor]) -> list[str]:
    return sorted(k for k in t if k.startswith(("model.", "optim.", "optim_lr")))


def resolve_tier(tier: str, manifest: dict[str, Any]) -> int:
    """auto: Tier 1 only where the run promised bit-identity (a CPU, deterministic kernels)."""
    if tier in ("1", "2"):
        return int(tier)
    if tier != "auto":
        raise ValueError(f"--tier must be 1, 2 or auto, got {tier!r}")
    deterministic = manifest.get("config", {}).get("deterministic", True)
    return 1 if manifest.get("device", "cpu") == "cpu" and deterministic else 2


def compare(reference: str, replay: str, trial: str, total_steps: int | None = None,
            tier: str = "auto") -> dict[str, Any]:
    """`tier`: 1, 2, or auto (1 when the trial ran on a CPU with deterministic kernels, else 2)."""
    ref_url, ref_m = final_checkpoint(reference)
    rep_url, rep_m = final_checkpoint(replay)
    tri_url, tri_m = final_checkpoint(trial)
    ref, rep, tri = load_flat(ref_url), load_flat(rep_url), load_flat(tri_url)
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
        **judge(ref, rep, tri, keys, resolve_tier(tier, tri_m)),
        "steps_compared": {"reference": ref_m["step"], "trial": tri_m["step"]},
        "checkpoints": {"reference": ref_url, "replay": rep_url, "trial": tri_url},
    }


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
              "preempt": verify["preempt"], "evictions": evictions, "total_steps": args.total_steps,
              "trial_outcome": verify.get("trial_outcome"), "trial_retries": max(verify["attempts"] - 1, 0)}
    report["passed"] = bool(result["equivalent"] and verify["passed"])
    ev_root = args.evidence.rstrip("/")
    write_report(Path(args.out), report, read_evidence(f"{ev_root}/reference"), read_evidence(f"{ev_root}/trial"),
                 args.report_uri)
    verdict = "bit-identical" if result["tier"] == 1 and result["equivalent"] else (
        "within the floor" if result["equivalent"] else "NOT equivalent")
    print(f"{verdict}: {result.get('equal_tensors', 0)}/{result['tensors']} tensors equal, "
          f"max |diff| {result['max_abs_diff']:.3g}, floor {result['floor']:.3g} (tier {result['tier']})",
          file=sys.stderr)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
