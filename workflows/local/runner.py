"""Run a *rendered* Argo Workflow (the dict that ``kubectl`` would receive) on this machine, with no cluster.

Each attempt of a task is a "pod": ``workflows/local/pod_init.py`` as its PID 1 (in a session of its own),
which runs the container's command in a process group of its own, forwards signals to that group as
Argo's emissary does, and is a child subreaper, so that every process the pod starts (torchrun's
workers too, which call setsid) can be SIGKILLed with it. Output goes to
``<out_dir>/logs/<task>-<attempt>.log``. Retries, pod deletion and grace periods follow what Argo and
Kubernetes do, so that the drill's retry expression is exercised for real.

Supported (anything else is refused with ``UnsupportedSpec`` naming the field, before anything runs):

- ``apiVersion: argoproj.io/v1alpha1``, ``kind: Workflow``; ``metadata.name`` or ``metadata.generateName``.
- ``spec.entrypoint``; ``spec.arguments.parameters`` (name, value, description, enum), overridable with
  ``params``; ``spec.templates``; ``spec.activeDeadlineSeconds`` (running pods get SIGTERM, then SIGKILL
  after their grace, and the workflow fails).
- ``dag`` templates: ``tasks`` with name, template (a container template), ``dependencies``,
  ``continueOn`` (failed, error: the task's failure lets its dependents run and does not fail the
  workflow) and, because Hera's ``a >> b`` renders it, ``depends`` limited to ``a && b`` (optionally
  ``a.Succeeded``); ``withSequence`` with ``count`` (items named ``task(i:i)`` as Argo names them,
  ``{{item}}`` only in the task's arguments, each item retried on its own, a dependency on the task
  waiting for every item).
  A container template may also be the entrypoint on its own.
- ``container`` templates: ``command`` (required here: there is no image entrypoint), ``args``, ``env``
  (``value``, or ``valueFrom.fieldRef.fieldPath``: ``metadata.name``, the pod name, or ``status.podIP``,
  127.0.0.1 here); ``inputs.parameters``
  (name, default); ``outputs.artifacts`` (name, path: copied to ``<out_dir>/artifacts/<task>/<name>``
  after a successful attempt); ``retryStrategy`` (limit, retryPolicy, expression, see ``argo_expr``);
  ``podSpecPatch`` with only ``terminationGracePeriodSeconds``; ``activeDeadlineSeconds`` (per pod).
- Substitution in command, args, env values, artifact paths, podSpecPatch, task argument values,
  ``retryStrategy.limit`` and ``activeDeadlineSeconds``: ``{{inputs.parameters.X}}``,
  ``{{workflow.parameters.X}}``, ``{{workflow.name}}``, ``{{workflow.uid}}``, ``{{pod.name}}``, and ``{{retries}}`` (only in
  templates with a retryStrategy, as in Argo). It is one textual pass into argv elements, never through a
  shell: a substituted value stays data, even if it holds quotes, ``$(...)`` or ``{{...}}``.

Accepted without local effect: see ``ACCEPTED_WITHOUT_EFFECT`` in ``workflows/local/spec.py`` (one place, on
purpose), which holds the checks and the substitution; this module runs the plan.

Retry semantics, recorded as Argo v3.7 records them: exit 0 is Succeeded; another exit is Failed,
"main: Error (exit code N)". A pod ended through the registry (``steps/lib/local_pods.py``: deleted,
evicted, preempted by Kueue, its node shut down or its VM lost) is recorded as that module's docstring
says. A deleted, evicted or Kueue-preempted pod is an Error "pod deleted" with no exit code, whatever its process
did: the object is gone before Argo's controller reads its final status, as on the real controllers
(docs/cluster-local.md); the registry still shows the container's own exit code, as the pod's last status
did. Except a pod of a queued Kueue pod group (``Task.kueue_group``): Kueue's finalizer keeps it until the
whole group finishes, so Argo records its exit code. ``spec.onExit`` is accepted only when it names the Kueue
release handler (``steps/release.py``), which does not run here: there is no Kueue to release. A task whose
retries run out is failed with "No more retries left". Policies: Always (Failed, Error), OnFailure (Failed), OnError
(Error), OnTransientError (Error only: an approximation, Argo also classifies messages). Without a policy
the default is OnFailure, or Always when an expression is given (Argo >= 3.5). The policy is ANDed with
the expression; the limit counts retries (no limit: unlimited, as in Argo). There is no backoff.
When a task fails for good, its dependents never start unless its ``continueOn`` covers the failure;
every other task whose dependencies are met still starts, as in Argo v3.7.18, whose DAG failFast decides
only the DAG's phase (seen on the real controller: tests/e2e/test_local_cluster.py); the workflow fails
unless every failed task continued on.

Pod registry (how a sibling "evict" step ends a pod locally): the protocol is the steps' own,
``steps/lib/local_pods.py``; every pod gets ``BATON_LOCAL_PODS=<out_dir>/pods``. The grace is the pod's
``terminationGracePeriodSeconds`` (default 30). SIGKILL reaches the pod's whole process tree.

Chaos (``run_workflow(..., chaos=Chaos(...))``, ``workflows/local/chaos.py``): the runner also deletes pods as the
plan says, the way a registry ``delete`` request does, only where a retry would follow; what it deleted is
in ``RunResult.chaos`` and ``<out_dir>/chaos.json``.

Ctrl-C or SIGTERM to the runner: every pod group gets SIGTERM, then SIGKILL after 5 s (at once on a
second signal); then ``KeyboardInterrupt`` (SIGINT) or ``SystemExit(143)`` (SIGTERM) propagates, after
``<out_dir>/nodes.json`` is written. (Signal handlers are installed only when called from the main thread.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import workflows.local.argo_expr as argo_expr
from steps.lib.contract import (
    GONE_BEFORE_SEEN,
    LOST_VM,
    NO_MORE_RETRIES,
    NODE_SHUTDOWN,
    POD_DEADLINE,
    POD_DELETED,
    RETRY_DEADLINE,
    SIGKILLED,
    STEP_DEADLINE,
    container_error,
)
from steps.lib.local_pods import ENV as PODS_ENV
from steps.lib.local_pods import read_request, write_atomic
from trainer.exits import EXIT_SIGKILL, SIGNAL_EXIT_BASE, signal_exit
from workflows.local.chaos import Chaos
from workflows.local.pod_init import kill_descendants
from workflows.local.spec import (
    POLICY_RETRIES,
    Plan,
    Task,
    UnsupportedSpec,
    argv_env,
    artifact_paths,
    build_plan,
    out_params,
    pod_ctx,
    pod_grace,
    resolve_late_inputs,
)

POD_INIT = str(Path(__file__).resolve().parent / "pod_init.py")

INTERRUPT_GRACE_S = 5.0
POLL_S = 0.05
STEP_PROGRESS_EVERY_S = 2.0
# Argo's and the kubelet's messages for the end of a pod (steps/lib/contract.py). A pod deleted or evicted through
# the API: the kubelet writes the container's final status and deletes the object in one sync
# (status_manager.go), and Argo's controller (default settings: no status-capture finalizer) finds the pod
# gone before it read that status: an Error with no exit code. Seen in every eviction and deletion on the real
# controller (docs/cluster-local.md), and in every Kueue preemption on the real Kueue: its finalizer goes as
# soon as the pod has terminated (steps/lib/contract.py, GONE_BEFORE_SEEN).
NODE_SHUTDOWN_GRACE_S = 15.0  # what a GKE Spot node's shutdown leaves ordinary pods
KUEUE_CONDITION = {"type": "TerminationTarget", "status": "True", "reason": "WorkloadEvictedDueToPreempted"}


@dataclass
class NodeResult:
    """One attempt (one pod). ``started``/``finished`` are Unix times; ``exit_code`` is -1 if unknown."""

    task: str
    template: str
    attempt: int
    pod_name: str
    exit_code: int
    status: str  # Succeeded, Failed or Error, as Argo names node phases
    message: str
    log_path: Path
    started: float
    finished: float
    artifacts: dict[str, Path] = field(default_factory=dict)
    parameters: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)


@dataclass
class RunResult:
    phase: str  # Succeeded or Failed
    nodes: list[NodeResult]
    name: str = ""
    message: str = ""
    chaos: dict[str, Any] | None = None  # the chaos deletions (workflows/local/chaos.py), when there were any

    def attempts(self, task: str) -> list[NodeResult]:
        return [n for n in self.nodes if n.task == task]


_write_atomic = write_atomic


# ----------------------------------------------------------------------------------------------- execution
@dataclass
class _Pod:
    task: Task
    attempt: int
    name: str
    proc: subprocess.Popen
    log_path: Path
    reader: Any
    grace: float
    started: float
    t0: float  # monotonic
    forced: tuple[str, str] | None = None  # (status, message) decided by whoever stopped it
    how: str | None = None  # how a registry request ends it (steps.lib.local_pods.HOW)
    sigkilled: bool = False  # still running when the grace ran out
    kill_at: float | None = None
    partial: bytes = b""
    step: int | None = None
    restoring: bool = False  # between its `restore` record and its `resume` record
    total: int | None = None
    shown_step: int | None = None


class _Runner:
    def __init__(
        self,
        plan: Plan,
        out_dir: Path,
        progress: TextIO | None,
        cwd: Path,
        env: dict[str, str],
        chaos: Chaos | None = None,
        unschedulable: frozenset[str] = frozenset(),
    ):
        self.plan, self.out, self.progress, self.cwd = plan, out_dir, progress, cwd
        self.chaos = chaos
        self.unschedulable = unschedulable  # tasks whose pods stay Pending: no node will take them
        self.pods_dir = out_dir / "pods"
        self.base_env = {**os.environ, **env, PODS_ENV: str(self.pods_dir)}
        # pending -> running -> (retry -> running)* -> succeeded | failed | continued (failed, and its
        # continueOn lets dependents run); pending ones may never run.
        self.state = dict.fromkeys(plan.tasks, "pending")
        self.next_attempt = dict.fromkeys(plan.tasks, 0)
        self.running: dict[str, _Pod] = {}
        self.why: dict[
            str, str
        ] = {}  # why a failed task was not retried (Argo's "No more retries left", ...)
        self.nodes: list[NodeResult] = []
        self.t0 = time.monotonic()
        self.aborting = False  # signal or deadline: no new tasks, no retries
        self.message = ""
        self.signalled: int | None = None
        self.hurry = False  # a second signal: SIGKILL without waiting for the grace
        self.interrupted = self.deadline_hit = False
        self.last_step_line: dict[str, float] = {}

    def say(self, msg: str) -> None:
        if self.progress is not None:
            self.progress.write(f"[{time.monotonic() - self.t0:.1f}s] {msg}\n")
            self.progress.flush()

    def run(self) -> RunResult:
        for d in ("logs", "pods", "artifacts"):
            (self.out / d).mkdir(parents=True, exist_ok=True)
        self.say(f"workflow {self.plan.name}: {len(self.plan.tasks)} task(s); logs in {self.out / 'logs'}")
        handlers = self._install_signals()
        try:
            while True:
                self._check_aborts()
                if self.deadline_hit:  # Argo still creates a node whose dependencies are met, and fails it
                    for task in self._startable(ignore_abort=True):
                        self._fail_unstarted(task, STEP_DEADLINE, pending=False)
                for task in self._startable():
                    self._start(task, self.next_attempt[task.name])
                for pod in list(self.running.values()):
                    self._tick(pod)
                if not self.running and not self._startable() and "unscheduled" not in self.state.values():
                    break
                time.sleep(POLL_S)
        finally:
            for pod in list(self.running.values()):  # only after an unexpected exception: leave no orphans
                _kill_tree(pod.proc.pid)
                pod.proc.wait()
                pod.reader.close()
                self._record(pod, "Failed", exit_code=signal_exit(pod.proc.returncode), status="Error")
            for sig, h in handlers.items():
                signal.signal(sig, h if h is not None else signal.SIG_DFL)
            self._write_nodes()
            if self.chaos is not None:
                for d in self.chaos.deletions:
                    if d.outcome == "planned":
                        d.outcome = "missed"
                _write_atomic(self.out / "chaos.json", json.dumps(self.chaos.record(), indent=1))
        for name, st in self.state.items():
            if st == "pending":
                self.say(f"{name} not run")
        phase = (
            "Succeeded" if all(st in ("succeeded", "continued") for st in self.state.values()) else "Failed"
        )
        if phase == "Failed" and not self.message:
            self.message = "failed: " + ", ".join(
                n + (f" ({self.why[n]})" if self.why.get(n) else "")
                for n, st in self.state.items()
                if st == "failed"
            )
        self.say(f"workflow {self.plan.name} {phase}" + (f": {self.message}" if phase == "Failed" else ""))
        if self.signalled == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signalled is not None:
            raise SystemExit(SIGNAL_EXIT_BASE + self.signalled)
        return RunResult(
            phase,
            self.nodes,
            self.plan.name,
            self.message if phase == "Failed" else "",
            self.chaos.record() if self.chaos is not None else None,
        )

    def _startable(self, ignore_abort: bool = False) -> list[Task]:
        """Tasks to start now. `ignore_abort`: those whose dependencies are met even though the workflow is
        stopping (after its deadline, real Argo still created and failed verify's node)."""
        if self.aborting and not ignore_abort:
            return []
        return [
            t
            for n, t in self.plan.tasks.items()
            if self.state[n] == "retry"
            or (
                self.state[n] == "pending"
                and all(self.state[d] in ("succeeded", "continued") for d in t.deps)
            )
        ]

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum: int, _frame: Any) -> None:
            self.hurry = self.signalled is not None
            self.signalled = signum

        return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _check_aborts(self) -> None:
        if self.signalled is not None and not self.interrupted:
            self.interrupted = True
            self._abort(f"runner interrupted ({signal.Signals(self.signalled).name})", INTERRUPT_GRACE_S)
        elif (
            self.plan.deadline_s is not None
            and not self.deadline_hit
            and time.monotonic() - self.t0 > self.plan.deadline_s
        ):
            # As Argo v3.7 records it (docs/cluster-local.md, "The workflow's deadline"): running pods end as
            # the kubelet ends a pod past its activeDeadlineSeconds, Pending ones and whatever becomes ready
            # now fail with STEP_DEADLINE, retries do not start, and the workflow itself gets no message (the
            # runner's own summary says why).
            self.deadline_hit = True
            self.message = f"failed: the workflow's activeDeadlineSeconds ({self.plan.deadline_s:g} s) passed"
            self._abort(POD_DEADLINE, None, pending_why=STEP_DEADLINE)

    def _abort(self, why: str, grace: float | None, pending_why: str | None = None) -> None:
        self.aborting = True
        self.message = self.message or why
        self.say(f"stopping: {why}")
        for name, st in self.state.items():
            if st == "retry":  # its retry will not start now
                self.state[name] = "failed"
                self.why[name] = RETRY_DEADLINE if self.deadline_hit else "workflow stopping"
            elif (
                st == "unscheduled"
            ):  # a Pending pod: Argo fails its node when the workflow's deadline passes
                self._fail_unstarted(self.plan.tasks[name], pending_why or why, pending=True)
        for pod in self.running.values():
            self._terminate(pod, "Failed", why, grace)
            if grace is not None and pod.kill_at is not None:  # a pod already being deleted: the sooner wins
                pod.kill_at = min(pod.kill_at, time.monotonic() + grace)

    def _fail_unstarted(self, task: Task, why: str, pending: bool) -> None:
        """A node Argo fails without a pod that ran: a Pending pod at the deadline (its registry record says
        Failed), or a task that became ready after the deadline (Argo creates its node and fails it)."""
        # A failure its dependents continue on lets them become ready too (Argo's depends), and fail likewise.
        self.state[task.name] = "continued" if "Failed" in task.continue_on else "failed"
        attempt = self.next_attempt[task.name]
        pod = task.pod_name(self.plan.name, attempt)
        now = time.time()
        self.nodes.append(
            NodeResult(
                task.name,
                task.template,
                attempt,
                pod,
                -1,
                "Failed",
                why,
                self.out / "logs" / f"{task.slug}-{attempt}.log",
                now,
                now,
            )
        )
        if pending:
            _write_atomic(
                self.pods_dir / f"{pod}.json",
                json.dumps(
                    {
                        "name": pod,
                        "workflow": self.plan.name,
                        **_task_fields(task),
                        "template": task.template,
                        "attempt": attempt,
                        "phase": "Failed",
                        "status": "Failed",
                        "exit_code": None,
                        "message": why,
                    }
                ),
            )
        self.why[task.name] = why
        self.say(f"{task.name} attempt {attempt} Failed: {why}")

    def _outputs(self) -> dict[str, dict[str, str]]:
        """Each task's output parameters, from its last attempt."""
        out: dict[str, dict[str, str]] = {}
        for node in self.nodes:
            out[node.task] = node.parameters
        return out

    def _start(self, task: Task, attempt: int) -> None:
        name = task.pod_name(self.plan.name, attempt)
        if task.late_inputs:
            task = dataclasses.replace(task, inputs=resolve_late_inputs(task, self._outputs()))
        if task.suspend:  # no pod: the node succeeds as it starts (Argo's suspend of duration 0)
            now = time.time()
            node = NodeResult(
                task.name,
                task.template,
                attempt,
                name,
                0,
                "Succeeded",
                "",
                self.out / "logs" / f"{task.slug}-{attempt}.log",
                now,
                now,
                inputs=dict(task.inputs),
            )
            self._after(task, node, f"{task.name} Succeeded (suspend, no pod)")
            return
        if (
            task.group in self.unschedulable
        ):  # Pending until the workflow's deadline ends it, as on a full cluster
            self.state[task.name] = "unscheduled"
            _write_atomic(
                self.pods_dir / f"{name}.json",
                json.dumps(
                    {
                        "name": name,
                        "workflow": self.plan.name,
                        **_task_fields(task),
                        "template": task.template,
                        "attempt": attempt,
                        "phase": "Pending",
                    }
                ),
            )
            self.say(f"{task.name} attempt {attempt} Pending (pod {name}): unschedulable")
            return
        ctx = pod_ctx(self.plan, task, name, attempt)
        argv, cenv = argv_env(self.plan, task, ctx)
        grace = pod_grace(task, ctx)
        log_path = self.out / "logs" / f"{task.slug}-{attempt}.log"
        (self.pods_dir / f"{name}.delete").unlink(missing_ok=True)  # stale, from a reused out_dir
        self.state[task.name] = "running"
        started = time.time()
        try:
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    [sys.executable, POD_INIT, *argv],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.cwd,
                    env={**self.base_env, **cenv},
                    start_new_session=True,
                )
        except OSError as exc:  # like a container that cannot start: an Error, subject to the retry policy
            node = NodeResult(
                task.name,
                task.template,
                attempt,
                name,
                -1,
                "Error",
                f"failed to start: {exc}",
                log_path,
                started,
                time.time(),
            )
            self._after(task, node, f"{task.name} attempt {attempt} Error: {node.message}")
            return
        reader = open(log_path, "rb")  # closed when the pod ends
        pod = _Pod(task, attempt, name, proc, log_path, reader, grace, started, time.monotonic())
        self.running[task.name] = pod
        self._record(pod, "Running")
        self.say(f"{task.name} attempt {attempt} Running (pod {name}, pid {proc.pid})")
        if self.chaos is not None and not self._chaos_may(task, attempt):
            self.chaos.unavailable(task.group, self._chaos_open())

    def _record(self, pod: _Pod, phase: str, **extra: Any) -> None:
        _write_atomic(
            self.pods_dir / f"{pod.name}.json",
            json.dumps(
                {
                    "name": pod.name,
                    "workflow": self.plan.name,
                    **_task_fields(pod.task),
                    "template": pod.task.template,
                    "attempt": pod.attempt,
                    "pid": pod.proc.pid,
                    "pgid": pod.proc.pid,
                    "grace_s": pod.grace,
                    "phase": phase,
                    **({"conditions": [KUEUE_CONDITION]} if pod.how == "kueue" else {}),
                    **extra,
                }
            ),
        )

    def _terminate(self, pod: _Pod, status: str, message: str, grace: float | None) -> None:
        """What the kubelet does to a pod being deleted: SIGTERM to the group now, SIGKILL after grace."""
        if pod.forced is None:
            pod.forced = (status, message)
            kill_at = time.monotonic() + (pod.grace if grace is None else grace)
            pod.kill_at = kill_at if pod.kill_at is None else min(pod.kill_at, kill_at)  # the sooner wins
            _killpg(pod.proc.pid, signal.SIGTERM)

    def _end(self, pod: _Pod, how: str) -> None:
        """End a pod as a registry request says (steps/lib/local_pods.py documents each way)."""
        pod.how = how
        self._record(pod, "Running")  # Kueue's TerminationTarget condition comes before its Delete
        if how == "lost-vm":
            self.say(f"{pod.task.name} attempt {pod.attempt}: VM lost, SIGKILL")
            self._kill(pod)
            return
        grace = min(pod.grace, NODE_SHUTDOWN_GRACE_S) if how == "node-shutdown" else pod.grace
        what = {"node-shutdown": "node shutdown", "kueue": "preempted by Kueue", "evict": "evicted"}.get(
            how, "pod deleted"
        )
        self.say(f"{pod.task.name} attempt {pod.attempt}: {what}, SIGTERM (grace {grace:g}s)")
        pod.kill_at = time.monotonic() + grace
        _killpg(pod.proc.pid, signal.SIGTERM)

    def _kill(self, pod: _Pod) -> None:
        pod.sigkilled, pod.kill_at = True, None
        _kill_tree(pod.proc.pid)

    def _tick(self, pod: _Pod) -> None:
        self._read_log(pod)
        if pod.proc.poll() is None:
            now = time.monotonic()
            if pod.forced is None and pod.how is None:
                how = read_request(self.pods_dir, pod.name)
                if how is not None:
                    self._end(pod, how)
                elif now - pod.t0 > _or_inf(pod.task.deadline_s):
                    self._terminate(pod, "Failed", POD_DEADLINE, None)
                elif self.chaos is not None and self._chaos_may(pod.task, pod.attempt):
                    d = self.chaos.due(pod.task.group, now - pod.t0, pod.step, pod.restoring)
                    if d is not None:
                        self.chaos.landed(d, pod.name, pod.attempt, now - self.t0, pod.step)
                        at = (
                            f" at step {pod.step}"
                            if pod.step is not None
                            else " as it restores a checkpoint"
                            if d.trigger == "restore"
                            else f" {now - pod.t0:.2f}s after its start"
                        )
                        self.say(
                            f"chaos {d.index + 1}/{len(self.chaos.deletions)}: deleting {pod.task.name} "
                            f"attempt {pod.attempt}{at}"
                        )
                        self._end(pod, "delete")
            if pod.kill_at is not None and (now >= pod.kill_at or self.hurry):
                why = "second signal" if self.hurry else "grace over"
                self.say(f"{pod.task.name} attempt {pod.attempt}: {why}, SIGKILL")
                self._kill(pod)
            return
        _kill_tree(pod.proc.pid)  # the container is gone, so is everything it started
        self._read_log(pod)
        code = signal_exit(pod.proc.returncode)
        if pod.forced:
            status, message = pod.forced
        elif pod.how == "lost-vm":  # no container terminated: Argo knows no exit code
            status, message, code = "Failed", LOST_VM, -1
        elif pod.how == "node-shutdown":
            status, message = "Failed", NODE_SHUTDOWN
        elif pod.how in GONE_BEFORE_SEEN and not pod.task.kueue_group:  # the pod's own record keeps the
            # container's code (137 if SIGKILLed). A pod of a queued Kueue pod group is not gone: Kueue keeps
            # its finalizer until the whole group finishes, so Argo reads the exit code (the real controllers,
            # docs/cluster-local.md).
            container = EXIT_SIGKILL if pod.sigkilled else code
            self._finish(
                pod, "Error", POD_DELETED, may_retry=not self.aborting, code=-1, container_code=container
            )
            return
        elif pod.how is not None and pod.sigkilled:  # SIGKILLed after its grace: the emissary's 128 + 9
            status, message, code = "Failed", SIGKILLED, EXIT_SIGKILL
        elif pod.proc.returncode == 0:
            status, message = "Succeeded", ""
        else:
            status, message = "Failed", container_error(code)
        self._finish(pod, status, message, may_retry=not self.aborting, code=code)

    def _finish(
        self,
        pod: _Pod,
        status: str,
        message: str,
        may_retry: bool,
        code: int | None = None,
        container_code: int | None = None,
    ) -> None:
        """Record the attempt as Argo's node (`code`: its exit code, -1 if Argo knows none) and the pod as the
        registry shows it (`container_code`: the container's own, what the kubelet wrote; default `code`)."""
        del self.running[pod.task.name]
        pod.reader.close()
        code = signal_exit(pod.proc.returncode) if code is None else code
        node = NodeResult(
            pod.task.name,
            pod.task.template,
            pod.attempt,
            pod.name,
            code,
            status,
            message,
            pod.log_path,
            pod.started,
            time.time(),
        )
        node.parameters = self._read_params(pod)
        if status == "Succeeded":
            try:
                node.artifacts = self._collect(pod)
            except OSError as exc:
                node.status, node.message = "Error", f"failed to save outputs: {exc}"
        phase = "Succeeded" if node.status == "Succeeded" or container_code == 0 else "Failed"  # a pod phase
        self._record(
            pod,
            phase,
            exit_code=code if container_code is None else container_code,
            status=node.status,
            message=node.message,
        )
        if self.chaos is not None:
            self.chaos.ended(
                pod.name, node.status, code if container_code is None else container_code, node.message
            )
        at = f" at step {pod.step}" if pod.step is not None else ""
        detail = at
        if node.status != "Succeeded":
            detail = f": {node.message}{'' if 'exit code' in node.message else f' (exit {code})'}{at}"
        self._after(pod.task, node, f"{pod.task.name} attempt {pod.attempt} {node.status}{detail}", may_retry)

    def _after(self, task: Task, node: NodeResult, line: str, may_retry: bool = True) -> None:
        self.nodes.append(node)
        self._after_state(task, node, line, may_retry)
        if (
            self.chaos is not None
            and self.state[task.name] != "retry"
            and all(  # done for good, the group too
                self.state[n] not in ("pending", "running", "retry")
                for n, t in self.plan.tasks.items()
                if t.group == task.group
            )
        ):
            self.chaos.unavailable(task.group, self._chaos_open())

    def _chaos_may(self, task: Task, attempt: int) -> bool:
        """Whether chaos may delete this attempt: only where a retry would follow (chaos tests that nothing
        is lost, not the retry limit, which is configuration)."""
        r = task.retry
        return r is not None and (r.limit is None or attempt < r.limit)

    def _chaos_open(self) -> list[str]:
        """Tasks that can still take a chaos deletion: not finished, and their next attempt may be deleted."""
        out = []
        for name, st in self.state.items():
            task = self.plan.tasks[name]
            attempt = self.running[name].attempt if name in self.running else self.next_attempt[name]
            if (
                st in ("pending", "running", "retry")
                and self._chaos_may(task, attempt)
                and not self.aborting
                and task.group not in out
            ):
                out.append(task.group)
        return out

    def _after_state(self, task: Task, node: NodeResult, line: str, may_retry: bool) -> None:
        if node.status == "Succeeded":
            self.state[task.name] = "succeeded"
            self.say(line)
            return
        retry, why = (
            self._should_retry(task, node)
            if may_retry
            else (False, RETRY_DEADLINE if self.deadline_hit else "workflow stopping")
        )
        if retry:
            limit = "unlimited" if task.retry.limit is None else task.retry.limit
            self.say(f"{line} -> retrying ({node.attempt + 1}/{limit})")
            # no backoff: the main loop starts it on its next pass
            self.state[task.name], self.next_attempt[task.name] = "retry", node.attempt + 1
        elif node.status in task.continue_on:
            self.say(
                f"{line} -> task failed" + (f" ({why})" if why else "") + "; continueOn: its dependents run"
            )
            self.state[task.name] = "continued"
        else:
            self.say(f"{line} -> task failed" + (f" ({why})" if why else ""))
            self.state[task.name], self.why[task.name] = "failed", why

    @staticmethod
    def _should_retry(task: Task, node: NodeResult) -> tuple[bool, str]:
        r = task.retry
        if r is None:
            return False, ""
        if r.limit is not None and node.attempt >= r.limit:
            return False, f"{NO_MORE_RETRIES} (limit {r.limit})"
        if node.status not in POLICY_RETRIES[r.policy]:
            return False, f"retryPolicy {r.policy} does not retry {node.status}"
        if r.expr is not None:
            dur = node.finished - node.started
            env = {
                "lastRetry.exitCode": str(node.exit_code),
                "lastRetry.status": node.status,
                "lastRetry.message": node.message,
                "lastRetry.duration": str(int(dur)) if dur.is_integer() else repr(dur),
            }
            try:
                if not r.expr.evaluate(env):
                    return False, "retryStrategy.expression evaluated to false"
            except argo_expr.ExprError as exc:
                return False, f"retryStrategy.expression failed: {exc}"
        return True, ""

    def _read_params(self, pod: _Pod) -> dict[str, str]:
        ctx = pod_ctx(self.plan, pod.task, pod.name, pod.attempt)
        out: dict[str, str] = {}
        for name, (src, default) in out_params(pod.task, ctx).items():
            srcp = self.cwd / src
            if srcp.is_file():
                out[name] = srcp.read_text().strip()
            elif default is not None:
                out[name] = default
        return out

    def _collect(self, pod: _Pod) -> dict[str, Path]:
        out: dict[str, Path] = {}
        ctx = pod_ctx(self.plan, pod.task, pod.name, pod.attempt)
        for name, src in artifact_paths(pod.task, ctx).items():
            srcp = self.cwd / src  # an absolute src stays absolute
            dest = self.out / "artifacts" / pod.task.slug / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.is_dir():
                shutil.rmtree(dest)
            if srcp.is_dir():
                shutil.copytree(srcp, dest)
            elif srcp.is_file():
                shutil.copy2(srcp, dest)
            else:
                raise FileNotFoundError(f"output artifact {name!r}: {src} does not exist")
            out[name] = dest
        return out

    def _read_log(self, pod: _Pod) -> None:
        data = pod.reader.read(1 << 20)
        if not data:
            return
        lines = (pod.partial + data).split(b"\n")
        pod.partial = lines.pop()[-65536:]
        for line in lines:
            line = line.strip()
            if not line.startswith(b"{") or b'"event"' not in line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            if isinstance(rec.get("total_steps"), int):
                pod.total = rec["total_steps"]
            if rec.get("event") == "step" and isinstance(rec.get("step"), int):
                pod.step, pod.restoring = rec["step"], False
            elif rec.get("event") == "restore":
                pod.restoring = True
            elif rec.get("event") == "resume" and isinstance(rec.get("from_step"), int):
                pod.restoring = False
                self.say(f"{pod.task.name} attempt {pod.attempt} resumed from step {rec['from_step']}")
        now = time.monotonic()
        last = self.last_step_line.get(pod.task.name, -1e9)
        if pod.step != pod.shown_step and now - last >= STEP_PROGRESS_EVERY_S:
            pod.shown_step, self.last_step_line[pod.task.name] = pod.step, now
            total = f"/{pod.total}" if pod.total else ""
            self.say(f"{pod.task.name} attempt {pod.attempt} step {pod.step}{total}")

    def _write_nodes(self) -> None:
        rows = [
            {
                **asdict(n),
                "log_path": str(n.log_path),
                "artifacts": {k: str(v) for k, v in n.artifacts.items()},
                "parameters": n.parameters,
            }
            for n in self.nodes
        ]
        doc = {"workflow": self.plan.name, "nodes": rows}
        _write_atomic(self.out / "nodes.json", json.dumps(doc, indent=1))


