"""How `compare` judges a trial against its reference: Tier 1 (exact) or Tier 2 (within the floor).

Tier 1 (deterministic kernels, the CPU and gloo): every compared tensor of the trial equals the
reference's, `torch.equal`. Nothing else passes.

Tier 2 (nondeterministic kernels: NCCL, fused attention, `deterministic: false`): two uninterrupted runs
of the same config already differ, so the floor is measured: the distance between the reference and its
replay at the final step, as the L2 norm of their difference over every element of every compared
tensor (model and optimizer state). A correct resume is one more draw of the same nondeterminism, so its
distance to the reference is distributed like the floor; the trial passes when it is at most
`FLOOR_SLACK` times the floor. A resume bug (a skipped RNG, data position, optimizer or scheduler
restore) changes what is computed, not how it is rounded, and lands orders of magnitude above the line;
the verdict states that ratio (`diff_over_floor`), so a reader sees how far from the line it was.

Why the L2 norm over everything, not the largest element: the largest |difference| is one extreme
element, and it varies between draws. Measured on the CPU with injected noise (tests/unit/test_tier2.py,
7 runs, all 210 reference/replay/trial assignments), a correct trial's largest |difference| was 0.36x to
2.74x the floor's, while its L2 distance was 0.91x to 1.10x the floor's. The largest |difference| is
still reported. A floor of 0 makes Tier 2 as strict as Tier 1, and a floor that is not finite fails.
"""

from __future__ import annotations

import math
from typing import Any

import torch

FLOOR_SLACK = 1.5
"""A correct trial's L2 distance to the reference may exceed the floor's by this factor (measured worst
case 1.10x, see above)."""


def distances(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], keys: list[str]) -> dict[str, Any]:
    """L2 norm of a - b over every element of `keys`, the largest |a - b|, and the keys that differ."""
    sq, worst, differing = 0.0, 0.0, []
    for k in keys:
        x, y = a[k], b[k]
        if x.shape != y.shape or x.dtype != y.dtype:
            return {"l2": float("inf"), "max_abs": float("inf"), "differing": [k]}
        if not torch.equal(x, y):
            differing.append(k)
            d = x.double() - y.double()
            sq += float((d * d).sum())
            worst = max(worst, float(d.abs().max()))
    return {"l2": math.sqrt(sq), "max_abs": worst, "differing": differing}


def judge(ref: dict[str, torch.Tensor], rep: dict[str, torch.Tensor], tri: dict[str, torch.Tensor],
          keys: list[str], tier: int) -> dict[str, Any]:
    """The verdict on the trial, and the figures behind it."""
    if tier not in (1, 2):
        raise ValueError(f"tier must be 1 or 2, got {tier!r}")
    floor, trial = distances(ref, rep, keys), distances(ref, tri, keys)
    if floor["l2"] > 0:
        ratio = trial["l2"] / floor["l2"]
    else:
        ratio = 0.0 if trial["l2"] == 0 else float("inf")
    if tier == 1:
        equivalent = not trial["differing"]
    else:
        equivalent = math.isfinite(floor["l2"]) and trial["l2"] <= FLOOR_SLACK * floor["l2"]
    return {
        "equivalent": equivalent, "tier": tier, "tensors": len(keys),
        "equal_tensors": len(keys) - len(trial["differing"]), "differing": trial["differing"][:20],
        "max_abs_diff": trial["max_abs"], "floor": floor["max_abs"], "floor_differing": len(floor["differing"]),
        "l2_diff": trial["l2"], "floor_l2": floor["l2"], "diff_over_floor": ratio,
        "floor_slack": FLOOR_SLACK if tier == 2 else None,
    }


def resolve_tier(tier: str, manifest: dict[str, Any]) -> int:
    """`tier` 1 or 2 as given; auto: Tier 1 only where the trial's run promised bit-identity (its manifest
    says a CPU, and a config with deterministic kernels or none: HF's manifest has no config)."""
    if tier in ("1", "2"):
        return int(tier)
    if tier != "auto":
        raise ValueError(f"--tier must be 1, 2 or auto, got {tier!r}")
    deterministic = manifest.get("config", {}).get("deterministic", True)
    return 1 if manifest.get("device", "cpu") == "cpu" and deterministic else 2
