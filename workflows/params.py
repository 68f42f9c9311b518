"""The drill's workflow parameters and their checks, shared by `run` (equivalence.py) and `submit`
(argo.py) without either importing the other.

Parameters reach the steps only as argv elements and env values, never through a shell. Every check
here runs before anything is run or submitted, and names the parameter it refuses.
"""

from __future__ import annotations

import re

from steps.lib.contract import (
    BOUNDS,
    CLUSTER_EVICTION_MODES,
    EVICTION_MODES,
    POD_GROUP_LABEL,
    QUEUE_LABEL,
    RELEASE_TEMPLATE,
)
from trainer.bounded import Bound, OutOfRange, parse

STORE_PORT = 29500  # torchrun's default --master-port; docs/multinode.md shows a NetworkPolicy that allows it
# name -> (default, description). The order is the order users see in the Argo UI; the overlays patch
# some by position (pinned by a `test` op), so new parameters go at the end.
PARAMETERS: dict[str, tuple[str, str]] = {
    "config": ("trainer/configs/tiny.yaml", "trainer config file, inside the image"),
    "total_steps": ("200", "optimizer steps of every run"),
    "evictions": ("3", "evictions of the trial"),
    "retry_limit": ("8", "retries of each training step; must exceed evictions (the CLI sets evictions + 5)"),
    "seed": ("0", "training seed, and the seed of the eviction jitter"),
    "jitter": (
        "false",
        "true: eviction points jittered inside their bands; edges: that, with the first at step 1 "
        "and the second at a checkpoint step (a soak's edges)",
    ),
    "dropout": ("0.1", "attention dropout, so that a lost RNG state cannot hide"),
    "every_steps": ("10", "periodic checkpoint interval, in steps"),
    "grace": (
        "30",
        "seconds between SIGTERM and SIGKILL: pod grace, BATON_GRACE, torchrun --shutdown-timeout",
    ),
    "ranks": ("1", "ranks per pod (torchrun --nproc-per-node)"),
    "bucket": ("s3://baton-drills", "checkpoint and evidence store (file://, s3://, gs://)"),
    "prefix": (
        "drills",
        "prefix under the bucket; each drill writes under <bucket>/<prefix>/<workflow name>",
    ),
    "image": ("baton:cpu", "container image for every step"),
    "disable_sigterm_handler": (
        "0",
        "1: the trial runs without its SIGTERM handling (the drill's negative "
        "control; with trainer=hf, the example without the callback)",
    ),
    "eviction": (
        "evict",
        "how evict ends a trial attempt: evict (the Eviction API); locally also delete, "
        "node-shutdown (GKE Spot), lost-vm, kueue (a Kueue preemption)",
    ),
    "queue": (
        "",
        "Kueue LocalQueue; when set, every pod carries the label kueue.x-k8s.io/queue-name=<queue> "
        "(spec.podMetadata, written when the workflow is rendered or submitted)",
    ),
    "trainer": (
        "baton",
        "what reference, replay and trial run: baton, hf (examples/hf_trainer/train.py), "
        "or 'SCRIPT ARGS...' (split by steps.train, never by a shell); it gets --config and the --set keys",
    ),
    "tier": (
        "auto",
        "how compare judges the final checkpoints: 1 (every entry equal), 2 (model and optimizer "
        "floats within the measured floor, the rest equal), auto (1 on a CPU with deterministic kernels, "
        "else 2); the trajectory is checked exactly at every tier",
    ),
    "deadline": (
        "0",
        "seconds before the whole drill is failed (Argo's activeDeadlineSeconds), so that one that "
        "never schedules ends and the next nightly drill runs; 0: derived from the drill's size",
    ),
    "baseline_pool": (
        "spot",
        "where reference and reference-replay run on GKE: spot (preemptible like the trial; an "
        "interrupted baseline may leave the verdict open) or on-demand (never preempted; costs "
        "about 3x while it runs); the gke overlay's node pools gpu-spot and gpu-on-demand",
    ),
    "nodes": (
        "1",
        "pods (nodes) in each of reference, reference-replay and trial, each with `ranks` ranks; above 1, "
        "each role is a group of pods (docs/multinode.md); set when the workflow is rendered or submitted",
    ),
    "evict_node": (
        "",
        "with nodes > 1: the node whose pod evict ends (0 .. nodes-1); empty: drawn under the seed "
        "at each eviction",
    ),
    "rendezvous_timeout": (
        "1200",
        "with nodes > 1: seconds a training pod waits for its group, both for node 0's round "
        "file and in torchrun's static rendezvous (steps.train --rendezvous-timeout), "
        "before it exits 75; sized for a new Spot VM plus an image pull (docs/multinode.md)",
    ),
    "store_port": (
        str(STORE_PORT),
        "with nodes > 1: the TCP port of node 0's rendezvous store (torchrun's static "
        "rendezvous), fixed so that a NetworkPolicy can allow it between the drill's "
        "pods; 0: a free port at each round, what `run` uses (every local pod is "
        "127.0.0.1, and three roles run at once)",
    ),
}
BASELINE_POOLS = ("spot", "on-demand")
# A Kubernetes label value: at most 63 characters, alphanumerics with - _ . inside.
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
# The numeric parameters, each read in its range (steps/lib/contract.py BOUNDS: the steps' flags that carry them
# are read in the same one), so that what would fail inside a pod is refused here, before anything runs.
_NUMBERS = (
    "total_steps",
    "evictions",
    "retry_limit",
    "seed",
    "grace",
    "ranks",
    "every_steps",
    "deadline",
    "nodes",
    "rendezvous_timeout",
    "store_port",
    "dropout",
)
# Booleans, normalised to "1"/"0" (BATON_DISABLE_SIGTERM_HANDLER is read as exactly that): a negative
# control asked for as "true" must not quietly run as a normal trial.
_BOOLEANS = ("disable_sigterm_handler",)
_BOOLEAN_VALUES = {"1": "1", "true": "1", "0": "0", "false": "0"}
TIERS = ("auto", "1", "2")


