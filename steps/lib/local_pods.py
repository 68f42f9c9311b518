"""The local pod registry: how a step asks the local runner to end a pod, and sees pods as the
Kubernetes API would show them. This side (the steps') owns the protocol; `workflows/local/runner.py`
implements it, so a step never imports the runner and runs the same under Argo and locally.

    BATON_LOCAL_PODS=<folder>     set by the local runner in every pod's environment
    <folder>/<pod>.json           the runner's record of each pod (written atomically): name, workflow,
                                  task, template, attempt, pid, grace_s, phase (Running, Succeeded, Failed),
                                  and once ended exit_code, status, message; conditions (e.g. Kueue's
                                  TerminationTarget) while it is being ended
    <folder>/<pod>.delete         a request to end the pod: {"how": HOW, "requested": unix time}

How a pod ends (`HOW`), and what the runner then records, as Argo v3.7 records it (the record's
`exit_code` is the container's own, as the pod's last status shows it; `status` and `message` are Argo's):
    evict, delete   SIGTERM, SIGKILL after the pod's grace (exit 137); Argo's node is an Error "pod
                    deleted" with no exit code, whatever the process did: the pod object is gone before
                    the controller reads its final status (seen on the real controller,
                    docs/cluster-local.md)
    kueue           SIGTERM, SIGKILL after the pod's grace, after the condition TerminationTarget=True
                    (WorkloadEvictedDueToPreempted); then as evict: Kueue's finalizer goes as soon as the
                    pod has terminated, and the real controllers recorded "pod deleted" with no exit
                    code (docs/cluster-local.md, "Kueue on the local cluster")
    node-shutdown   a GKE Spot node's graceful shutdown: SIGTERM, SIGKILL after min(grace, 15 s);
                    Failed "Pod was terminated in response to imminent node shutdown."
    lost-vm         a VM lost without a graceful shutdown: SIGKILL at once, exit -1,
                    Failed "pod failed: neither main nor wait container completed successfully"
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from steps.lib.contract import EVICTION_MODES

ENV = "BATON_LOCAL_PODS"
HOW = EVICTION_MODES  # steps/lib/contract.py
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # pod names are file names here


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def request_deletion(folder: Path | str, pod: str, how: str = "delete") -> None:
    """End a local pod, as `kubectl delete pod` (or the Eviction API, a node shutdown, a lost VM, Kueue)
    would; FileNotFoundError if there is no such pod (a 404)."""
    if how not in HOW:
        raise ValueError(f"how must be one of {', '.join(HOW)}, got {how!r}")
    folder = Path(folder)
    if not NAME.match(pod) or not (folder / f"{pod}.json").exists():
        raise FileNotFoundError(f"no local pod {pod!r} in {folder}")
    write_atomic(folder / f"{pod}.delete", json.dumps({"how": how, "requested": time.time()}))


def read_request(folder: Path | str, pod: str) -> str | None:
    """The `how` of a pending request to end `pod`, or None."""
    try:
        req = json.loads((Path(folder) / f"{pod}.delete").read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError):
        return "delete"  # being written, or by hand: a plain deletion
    how = req.get("how", "delete") if isinstance(req, dict) else "delete"
    return how if how in HOW else "delete"


def read_pod(folder: Path | str, pod: str) -> dict[str, Any] | None:
    try:
        return json.loads((Path(folder) / f"{pod}.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def list_pods(folder: Path | str) -> list[dict[str, Any]]:
    """The registry records (`phase` is Running while the pod runs), sorted by pod name."""
    out = []
    for p in sorted(Path(folder).glob("*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError):
            continue  # being replaced right now; the next read sees it
    return out


class LocalPods:
    """A workflow task's pods in the registry: steps.evict's local backend (its cluster one is the API)."""

    def __init__(self, folder: str | Path, workflow: str, task: str) -> None:
        self.folder, self.workflow, self.task = Path(folder), workflow, task

    def _mine(self) -> list[dict[str, Any]]:
        return [
            p
            for p in list_pods(self.folder)
            if p.get("task") == self.task and (not self.workflow or p.get("workflow") == self.workflow)
        ]

    def running(self, node: int | None = None) -> str | None:
        """A running pod of the task; with `node`, of that node of the group (its withSequence item)."""
        for pod in self._mine():
            if pod.get("phase") == "Running" and (node is None or pod.get("item") == str(node)):
                return pod["name"]
        return None

    def alive(self) -> bool:
        """Whether the task has a pod that is running or about to: between a failed attempt and its retry
        there is none for a moment, after a failure that is not retried there is none for good."""
        return any(p.get("phase") in ("Pending", "Running") for p in self._mine())

    def evict(self, name: str, how: str = "evict") -> None:
        request_deletion(self.folder, name, how)

    def gone(self, name: str) -> bool:
        pod = read_pod(self.folder, name)
        return pod is None or pod.get("phase") != "Running"

    def ended(self, name: str) -> dict[str, Any]:
        """How the pod ended, as the runner recorded it (Argo's node status and message)."""
        pod = read_pod(self.folder, name) or {}
        return {k: pod.get(k) for k in ("phase", "status", "exit_code", "message")}
