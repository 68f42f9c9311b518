"""How `compare` judges a trial's final checkpoint against its reference's: Tier 1 (exact) or Tier 2
(within the floor), over every entry of either format, grouped by component.

Tier 1 (deterministic kernels, the CPU and gloo): every entry of the trial equals the reference's,
`torch.equal` for tensors and `==` for the rest. Nothing else passes.

Tier 2 (nondeterministic kernels: NCCL, fused attention, `deterministic: false`) judges with the floor
only what kernels can change: the floating-point tensors computed from training, in any file of the
checkpoint (the model, the optimizer's moments, a script's own EMA: `floor_judged`). The floor is the L2 norm of (reference - replay) over every such element; the trial
passes when its L2 distance to the reference is at most `FLOOR_SLACK` times the floor. Every other
entry (step counters, RNG states, scheduler state, data position, HF's trainer_state) must be exactly
equal among the reference, its replay and the trial: kernels cannot change an integer, and a resume bug
(a skipped RNG, data position or scheduler restore) shows there first. The few fields that kernels or
timing do change (`EXCLUDED_AT_TIER_2`: logged losses and gradient norms) are left out, by name, with why.

Why the L2 norm over everything, not the largest element: the largest |difference| is one extreme
element, and it varies between draws. Measured on the CPU with injected noise (tests/unit/test_tier2.py,
7 runs, all 210 reference/replay/trial assignments), a correct trial's largest |difference| was 0.36x to
2.74x the floor's, while its L2 distance was 0.91x to 1.10x the floor's. The largest |difference| is
still reported. A floor of 0 makes Tier 2 as strict as Tier 1, and a floor that is not finite fails.
What Tier 2 cannot see on its own (a bug whose effect stays inside the floor, or a trainer whose every
start differs) the drill's trajectory check covers (steps/lib/trajectory.py; docs/tier2.md).
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

FLOOR_SLACK = 1.5
"""A correct trial's L2 distance to the reference may exceed the floor's by this factor (measured worst
case 1.10x, see above)."""

COMPONENTS = ("model", "optimizer", "scheduler", "rng", "data", "bookkeeping")

# Entries that kernels or timing change, left out of a Tier 2 judgment (HF's trainer_state.json): the
# losses and gradient norms it logged, and the best metric, are floating-point results of the kernels.
EXCLUDED_AT_TIER_2 = {
    r"trainer_state\.log_history\.\d+\.(loss|grad_norm|train_loss|eval_loss)": "a logged loss or gradient "
    "norm: a result of the kernels, which Tier 2 lets differ (the model and optimizer it came from are judged)",
    r"trainer_state\.log_history\.\d+\.(train_runtime|train_samples_per_second|train_steps_per_second)": "wall-clock timing",
    r"trainer_state\.best_metric": "a logged metric: a result of the kernels",
}
_EXCLUDED = [(re.compile(p), why) for p, why in EXCLUDED_AT_TIER_2.items()]


def component_of(key: str) -> str:
    """The component an entry belongs to, for either format (baton's DCP keys, steps/lib/hf_checkpoint.py's)."""
    if key.startswith("model."):
        return "model"
    if key.startswith(("optim.", "optimizer.")):
        return "optimizer"
    if key.startswith(("sched", "scheduler.", "optim_lr")):
        return "scheduler"
    if key.startswith("rng."):
        return "rng"
    if key.startswith(("progress", "loader.")):
        return "data"
    return "bookkeeping"


def floor_judged(key: str, value: Any) -> bool:
    """Whether Tier 2 judges this entry against the floor, decided by what the entry is, in whichever file it
    is: a floating-point tensor computed from training (the model, the optimizer's moments, a script's own
    float state such as an EMA's shadow weights). Never an integer or a Python number (a counter, an EMA's
    update count), a `.step` counter (the optimizer's is a float tensor), nor the scheduler's, the RNG's or
    the data position's entries: kernels cannot change any of those."""
    if not isinstance(value, torch.Tensor) or not (value.is_floating_point() or value.is_complex()):
        return False
    return component_of(key) not in ("scheduler", "rng", "data") and not key.endswith(".step")


def excluded_at_tier_2(key: str) -> str | None:
    return next((why for pattern, why in _EXCLUDED if pattern.fullmatch(key)), None)


def _differs(x: Any, y: Any) -> tuple[bool, float | None]:
    """(differ, the squared L2 distance where both are tensors of one shape and dtype, else None)."""
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        if x.shape != y.shape or x.dtype != y.dtype:
            return True, None
        if torch.equal(x, y):
            return False, 0.0
        if x.is_floating_point() or x.is_complex():
            d = x.double() - y.double() if not x.is_complex() else (x - y).abs().double()
            return True, float((d * d).sum())
        return True, None
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return True, None
    return x != y, None


def distances(a: dict[str, Any], b: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """Per key of `keys`: whether a and b differ, and the squared L2 of floating differences; the total
    L2 norm over the floor-judged keys, the largest |a - b|, and the differing keys."""
    sq, worst, differing, per_key = 0.0, 0.0, [], {}
    for k in keys:
        if k not in a or k not in b:
            differing.append(k)
            per_key[k] = math.inf
            continue
        differ, d2 = _differs(a[k], b[k])
        if not differ:
            continue
        differing.append(k)
        per_key[k] = math.inf if d2 is None else d2
        if d2 is not None and floor_judged(k, a[k]):
            sq += d2
            x, y = a[k], b[k]
            worst = max(worst, float((x.double() - y.double()).abs().max()))
        elif d2 is None:
            worst = math.inf
    return {"l2": math.sqrt(sq), "max_abs": worst, "differing": differing, "per_key": per_key}


def components(ref: dict[str, Any], keys: list[str], found: dict[str, Any]) -> list[dict[str, Any]]:
    """Each component's entries, how many differ, and its share of the L2 distance, largest first."""
    total = sum(v for k, v in found["per_key"].items() if math.isfinite(v) and floor_judged(k, ref.get(k)))
    out = {c: {"component": c, "entries": 0, "differing": 0, "l2_share": 0.0} for c in COMPONENTS}
    for k in keys:
        out[component_of(k)]["entries"] += 1
    for k, v in found["per_key"].items():
        row = out[component_of(k)]
        row["differing"] += 1
        if total > 0 and math.isfinite(v) and floor_judged(k, ref.get(k)):
            row["l2_share"] += v / total
    rows = [r for r in out.values() if r["entries"]]
    for r in rows:
        r["l2_share"] = round(r["l2_share"], 4)
    return sorted(rows, key=lambda r: (-r["l2_share"], -r["differing"], COMPONENTS.index(r["component"])))


def _telling_order(ref: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """The differing keys, the ones that point at a cause first: exact entries (RNG, data, scheduler,
    counters) before floating ones (weights, moments), each group by its distance, largest first; logged
    metrics (`EXCLUDED_AT_TIER_2`: a loss, a gradient norm) last at every tier, since they are results of
    what differs, never its cause."""

    def rank(k: str) -> tuple:
        exact = not floor_judged(k, ref.get(k))
        return (
            excluded_at_tier_2(k) is not None,
            not exact,
            COMPONENTS.index(component_of(k)) if exact else 0,
            -found["per_key"][k],
            k,
        )

    return sorted(found["differing"], key=rank)


def judge(
    ref: dict[str, Any], rep: dict[str, Any], tri: dict[str, Any], keys: list[str] | None, tier: int
) -> dict[str, Any]:
    """The verdict on the trial, and the figures behind it. `keys`: the entries to judge (None: every
    entry any of the three holds)."""
    if tier not in (1, 2):
        raise ValueError(f"tier must be 1 or 2, got {tier!r}")
    keys = sorted(keys if keys is not None else ref.keys() | rep.keys() | tri.keys())
    excluded = {k: why for k in keys if (why := excluded_at_tier_2(k))} if tier == 2 else {}
    judged = [k for k in keys if k not in excluded]
    floor, trial = distances(ref, rep, judged), distances(ref, tri, judged)
    if floor["l2"] > 0:
        ratio = trial["l2"] / floor["l2"]
    else:
        ratio = 0.0 if trial["l2"] == 0 else math.inf
    exact_failures = [k for k in trial["differing"] if tier == 1 or not floor_judged(k, ref.get(k))]
    replay_exact = [k for k in floor["differing"] if not floor_judged(k, ref.get(k))]
    if tier == 1:
        equivalent = not trial["differing"]
    else:
        equivalent = (
            not exact_failures
            and not replay_exact
            and math.isfinite(floor["l2"])
            and trial["l2"] <= FLOOR_SLACK * floor["l2"]
        )
    ordered = _telling_order(ref, trial)
    return {
        "equivalent": equivalent,
        "tier": tier,
        "tensors": len(judged),
        "equal_tensors": len(judged) - len(trial["differing"]),
        "differing_count": len(trial["differing"]),
        "differing": ordered[:20],
        "exact_failures": exact_failures[:20],
        "replay_exact_differing": replay_exact[:20] if tier == 2 else [],
        "components": components(ref, judged, trial),
        "floor_components": components(ref, judged, floor),
        "max_abs_diff": trial["max_abs"],
        "floor": floor["max_abs"],
        "floor_differing": len(floor["differing"]),
        "l2_diff": trial["l2"],
        "floor_l2": floor["l2"],
        "diff_over_floor": ratio,
        "floor_slack": FLOOR_SLACK if tier == 2 else None,
        "excluded": sorted({f"{k}: {why}" for k, why in excluded.items()})[:20] if excluded else [],
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