def number(values: dict[str, str], name: str, bound: Bound | None = None) -> int | float:
    """Parameter `name` of `values`, read in its range (BOUNDS, or `bound`); SystemExit naming the parameter
    and the range otherwise, before any conversion of a value too long to be a number."""
    try:
        return parse(values[name], f"parameter {name}", bound or BOUNDS[name])
    except OutOfRange as e:
        raise SystemExit(f"error: {e}") from None


def default_retry_limit(evictions: int, chaos: int = 0) -> int:
    """Room for every eviction and every chaos deletion of a training task, and 5 more."""
    return evictions + chaos + 5


def parse_params(items: list[str]) -> dict[str, str]:
    """`-p name=value` items as a dict; an unknown name or a missing `=` is refused."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"error: -p {item!r}: expected name=value")
        if name not in PARAMETERS:
            raise SystemExit(f"error: -p {name}: unknown parameter (known: {', '.join(PARAMETERS)})")
        out[name] = value
    return out


def values_of(params: dict[str, str]) -> dict[str, str]:
    """Every parameter's value: the defaults with `params` over them."""
    return {k: v for k, (v, _) in PARAMETERS.items()} | params


def resolve_params(overrides: dict[str, str], cluster: bool = False) -> dict[str, str]:
    """Overrides, plus a retry limit that follows the evictions; checked before anything runs.
    `cluster`: the values go to a real Argo (only the eviction modes the Kubernetes API offers)."""
    params = dict(overrides)
    values = values_of(params)
    for k in _NUMBERS:
        value = number(values, k)
        if k in params:  # what the pods get: the number as Python writes it ("+07" -> "7")
            params[k] = values[k] = str(value)
    for k in _BOOLEANS:
        flag = _BOOLEAN_VALUES.get(values[k].strip().lower())
        if flag is None:
            raise SystemExit(f"error: parameter {k} must be true, false, 1 or 0, got {values[k]!r}")
        if k in params or values[k] != flag:
            params[k] = values[k] = flag  # what the pod reads: "1" or "0", never a spelling it would not
    if values["baseline_pool"] not in BASELINE_POOLS:
        raise SystemExit(
            f"error: parameter baseline_pool must be one of {', '.join(BASELINE_POOLS)}, "
            f"got {values['baseline_pool']!r}"
        )
    if values["evict_node"]:
        number(values, "evict_node", Bound(0, int(values["nodes"]) - 1, integer=True))
    if values["tier"] not in TIERS:
        raise SystemExit(f"error: parameter tier must be one of {', '.join(TIERS)}, got {values['tier']!r}")
    if "retry_limit" not in params:
        params["retry_limit"] = str(default_retry_limit(int(values["evictions"])))
        values["retry_limit"] = params["retry_limit"]
    if int(values["retry_limit"]) <= int(values["evictions"]):
        raise SystemExit(
            f"error: retry_limit ({values['retry_limit']}) must exceed evictions ({values['evictions']})"
        )
    modes = CLUSTER_EVICTION_MODES if cluster else EVICTION_MODES
    if values["eviction"] not in modes:
        where = "on a cluster" if cluster else "here"
        raise SystemExit(
            f"error: parameter eviction must be one of {', '.join(modes)} {where}, got {values['eviction']!r}"
        )
    if not _LABEL_VALUE.fullmatch(values["queue"]):
        raise SystemExit(
            f"error: parameter queue: {values['queue']!r} is not a valid Kubernetes label value "
            "(at most 63 characters: letters, digits, '-', '_' and '.', beginning and ending with a "
            "letter or digit); it becomes the pods' kueue.x-k8s.io/queue-name label"
        )
    from steps.evict import JITTER_MODES, eviction_points

    if values["jitter"] not in JITTER_MODES:
        raise SystemExit(
            f"error: parameter jitter must be one of {', '.join(JITTER_MODES)}, got {values['jitter']!r}"
        )
    try:
        eviction_points(int(values["total_steps"]), int(values["evictions"]))
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    return params


