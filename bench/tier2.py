"""What Tier 2 sees, measured on the CPU with injected noise (a stand-in for nondeterministic kernels):
the floor, each correct trial's distance to it, and each negative control's verdict, for baton's trainer
and for HF scripts, judged by steps.compare's judgment exactly as the drill makes it.

    python -m bench.tier2 [--out FILE.json]

baton: reference and replay (noise seeds 1, 2), a trial stopped by SIGTERM at step 17 and resumed (seed
3), and the same first attempt resumed without each restore (BATON_SKIP_RESTORE). HF
(tests/hf_variants/train.py): the correct script and each broken one, as tests/workflow/test_certifier.py
runs them. Every figure is from this one run. docs/tier2.md reads them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, log


def _row(report: dict[str, Any]) -> dict[str, Any]:
    return {
        k: report.get(k)
        for k in (
            "tier",
            "passed",
            "verdict",
            "floor_l2",
            "l2_diff",
            "diff_over_floor",
            "floor",
            "max_abs_diff",
            "differing_count",
            "tensors",
        )
    } | {
        "exact_failures": len(report.get("exact_failures") or []),
        "components": [(c["component"], c["differing"], c["l2_share"]) for c in report.get("components", [])],
    }


def baton_cases(model: Path, work: Path) -> dict[str, Any]:
    from tests import helpers
    from tests.unit import test_tier2 as t2

    first = t2._interrupted(model, work / "first" / "ckpt", seed=3)
    runs = {
        "reference": t2._full(model, work / "ref", seed=1),
        "replay": t2._full(model, work / "rep", seed=2),
        "trial": t2._resumed(model, first, work / "trial" / "ckpt", seed=3),
    }
    for part in t2.SKIPPABLE:
        runs[part] = t2._resumed(model, first, work / part / "ckpt", seed=3, BATON_SKIP_RESTORE=part)
    out = {}
    for case in ("trial", *t2.SKIPPABLE):
        roles = {"reference": runs["reference"], "replay": runs["replay"], "trial": runs[case]}
        report = helpers.judged(
            {r: v[1] for r, v in roles.items()}, {r: v[2] for r, v in roles.items()}, t2.TOTAL, 2
        )
        out["correct" if case == "trial" else f"skip {case}"] = _row(report)
        log(f"baton {case}: {report['verdict'][:120]}")
    return out


def hf_cases(model: Path, work: Path) -> dict[str, Any]:
    from tests.workflow import test_certifier as tc

    families = tc._families(tc.Runs(model, work, tier=2))
    out = {}
    for variant, family in families.items():
        report = tc.judged(family, 2)
        out[variant] = _row(report)
        log(f"HF {variant}: {report['verdict'][:120]}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.tier2",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", help="write the figures here as JSON (default: stdout)")
    args = ap.parse_args(argv)
    from trainer.data import read_documents
    from trainer.tiny import build_tiny_qwen2

    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="baton-tier2-"))
    try:
        model = build_tiny_qwen2(
            work / "tiny-qwen2", read_documents(str(REPO / "trainer/assets/tiny_corpus.txt"))
        )
        result = {
            "baton": baton_cases(model, work / "baton"),
            "hf": hf_cases(model, work / "hf"),
            "seconds": round(time.monotonic() - t0, 1),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
