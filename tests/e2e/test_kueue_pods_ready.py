"""Kueue's waitForPodsReady on the real controller (v0.19.2), as docs/cluster.md describes it for the drill.

Kueue here runs with waitForPodsReady's timeout and recoveryTimeout at PODS_READY_S seconds (`up --kueue
--kueue-pods-ready-timeout`). A pod group admitted whose pods are not all Ready in that time is evicted
whole (reason `PodsReadyTimeout`) and its pods deleted, the running one included: what a drill's group
meets when a replacement cannot start in time (a Spot VM that does not come, an image that does not pull).
The control is the same group with every pod schedulable: PodsReady, never evicted. Skipped when the
cluster or Kueue is not built.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from infra.local.kueue import why_not_built
from steps.lib.contract import POD_GROUP_COUNT, POD_GROUP_LABEL, QUEUE_LABEL
from tests.e2e.conftest import PODS_READY_S
from tests.e2e.localcluster import Local, wait, why_skip

_SKIP = why_skip() or (
    f"Kueue not built (make cluster-build-kueue): {why_not_built()}" if why_not_built() else ""
)
pytestmark = [pytest.mark.skipif(bool(_SKIP), reason=_SKIP), pytest.mark.slow, pytest.mark.e2e]


def _group(cluster: Local, group: str, unschedulable: set[int]) -> list[str]:
    """Two pods of one Kueue pod group in queue baton; those in `unschedulable` ask for a node label that no
    node has, so the scheduler leaves them Pending once Kueue ungates them."""
    names = []
    for i in range(2):
        spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "hostNetwork": True,
            "containers": [
                {
                    "name": "c",
                    "image": "baton:local",
                    "command": ["sleep", "600"],
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                }
            ],
        }
        if i in unschedulable:
            spec["nodeSelector"] = {"baton.dev/nowhere": "true"}
        name = f"{group}-{i}"
        cluster.kubectl(
            "create",
            "-f",
            "-",
            stdin=json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": name,
                        "namespace": "baton",
                        "labels": {QUEUE_LABEL: "baton", POD_GROUP_LABEL: group},
                        "annotations": {POD_GROUP_COUNT: "2"},
                    },
                    "spec": spec,
                }
            ),
        )
        names.append(name)
    return names


def _conditions(cluster: Local, workload: str) -> dict[str, tuple[str, str]]:
    w = json.loads(cluster.kubectl("get", "workload", workload, "-o", "json", check=False) or "{}")
    return {c["type"]: (c["status"], c.get("reason", "")) for c in w.get("status", {}).get("conditions", [])}


def _cleanup(cluster: Local, names: list[str], group: str) -> None:
    cluster.kubectl("delete", "pod", *names, "--ignore-not-found", "--wait=false", check=False)
    cluster.kubectl("delete", "workload", group, "--ignore-not-found", "--wait=false", check=False)


def test_a_group_with_a_pod_never_ready_is_evicted_whole_and_its_pods_deleted(kueue_quick_ready: Local):
    k = kueue_quick_ready
    names = _group(k, "ready-never", unschedulable={1})
    try:
        wait(
            lambda: _conditions(k, "ready-never").get("QuotaReserved", ("",))[0] == "True",
            60,
            "the group admitted",
        )
        t0 = time.monotonic()
        wait(
            lambda: k.get("pod", names[0]).get("status", {}).get("phase") == "Running",
            60,
            "the schedulable pod running",
        )
        wait(
            lambda: _conditions(k, "ready-never").get("Evicted", ("",))[0] == "True",
            PODS_READY_S + 90,
            "the group evicted by waitForPodsReady",
        )
        evicted_after = time.monotonic() - t0
        conds = _conditions(k, "ready-never")
        print(
            f"\n[e2e] ready-never evicted {evicted_after:.0f} s after its running pod started "
            f"(timeout {PODS_READY_S} s): {json.dumps(conds)}"
        )
        assert conds["Evicted"] == ("True", "PodsReadyTimeout"), conds
        assert conds.get("PodsReady", ("",))[0] != "True", conds

        def deleted(name: str) -> bool:
            pod = json.loads(k.kubectl("get", "pod", name, "-o", "json", check=False) or "{}")
            return not pod or pod["metadata"].get("deletionTimestamp") is not None

        # The whole group goes: the pod that was Running too (a drill's every item then spends a retry).
        wait(lambda: all(deleted(n) for n in names), 60, "both pods of the evicted group deleted")
    finally:
        _cleanup(k, names, "ready-never")


def test_control_a_group_whose_pods_all_run_is_ready_and_not_evicted(kueue_quick_ready: Local):
    k = kueue_quick_ready
    names = _group(k, "ready-ok", unschedulable=set())
    try:
        wait(
            lambda: _conditions(k, "ready-ok").get("PodsReady", ("",))[0] == "True", 90, "the group PodsReady"
        )
        time.sleep(PODS_READY_S + 10)  # past the timeout: it must not fire on a group that was ready
        conds = _conditions(k, "ready-ok")
        print(f"\n[e2e] ready-ok after {PODS_READY_S + 10} s: {json.dumps(conds)}")
        assert conds.get("Evicted", ("False",))[0] != "True", conds
        assert all(k.get("pod", n)["status"]["phase"] == "Running" for n in names)
    finally:
        _cleanup(k, names, "ready-ok")