# A drill's deadline, derived from its size: half an hour for scheduling and image pulls, 15 min for every
# attempt of the trial (each waits for a node, starts, restores and trains its share), and 6 s a step for
# the training itself (a 0.5B-shaped step on one H200 took well under 1 s; the slack covers slower pools).
DEADLINE_BASE_S, DEADLINE_PER_ATTEMPT_S, DEADLINE_PER_STEP_S = 1800, 900, 6


def drill_deadline_s(values: dict[str, str]) -> int:
    """The drill's activeDeadlineSeconds: the `deadline` parameter, or (0) one derived from its size."""
    if int(values["deadline"]):
        return int(values["deadline"])
    attempts = int(values["evictions"]) + 2
    per_attempt = DEADLINE_PER_ATTEMPT_S
    if int(values.get("nodes") or 1) > 1:  # an attempt may wait out a whole rendezvous for a slow replacement
        per_attempt += int(values.get("rendezvous_timeout") or 0)
    return DEADLINE_BASE_S + per_attempt * attempts + DEADLINE_PER_STEP_S * int(values["total_steps"])


def set_deadline(obj: dict, values: dict[str, str]) -> None:
    """Put the drill's deadline (from parameter values that passed resolve_params) into a Workflow or a
    CronWorkflow's workflowSpec: Argo's activeDeadlineSeconds is an integer, never a template expression."""
    spec = obj.setdefault("spec", {})
    spec = spec.setdefault("workflowSpec", {}) if obj.get("kind") == "CronWorkflow" else spec
    spec["activeDeadlineSeconds"] = drill_deadline_s(values)


