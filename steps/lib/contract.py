"""The drill's contract, defined once: the roles and the DAG's task names, where a drill keeps what it
writes, the files its steps hand each other, how an attempt can be ended, and how Argo records that end.

Torch-free and import-light: the workflows (equivalence.py, argo.py, cli.py), the local runner, the steps,
`gpu/` and the tests read these names; a file name, a task name or an exit code is spelled in code here
and nowhere else (docstrings and help text may quote them). The exit codes themselves live in
trainer/exits.py, beside the trainer's own.
"""

from __future__ import annotations

from pathlib import Path

from trainer.bounded import Bound
from trainer.env import MAX_GRACE_S
from trainer.exits import EXIT_PREEMPTED, EXIT_SIGKILL, EXIT_SIGTERM

# ---- roles and tasks ----------------------------------------------------------------------------------------

ROLES = ("reference", "replay", "trial")
"""The three training runs: their checkpoint roots and evidence folders are named after them."""
TRAINING_TASKS = ("reference", "reference-replay", "trial")
"""The DAG's tasks that run the roles, one per role of ROLES and in that order; their pods write step records."""
TASKS = (*TRAINING_TASKS, "evict", "verify", "compare")
"""Every DAG task that runs a pod, in the DAG's order (`publish`, after compare, is a suspend: no pod).
equivalence.py builds the DAG with these names; `run -p chaos=N` and `-p unschedulable=` choose among them."""
RELEASE_TEMPLATE = "release"
"""The exit handler (Argo's onExit) of a drill whose pods are Kueue pod groups: steps/release.py."""

# ---- the drill's numbers ------------------------------------------------------------------------------------

BOUNDS: dict[str, Bound] = {
    "total_steps": Bound(2, 10_000_000, integer=True),
    "evictions": Bound(0, 10_000, integer=True),
    "retry_limit": Bound(0, 100_000, integer=True),
    "seed": Bound(0, 2**63 - 1, integer=True),
    "every_steps": Bound(0, 10_000_000, integer=True),
    "grace": Bound(1, MAX_GRACE_S, integer=True),
    "ranks": Bound(1, 1024, integer=True),
    "nodes": Bound(1, 1024, integer=True),
    "deadline": Bound(0, 315_360_000, integer=True),  # 10 years: Go's time.Duration holds 292
    "rendezvous_timeout": Bound(1, 604_800, integer=True),  # a week
    "store_port": Bound(0, 65535, integer=True),
    "dropout": Bound(0, 1, below=True),
}
"""The range of each number a drill is given: a workflow parameter of that name (workflows/params.py) and
the step flag that carries it (steps.train, steps.evict) are read in it, through trainer/bounded.py."""

# ---- Kueue's plain-pod integration (v0.19.2, pkg/controller/jobs/pod/constants/constants.go) ----------------

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""The LocalQueue a pod waits in; a pod without it (or with it empty) is not Kueue's, unless a LocalQueue named
`default` exists in its namespace or Kueue manages jobs without a queue name."""
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
"""Pods with the same value are one Workload: no quota until total-count of them exist, then all at once."""
POD_GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"
RETRIABLE_IN_GROUP = "kueue.x-k8s.io/retriable-in-group"
"""Set to "false" on one pod, it makes the group finish once no pod of it is active (pod_controller.go,
Finished); it cannot be set back (pod_webhook.go)."""

# ---- the files the steps hand each other --------------------------------------------------------------------

EVICTIONS_JSON = "evictions.json"
"""What evict did (steps/evict.py), in the drill's root; verify and compare read it."""
VERIFY_JSON = "verify.json"
"""verify's classification of the trial's records (steps/verify.py), in the drill's root; compare reads it."""
REPORT_JSON, REPORT_MD, LOSS_PNG = "report.json", "report.md", "loss.png"
REPORT_FILES = (REPORT_JSON, REPORT_MD, LOSS_PNG)
"""What compare writes into its report folder (report_root in the bucket; the artifacts on a cluster).
report.json, the one readers go by, is written last."""

# ---- where a drill keeps what it writes ---------------------------------------------------------------------


def drill_root(bucket: str, prefix: str, workflow: str) -> str:
    """`<bucket>/<prefix>/<workflow>`: everything one drill writes (Argo placeholders work as the values)."""
    return f"{bucket.rstrip('/')}/{prefix}/{workflow}"


def role_root(root: str, role: str) -> str:
    """A role's checkpoint root inside a drill's root."""
    return f"{root}/{role}"


def evidence_root(root: str, role: str | None = None) -> str:
    """The evidence (record lines) of a drill, or of one role."""
    return f"{root}/evidence" + (f"/{role}" if role else "")


def rounds_root(root: str, role: str) -> str:
    """Where a role's node 0 publishes each round of its group (steps/lib/group.py), with nodes > 1."""
    return f"{root}/rounds/{role}"


def report_root(root: str) -> str:
    return f"{root}/report"


def evictions_file(root: str) -> str:
    return f"{root}/{EVICTIONS_JSON}"


def verify_file(root: str) -> str:
    return f"{root}/{VERIFY_JSON}"


