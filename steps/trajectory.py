"""The drill's trajectory check: the trial's step records against the reference's, and the replay's too,
field by field, exactly, at every tier.

Every trainer under test writes, on each `step` record, `batch_sha` (the inputs of the step on every
rank), `rng_sha` (every RNG state the step started from) and `lr` (trainer/trajectory.py; the HF callback
the same). None of them can be changed by kernel nondeterminism, so they must be equal step for step:
- reference and replay (two uninterrupted starts) that differ mean a trainer whose every start differs:
  nothing can be certified, at any tier, since a resume bug would hide in that difference;
- a trial that leaves the reference's trajectory at step N says what it lost: the data order, the RNG,
  or the schedule.
Some bugs leave the trajectory equal (optimizer moments not restored): those show in the checkpoint
comparison (steps/judge.py).
"""

from __future__ import annotations

from typing import Any

FIELDS = ("batch_sha", "rng_sha", "lr")
TRIAL_CAUSE = {"batch_sha": "batch differs (data order not restored)",
               "rng_sha": "RNG differs (RNG not restored)",
               "lr": "lr differs (scheduler not restored)"}
START_CAUSE = {"batch_sha": "batch differs: the data order changes at every start",
               "rng_sha": "RNG differs: the random state changes at every start",
               "lr": "lr differs: the schedule changes at every start"}


def by_step(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """One step record per step: where a step was trained twice (a replay), the later attempt's."""
    out: dict[int, dict[str, Any]] = {}
    for r in sorted((r for r in records if r.get("event") == "step"),
                    key=lambda r: (r.get("attempt", 0), r.get("time", 0))):
        out[r["step"]] = r
    return out


def recorded(steps: dict[int, dict[str, Any]]) -> bool:
    """Whether every step record carries the trajectory fields."""
    return bool(steps) and all(all(f in r for f in ("batch_sha", "rng_sha")) for r in steps.values())


def first_divergence(ref: dict[int, dict[str, Any]], other: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The first step both have where a trajectory field differs: {step, field, ref, other}."""
    for step in sorted(ref.keys() & other.keys()):
        for field in FIELDS:
            a, b = ref[step].get(field), other[step].get(field)
            if a is not None and b is not None and a != b:
                return {"step": step, "field": field, "reference": a, "other": b}
    return None


START_FIELDS = ("weights_sha", "optim_sha")
SEED_ADVICE = ("seed before the model is built (transformers.set_seed(seed) or torch.manual_seed(seed) before "
               "from_config / from_pretrained / the model's constructor), then drill again")


def start_of(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The `start` record of the role's fresh start (trainer/trajectory.py; the lowest attempt's), or None."""
    starts = [r for r in records if r.get("event") == "start"]
    return min(starts, key=lambda r: (r.get("attempt", 0), r.get("time", 0))) if starts else None


def first_start_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """The first of START_FIELDS that both records hold and that differs."""
    return next((f for f in START_FIELDS if f in a and f in b and a[f] != b[f]), None)


def check(reference: list[dict[str, Any]], replay: list[dict[str, Any]],
          trial: list[dict[str, Any]]) -> dict[str, Any]:
    """The trajectory section of report.json.

    `recorded`: every role's step records carry it (else `missing` names the roles); `replay`: the first
    step where the replay leaves the reference (None: equal), `trial`: the same for the trial; `finding`:
    one sentence, or None when all three agree."""
    roles = {"reference": by_step(reference), "replay": by_step(replay), "trial": by_step(trial)}
    starts = {"reference": start_of(reference), "replay": start_of(replay), "trial": start_of(trial)}
    missing = [role for role, steps in roles.items() if not recorded(steps)]
    no_start = [role for role, rec in starts.items() if rec is None]
    out: dict[str, Any] = {"recorded": not missing and not no_start, "missing": sorted(set(missing) | set(no_start)),
                           "replay": None, "trial": None,
                           "steps_compared": len(roles["reference"].keys() & roles["trial"].keys()),
                           "finding": None}
    # The exact start first: two fresh starts of one seed that begin from different models leave nothing
    # to certify at any tier, however close their checkpoints end (an integer hash sees what a floor absorbs).
    ref0, rep0, tri0 = starts["reference"], starts["replay"], starts["trial"]
    field = first_start_difference(ref0, rep0) if ref0 and rep0 else None
    if field:
        what = "initial model" if field == "weights_sha" else "initial optimizer state"
        out["replay"] = {"step": 0, "field": field, "reference": ref0[field], "other": rep0[field],
                         "cause": f"the {what} differs at every start"}
        out["finding"] = (f"not certifiable: the {what} differs at every start (the reference's and its replay's "
                          f"{field} differ before their first step): {SEED_ADVICE}")
        return out
    if missing:
        out["finding"] = (f"the trajectory is missing: the step records of {', '.join(missing)} lack batch_sha "
                          "and rng_sha (trainer/trajectory.py; the HF callback writes them)")
        return out
    field = first_start_difference(ref0, tri0) if ref0 and tri0 else None
    if field:
        out["trial"] = {"step": 0, "field": field, "reference": ref0[field], "other": tri0[field],
                        "cause": "the trial started from another initial model"}
        out["finding"] = f"step 0: the trial started from another initial model ({field} differs)"
        return out
    start = first_divergence(roles["reference"], roles["replay"])
    if start:
        out["replay"] = {**start, "cause": START_CAUSE[start["field"]]}
        out["finding"] = (f"not certifiable: the reference and its replay, two uninterrupted starts, already "
                          f"differ at step {start['step']}: {START_CAUSE[start['field']]} (the trainer is "
                          "nondeterministic across starts, so a resume bug could hide in that difference)")
        return out
    left = first_divergence(roles["reference"], roles["trial"])
    if left:
        out["trial"] = {**left, "cause": TRIAL_CAUSE[left["field"]]}
        out["finding"] = f"step {left['step']}: {TRIAL_CAUSE[left['field']]}"
    elif no_start:  # the trajectory agrees, but the exact start cannot be checked: not certifiable at Tier 2
        out["finding"] = (f"the trajectory is missing: {', '.join(no_start)} wrote no start record (weights_sha; "
                          "trainer/trajectory.py, the HF callback writes it)")
    return out