def set_queue_label(obj: dict, queue: str) -> None:
    """Put every pod of a Workflow or CronWorkflow dict into Kueue's LocalQueue `queue` (Kueue's plain Pod
    integration), or out of any queue when `queue` is empty. The `queue` parameter's value is set to match,
    so the Argo UI shows it. `queue` must have passed resolve_params.

    The label goes on spec.podMetadata, which reaches every pod; but a spec whose training pods are Kueue
    pod groups (nodes > 1) also gets the release exit handler (release_template), whose pod must stay out
    of the queue, and a template cannot take a spec.podMetadata label off (Argo merges them; Kueue's webhook
    refuses an empty queue name). There, the label goes on each pod template's own metadata instead."""
    spec = obj.setdefault("spec", {})
    spec = spec.setdefault("workflowSpec", {}) if obj.get("kind") == "CronWorkflow" else spec
    for prm in spec.get("arguments", {}).get("parameters", []):
        if prm.get("name") == "queue":
            prm["value"] = queue
    set_release_handler(spec, bool(queue))
    per_template = spec.get("onExit") == RELEASE_TEMPLATE
    for t in spec.get("templates", []):
        labels = (t.get("metadata") or {}).get("labels")
        if labels is not None:
            labels.pop(QUEUE_LABEL, None)
        if queue and per_template and "container" in t and t.get("name") != RELEASE_TEMPLATE:
            t.setdefault("metadata", {}).setdefault("labels", {})[QUEUE_LABEL] = queue
    labels = spec.setdefault("podMetadata", {}).setdefault("labels", {})
    if queue and not per_template:
        labels[QUEUE_LABEL] = queue
    else:
        labels.pop(QUEUE_LABEL, None)
        if not labels:
            spec["podMetadata"].pop("labels")
        if not spec["podMetadata"]:
            spec.pop("podMetadata")


def release_template() -> dict:
    """The exit handler of a drill whose pods are Kueue pod groups (steps/release.py says why). Its pod has no
    queue label (set_queue_label labels the other templates), so that it runs even when the quota it releases
    is what the queue lacks. Argo runs an exit handler after a failure, a stop and a passed deadline
    (workflowpod.go: onExit pods ignore the workflow's deadline), never after a terminate.

    No retryStrategy: steps.release tries again itself. With one, Argo v3.7.18 names the handler's pod node
    `<workflow>.onExit(0)`, which IsPartOfExitHandler does not take for the exit handler (it looks for the
    `.onExit` suffix), so after a passed deadline operator.go's failNodesWithoutCreatedPodsAfterDeadlineOrShutdown
    failed the handler's pod while it was still Pending ("Step exceeded its deadline"), and processNodeRetries
    retries nothing past the deadline: the quota stayed held (make e2e, 2026-12-05)."""
    return {
        "name": RELEASE_TEMPLATE,
        "container": {
            "image": "{{workflow.parameters.image}}",
            "command": ["python"],
            "args": [
                "-m",
                "steps.release",
                "--workflow",
                "{{workflow.name}}",
                "--status",
                "{{workflow.status}}",
            ],
            "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
        },
    }


def set_release_handler(spec: dict, queued: bool) -> None:
    """With `queued` and pod groups among the spec's templates: spec.onExit runs release_template(). Without
    either: no such handler (a spec without a queue has nothing to release)."""
    templates = spec.setdefault("templates", [])
    grouped = any(POD_GROUP_LABEL in ((t.get("metadata") or {}).get("labels") or {}) for t in templates)
    templates[:] = [t for t in templates if t.get("name") != RELEASE_TEMPLATE]
    if spec.get("onExit") == RELEASE_TEMPLATE:
        spec.pop("onExit")
    if queued and grouped:
        if spec.get("onExit"):
            raise ValueError(
                f"the workflow already has an exit handler ({spec['onExit']!r}); "
                f"the Kueue release handler would replace it"
            )
        templates.append(release_template())
        spec["onExit"] = RELEASE_TEMPLATE