def local_drills(bucket_dir: Path) -> list[Path]:
    """The drill roots in a local bucket folder (`<bucket>/<prefix>/<workflow>`), oldest name first."""
    return sorted(p for p in bucket_dir.glob("*/*") if p.is_dir())


# ---- how an attempt can be ended ----------------------------------------------------------------------------

EVICTION_MODES = ("evict", "delete", "kueue", "node-shutdown", "lost-vm")
"""How evict ends a trial attempt (steps/lib/local_pods.py says what each does and how Argo records it)."""
CLUSTER_EVICTION_MODES = ("evict",)
"""What steps.evict can do through the Kubernetes API; the others exist in the local runner only."""
GONE_BEFORE_SEEN = ("evict", "delete", "kueue")
"""Modes whose pod object is gone before Argo's controller reads its final status (an Error "pod deleted"). A
Kueue preemption too: Kueue removes its finalizer in the reconcile that finishes the Workload, as soon as the
pod has terminated, and the real controller recorded every Kueue-preempted or Kueue-managed evicted trial as
`pod deleted` with no exit code (docs/cluster-local.md, "Kueue on the local cluster"). Not a pod of a queued
Kueue pod group (nodes > 1): Kueue keeps its finalizer until the whole group finishes, and Argo read every such
evicted pod's exit code (75) on the real controllers (the local runner's Task.kueue_group)."""

# ---- how a step finds its workflow's pods on a cluster (steps/evict.py, steps/release.py) --------------------

WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
"""The label Argo puts on each pod of a workflow: its name."""
NODE_NAME_ANNOTATION = "workflows.argoproj.io/node-name"
"""Argo's node name of a pod: `<workflow>.<task>(<i>:<i>)(<attempt>)` for a withSequence item's attempt."""
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
"""Where a pod reads its own namespace (the service account's mount)."""

# ---- how Argo v3.7 records the end of an attempt (docs/cluster-local.md; read from its source) ---------------


def container_error(code: int) -> str:
    """Argo's message for a main container that exited with `code`."""
    return f"main: Error (exit code {code})"


POD_DELETED = "pod deleted"
"""A pod deleted or evicted through the API, gone before the controller read its status: no exit code."""
NODE_SHUTDOWN = "Pod was terminated in response to imminent node shutdown."
"""The kubelet's graceful node shutdown (a GKE Spot node)."""
LOST_VM = "pod failed: neither main nor wait container completed successfully"
"""A VM lost without a graceful shutdown (exit -1)."""
PRESSURE_EVICTED = "The node was low on resource"
"""The start of a kubelet's pressure eviction message."""
SIGKILLED = container_error(EXIT_SIGKILL)
"""A container SIGKILLed after its grace."""
OOM_KILLED = "OOMKilled"
"""In Argo's message for a container the OOM killer ended ("main: OOMKilled (exit code 137)")."""
POD_DEADLINE = "Pod was active on the node longer than the specified deadline"
"""The kubelet's words for activeDeadlineSeconds on a running pod."""
STEP_DEADLINE = "Step exceeded its deadline"
"""Argo's, for a node that had no running pod at the workflow's deadline."""
RETRY_DEADLINE = "retry exceeded workflow deadline"
"""Argo's, for a retry that will not start."""
NO_MORE_RETRIES = "No more retries left"

# The ends of an attempt that met an eviction, a preemption or a lost node, matched in Argo's message: a
# kubelet's graceful node shutdown, a pod object gone before the controller saw its status, a VM lost without
# a graceful shutdown, a kubelet pressure eviction. A crash (exit 1) matches none of them and is never retried.
DISRUPTIONS = (
    NODE_SHUTDOWN.removeprefix("Pod was terminated in response to ").rstrip("."),
    POD_DELETED,
    LOST_VM.removeprefix("pod failed: "),
    PRESSURE_EVICTED,
)


def _code_is(code: int) -> str:
    return f"asInt(lastRetry.exitCode) == {code}"


_DISRUPTED = f"lastRetry.message matches '{'|'.join(DISRUPTIONS)}'"
RETRY_EXPRESSION = (
    f"{_code_is(EXIT_PREEMPTED)} || {_code_is(EXIT_SIGTERM)} || "
    f"({_code_is(EXIT_SIGKILL)} && !(lastRetry.message matches '{OOM_KILLED}')) || {_DISRUPTED}"
)
"""The training tasks' retryStrategy.expression. Exit 75 is a trainer that saved in time, whatever the message.
Exit 143 is a pod deleted in its first instants, before steps.train's SIGTERM handler existed: nothing was
started (steps.train itself answers 75 for a SIGTERM that came before any step, 0 for one after `done`). Exit
137 is a trainer SIGKILLed after its grace, whichever way its pod was ended: retried, since the last commit
stands; an OOM kill is 137 too, and retrying it repeats it."""
HELPER_RETRY_EXPRESSION = f"{_code_is(EXIT_SIGTERM)} || {_DISRUPTED}"
"""evict, verify and compare: no trainer, so no exit 75; a SIGTERM they do not handle ends them with 143. Each
is idempotent: evict resumes its own record, verify rewrites its file whole, compare writes report.json last."""
