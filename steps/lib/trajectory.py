"""The drill's trajectory check: the trial's step records against the reference's, and the replay's too,
field by field, exactly, at every tier.

Every trainer under test writes, on each `step` record, `batch_rng_sha` (every RNG state before the
step's batch was drawn), `batch_sha` (the inputs of the step on every rank), `rng_sha` (every RNG state
the step's training started from, after its batch was drawn) and `lr` (trainer/trajectory.py; the HF
callback the same). None of them can be changed by kernel nondeterminism, so they must be equal step for
step:
- reference and replay (two uninterrupted starts) that differ mean a trainer whose every start differs:
  nothing can be certified, at any tier, since a resume bug would hide in that difference;
- a trial that leaves the reference's trajectory at step N says what it lost, read in the step's own
  order: the RNG before the batch (an RNG not restored, or drawn from at the start), then the data order
  with the same RNG, then the RNG the step trained with, then the schedule; every other field that
  differs there is named too.
Some bugs leave the trajectory equal (optimizer moments not restored): those show in the checkpoint
comparison (steps/lib/judge.py).
"""

from __future__ import annotations

from typing import Any

FIELDS = ("batch_rng_sha", "batch_sha", "rng_sha", "lr")
"""The step record's trajectory fields, in the order a cause is read from them: the RNG before the batch
was drawn, the batch, the RNG the step started from (after the batch was drawn), the schedule."""
TRIAL_CAUSE = {
    "batch_rng_sha": "the RNG differed before this batch was drawn (RNG not restored, or consumed at start)",
    "batch_sha": (
        "the data order differs with the same RNG (the data order not restored, or state of "
        "the data pipeline outside the checkpoint: a generator or counter of its own)"
    ),
    "rng_sha": "the RNG at the step's start differs (RNG not restored, or consumed at start)",
    "lr": "lr differs (scheduler not restored)",
}
BATCH_CAUSE_WITHOUT_RNG = (
    "batch differs (the data order not restored, or an RNG the data pipeline draws from)"
)
"""The batch's cause for a trainer whose records lack batch_rng_sha: the RNG before the batch is unknown."""
ALSO = {
    "batch_rng_sha": "the RNG before the batch",
    "batch_sha": "the batch",
    "rng_sha": "the RNG at the step's start",
    "lr": "the lr",
}
LOSS_CAUSE = (
    "the same batch and RNG, but the loss differs (state outside the checkpoint: a counter, a callback, "
    "an optimizer's extra state)"
)
START_CAUSE = {
    "batch_rng_sha": "the RNG before the batch differs: the random state changes at every start",
    "batch_sha": "batch differs: the data order changes at every start",
    "rng_sha": "RNG differs: the random state changes at every start",
    "lr": "lr differs: the schedule changes at every start",
}