def _task_fields(task: Task) -> dict[str, Any]:
    """A pod's task in the registry: the DAG task as written (a group's name), and its withSequence item."""
    return {"task": task.group, **({"item": task.item, "node": task.name} if task.item is not None else {})}


def _or_inf(seconds: float | None) -> float:
    return float("inf") if seconds is None else seconds


def _kill_tree(pid: int) -> None:
    """SIGKILL a pod: everything below its PID 1 (pod_init, a subreaper: orphans stay below it), then it."""
    kill_descendants(pid)
    _killpg(pid, signal.SIGKILL)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the whole group has already exited


def run_workflow(
    spec: dict,
    out_dir: Path,
    params: dict[str, str] | None = None,
    *,
    progress: TextIO | None = sys.stderr,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    chaos: Chaos | None = None,
    unschedulable: frozenset[str] = frozenset(),
) -> RunResult:
    """Validate ``spec`` (raising ``UnsupportedSpec`` before anything runs), then run it to the end,
    deleting pods as ``chaos`` plans (its tasks must be the spec's). The pods of the tasks named in
    ``unschedulable`` stay Pending (a cluster with no room for them) until the workflow's deadline."""
    plan = build_plan(spec, params)
    groups = {t.group for t in plan.tasks.values()}
    if chaos is not None:
        unknown = sorted(set(chaos.tasks) - groups)
        if unknown:
            raise UnsupportedSpec(f"chaos: no task named {', '.join(unknown)}")
    unknown = sorted(set(unschedulable) - groups)
    if unknown:
        raise UnsupportedSpec(f"unschedulable: no task named {', '.join(unknown)}")
    return _Runner(
        plan,
        Path(out_dir),
        progress,
        Path(cwd) if cwd else Path.cwd(),
        dict(env or {}),
        chaos,
        frozenset(unschedulable),
    ).run()