def by_step(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """One step record per step: where a step was trained twice (a replay), the later attempt's."""
    out: dict[int, dict[str, Any]] = {}
    for r in sorted(
        (r for r in records if r.get("event") == "step"),
        key=lambda r: (r.get("attempt", 0), r.get("time", 0)),
    ):
        out[r["step"]] = r
    return out


def recorded(steps: dict[int, dict[str, Any]]) -> bool:
    """Whether every step record carries the trajectory fields."""
    return bool(steps) and all(all(f in r for f in ("batch_sha", "rng_sha")) for r in steps.values())


def first_divergence(
    ref: dict[int, dict[str, Any]], other: dict[int, dict[str, Any]]
) -> dict[str, Any] | None:
    """The first step both have where a trajectory field differs: {step, field (the first of FIELDS that
    differs), fields (every one that differs there, in FIELDS order), reference, other}."""
    for step in sorted(ref.keys() & other.keys()):
        fields = [
            f
            for f in FIELDS
            if ref[step].get(f) is not None
            and other[step].get(f) is not None
            and ref[step][f] != other[step][f]
        ]
        if fields:
            return {
                "step": step,
                "field": fields[0],
                "fields": fields,
                "reference": ref[step][fields[0]],
                "other": other[step][fields[0]],
            }
    return None


def first_loss_difference(ref: dict[int, dict[str, Any]], other: dict[int, dict[str, Any]]) -> int | None:
    """The first step both have whose logged loss differs (exactly), or None."""
    for step in sorted(ref.keys() & other.keys()):
        a, b = ref[step].get("loss"), other[step].get("loss")
        if a is not None and b is not None and a != b:
            return step
    return None


def trial_cause(fields: list[str], batch_rng_recorded: bool) -> str:
    """The cause a person fixing the script needs, from the fields that differ at the first diverging
    step: the earliest in the step's own order is the one that explains the rest (an RNG that differed
    before the batch was drawn changes a batch that a collator draws for)."""
    first = fields[0]
    if first == "batch_sha" and not batch_rng_recorded:
        return BATCH_CAUSE_WITHOUT_RNG
    return TRIAL_CAUSE[first]


START_FIELDS = ("weights_sha", "optim_sha")
SEED_ADVICE = (
    "seed before the model is built (transformers.set_seed(seed) or torch.manual_seed(seed) before "
    "from_config / from_pretrained / the model's constructor), then drill again"
)


def start_of(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The `start` record of the role's fresh start (trainer/trajectory.py; the lowest attempt's), or None."""
    starts = [r for r in records if r.get("event") == "start"]
    return min(starts, key=lambda r: (r.get("attempt", 0), r.get("time", 0))) if starts else None


def first_start_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """The first of START_FIELDS that both records hold and that differs."""
    return next((f for f in START_FIELDS if f in a and f in b and a[f] != b[f]), None)


def check(
    reference: list[dict[str, Any]], replay: list[dict[str, Any]], trial: list[dict[str, Any]], tier: int = 1
) -> dict[str, Any]:
    """The trajectory section of report.json.

    `recorded`: every role's step records carry it (else `missing` names the roles); `replay`: the first
    step where the replay leaves the reference (None: equal), `trial`: the same for the trial; `finding`:
    one sentence, or None when all three agree. At Tier 1, and only where the reference and its replay
    logged equal losses at every step (so a loss is exact here), the first step where the trial's loss
    left the reference's is reported too: as the cause when the trajectory agrees (`field` "loss"), or
    beside it when the loss differed first."""
    roles = {"reference": by_step(reference), "replay": by_step(replay), "trial": by_step(trial)}
    starts = {"reference": start_of(reference), "replay": start_of(replay), "trial": start_of(trial)}
    missing = [role for role, steps in roles.items() if not recorded(steps)]
    no_start = [role for role, rec in starts.items() if rec is None]
    out: dict[str, Any] = {
        "recorded": not missing and not no_start,
        "missing": sorted(set(missing) | set(no_start)),
        "replay": None,
        "trial": None,
        "steps_compared": len(roles["reference"].keys() & roles["trial"].keys()),
        "finding": None,
    }
    # The exact start first: two fresh starts of one seed that begin from different models leave nothing
    # to certify at any tier, however close their checkpoints end (an integer hash sees what a floor absorbs).
    ref0, rep0, tri0 = starts["reference"], starts["replay"], starts["trial"]
    field = first_start_difference(ref0, rep0) if ref0 and rep0 else None
    if field:
        what = "initial model" if field == "weights_sha" else "initial optimizer state"
        out["replay"] = {
            "step": 0,
            "field": field,
            "reference": ref0[field],
            "other": rep0[field],
            "cause": f"the {what} differs at every start",
        }
        out["finding"] = (
            f"not certifiable: the {what} differs at every start (the reference's and its replay's "
            f"{field} differ before their first step): {SEED_ADVICE}"
        )
        return out
    if missing:
        out["finding"] = (
            f"the trajectory is missing: the step records of {', '.join(missing)} lack batch_sha "
            "and rng_sha (trainer/trajectory.py; the HF callback writes them)"
        )
        return out
    field = first_start_difference(ref0, tri0) if ref0 and tri0 else None
    if field:
        out["trial"] = {
            "step": 0,
            "field": field,
            "reference": ref0[field],
            "other": tri0[field],
            "cause": "the trial started from another initial model",
        }
        out["finding"] = f"step 0: the trial started from another initial model ({field} differs)"
        return out
    start = first_divergence(roles["reference"], roles["replay"])
    if start:
        out["replay"] = {**start, "cause": START_CAUSE[start["field"]]}
        out["finding"] = (
            f"not certifiable: the reference and its replay, two uninterrupted starts, already "
            f"differ at step {start['step']}: {START_CAUSE[start['field']]} (the trainer is "
            "nondeterministic across starts, so a resume bug could hide in that difference)"
        )
        return out
    left = first_divergence(roles["reference"], roles["trial"])
    losses_exact = tier == 1 and first_loss_difference(roles["reference"], roles["replay"]) is None
    loss_step = first_loss_difference(roles["reference"], roles["trial"]) if losses_exact else None
    if left:
        batch_rng = all("batch_rng_sha" in r for role in ("reference", "trial") for r in roles[role].values())
        cause = trial_cause(left["fields"], batch_rng)
        out["trial"] = {**left, "cause": cause, "loss_step": loss_step}
        out["finding"] = f"step {left['step']}: {cause}"
        if left["fields"][1:]:
            out["finding"] += f"; also different: {', '.join(ALSO[f] for f in left['fields'][1:])}"
        if loss_step is not None and loss_step < left["step"]:
            out["finding"] += f"; the loss already differed at step {loss_step}"
    elif loss_step is not None:
        out["trial"] = {
            "step": loss_step,
            "field": "loss",
            "fields": ["loss"],
            "cause": LOSS_CAUSE,
            "reference": roles["reference"][loss_step]["loss"],
            "other": roles["trial"][loss_step]["loss"],
            "loss_step": loss_step,
        }
        out["finding"] = f"step {loss_step}: {LOSS_CAUSE}"
    elif no_start:  # the trajectory agrees, but the exact start cannot be checked: not certifiable at Tier 2
        out["finding"] = (
            f"the trajectory is missing: {', '.join(no_start)} wrote no start record (weights_sha; "
            "trainer/trajectory.py, the HF callback writes it)"
        )
    return out
