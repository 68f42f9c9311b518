"""A drill at nodes=2 queued by the real Kueue (v0.19.2): its training pods are Kueue pod groups, one per role.

Kueue finishes a group's Workload only when all its pods succeed, or when none is active and one carries
`kueue.x-k8s.io/retriable-in-group: "false"` (pod_controller.go, Finished). So a nodes=2 drill that fails
leaves its groups' quota held for ever, unless its exit handler (steps/release.py) marks them. The control
submits the same failing drill without the handler and sees the quota still held after it ended; then the
release, run by hand, frees it. Skipped when the cluster or Kueue is not built.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from steps.lib.contract import POD_GROUP_LABEL, RELEASE_TEMPLATE
from tests.e2e.localcluster import REPO, Local
from tests.e2e.localcluster import cond as _cond
from tests.e2e.localcluster import wait as _wait
from tests.e2e.test_drill_real_argo import _describe
from tests.e2e.test_kueue_real import _SKIP, _pods, _usage, admits_most_of_the_quota

pytestmark = [pytest.mark.skipif(bool(_SKIP), reason=_SKIP), pytest.mark.slow, pytest.mark.e2e]

OVERLAYS = REPO / "templates" / "overlays"
# Six trainers run at once at nodes=2 (three roles, two nodes each), and evict beside them: 6 x 250m + 100m
# fills baton-local's 1600m exactly, so all three groups are admitted together.
REQUESTS = {
    "train": ("250m", "512Mi"),
    "trial": ("250m", "512Mi"),
    "evict": ("100m", "128Mi"),
    "verify": ("100m", "128Mi"),
    "compare": ("100m", "128Mi"),
}
# A trainer that fails at once, with exit 1 (its config is not there): no retry, every group fails.
KUEUE_FINALIZER = "kueue.x-k8s.io/managed"  # pod_controller's PodFinalizer (constants.ManagedByKueueLabelKey)
FAILING = ["-p", "config=trainer/configs/missing.yaml", "-p", "total_steps=40", "-p", "evictions=1"]


def grouped_drill(tmp: Path, *params: str) -> dict[str, Any]:
    """The local-kueue overlay's drill rendered at nodes=2: the CronWorkflow that `render -p nodes=2 -p
    queue=baton` gives, through the local and local-kueue overlays' own patches (same parameter and template
    positions at every node count), with requests that fit six trainers in baton-local."""
    render = subprocess.run(
        [sys.executable, "workflows/equivalence.py", "render", "-p", "nodes=2", "-p", "queue=baton", *params],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    cron = next(d for d in yaml.safe_load_all(render.stdout) if d and d["kind"] == "CronWorkflow")
    (tmp / "cron.yaml").write_text(yaml.safe_dump(cron))
    shutil.copy(OVERLAYS / "local" / "drill.yaml", tmp / "local.yaml")
    shutil.copy(OVERLAYS / "local-kueue" / "drill.yaml", tmp / "kueue.yaml")
    target = {"group": "argoproj.io", "kind": "CronWorkflow", "name": cron["metadata"]["name"]}
    (tmp / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["cron.yaml"],
                "patches": [
                    {"path": "local.yaml", "target": target},
                    {"path": "kueue.yaml", "target": target},
                ],
            }
        )
    )
    out = subprocess.run(
        ["kubectl", "kustomize", str(tmp)], capture_output=True, text=True, check=True
    ).stdout
    spec = yaml.safe_load(out)["spec"]["workflowSpec"]
    for t in spec["templates"]:
        if t["name"] in REQUESTS:
            cpu, mem = REQUESTS[t["name"]]
            t["container"]["resources"] = {"requests": {"cpu": cpu, "memory": mem}}
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "baton-equivalence-", "namespace": "baton"},
        "spec": spec,
    }


def _submit(cluster: Local, wf: dict[str, Any]) -> str:
    """Submit `wf` as a user does (`equivalence.py submit`, which adds the release handler with the queue);
    its name."""
    r = subprocess.run(
        [sys.executable, "workflows/equivalence.py", "submit", "--from-file", "-"],
        input=yaml.safe_dump(wf),
        cwd=REPO,
        env=cluster.user_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.split()[0]


def _handler_pods(wf: dict[str, Any]) -> list[dict[str, Any]]:
    """The release handler's pod nodes of a finished workflow, in Argo's order."""
    return [
        n
        for n in wf["status"]["nodes"].values()
        if n.get("templateName") == RELEASE_TEMPLATE and n.get("type") == "Pod"
    ]


def _group_workloads(cluster: Local, wf: str) -> dict[str, dict[str, Any]]:
    """This workflow's pod-group Workloads, by group name (Kueue names a group's Workload after the group)."""
    items = json.loads(cluster.kubectl("get", "workloads", "-o", "json"))["items"]
    return {w["metadata"]["name"]: w for w in items if w["metadata"]["name"].startswith(f"{wf}-")}


def _ended(cluster: Local, name: str, timeout: float = 600) -> dict[str, Any]:
    t0 = time.monotonic()
    while True:
        wf = cluster.get("workflow", name)
        if wf.get("status", {}).get("phase") in ("Succeeded", "Failed", "Error"):
            return wf
        assert time.monotonic() - t0 < timeout, f"{name} not finished after {timeout:.0f} s"
        time.sleep(3)


def _free(cluster: Local) -> bool:
    adm, res, used = _usage(cluster)
    return adm == 0 and res == 0 and all(v in ("0", 0) for v in used.values())


def _finalizers(cluster: Local, wf: str) -> dict[str, list[str]]:
    return {
        p["metadata"]["name"]: p["metadata"].get("finalizers", [])
        for p in _pods(cluster, wf)
        if POD_GROUP_LABEL in p["metadata"].get("labels", {})
    }


def test_a_failed_grouped_drill_holds_its_quota_without_the_release_and_the_release_frees_it(
    kueue: Local, tmp_path: Path
):
    """The control for the next test: the failing drill without its exit handler. Its groups stay admitted
    after the workflow failed (what docs/multinode.md calls the leak); `python -m steps.release` by hand, as
    after an `argo terminate`, then frees them and Kueue removes the pods' finalizers."""
    wf = grouped_drill(tmp_path, *FAILING)
    assert wf["spec"]["onExit"] == RELEASE_TEMPLATE
    del wf["spec"]["onExit"]
    wf["spec"]["templates"] = [t for t in wf["spec"]["templates"] if t["name"] != RELEASE_TEMPLATE]
    name = json.loads(kueue.kubectl("create", "-o", "json", "-f", "-", stdin=json.dumps(wf)))["metadata"][
        "name"
    ]
    try:
        done = _ended(kueue, name)
        assert done["status"]["phase"] == "Failed", done["status"].get("message")
        groups = _group_workloads(kueue, name)
        print(
            f"\n[e2e] {name} failed; its groups' Workloads: "
            + json.dumps({g: (_cond(w, "QuotaReserved"), _cond(w, "Finished")) for g, w in groups.items()})
        )
        assert {g.rsplit("-", 1)[1] for g in groups} >= {"reference", "replay", "trial"}, sorted(groups)
        # Held: nothing is left that could finish them. Sampled for 30 s after the workflow ended.
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            assert not _free(kueue), (
                "the quota was freed without the release: the leak this guards against is gone"
            )
            time.sleep(3)
        held = {g: _cond(w, "Finished") for g, w in _group_workloads(kueue, name).items()}
        assert all(v != "True" for v in held.values()), held
        kept = _finalizers(kueue, name)
        assert any(KUEUE_FINALIZER in f for f in kept.values()), kept
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "steps.release",
                "--workflow",
                name,
                "--kubeconfig",
                str(kueue.state / "admin.kubeconfig"),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        record = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"[e2e] release by hand: {record}")
        assert record["marked"] >= 6 and len(record["groups"]) == 3, record
        _wait(lambda: _free(kueue), 120, "baton-local's quota free after the release")
        _wait(
            lambda: not any(_finalizers(kueue, name).values()), 60, "Kueue's finalizers off the group's pods"
        )
    finally:
        kueue.kubectl("delete", "workflow", name, "--ignore-not-found", "--wait=false", check=False)


def test_a_failed_grouped_drill_frees_its_quota_through_its_exit_handler(kueue: Local, tmp_path: Path):
    """The same failing drill, submitted as a user would (its exit handler added with the queue): once it
    failed, the handler ran and baton-local holds nothing; a pod that needs most of the quota is admitted."""
    _wait(lambda: _free(kueue), 120, "baton-local free before the drill")
    wf = grouped_drill(tmp_path, *FAILING)
    name = _submit(kueue, wf)
    try:
        done = _ended(kueue, name)
        assert done["status"]["phase"] == "Failed", done["status"].get("message")
        handler = _handler_pods(done)
        print(
            f"\n[e2e] {name} failed; its release handler: "
            + json.dumps([(n["displayName"], n["phase"], n.get("message")) for n in handler])
        )
        assert handler and handler[-1]["phase"] == "Succeeded", handler
        _wait(lambda: _free(kueue), 120, "baton-local's quota free after the drill's exit handler")
        admits_most_of_the_quota(kueue, "kueue-after-groups")
    finally:
        kueue.kubectl("delete", "workflow", name, "--ignore-not-found", "--wait=false", check=False)


# A drill past its deadline: long enough for the three groups to be admitted and train on this machine.
DEADLINE_S = 150


@pytest.mark.parametrize("end", ["stop", "deadline"])
def test_a_stopped_or_deadlined_grouped_drill_frees_its_quota_through_its_exit_handler(
    kueue: Local, tmp_path: Path, end: str
):
    """A drill that ends while its groups train: stopped (`argo stop`: spec.shutdown=Stop, which runs exit
    handlers), or past its deadline (`-p deadline`: Argo fails what runs and still runs the exit handler,
    workflowpod.go: "ignore the workflow deadline for exit handler"). The handler marks the groups, and
    baton-local holds nothing afterwards. The control is the first test: a group whose pods all ended is
    still held without the handler."""
    _wait(lambda: _free(kueue), 120, "baton-local free before the drill")
    extra = ["-p", f"deadline={DEADLINE_S}"] if end == "deadline" else []
    wf = grouped_drill(tmp_path, "-p", "total_steps=2000", "-p", "evictions=1", *extra)
    if end == "deadline":
        assert wf["spec"]["activeDeadlineSeconds"] == DEADLINE_S
    name = _submit(kueue, wf)
    try:

        def training() -> bool:
            groups = _group_workloads(kueue, name)
            running = [
                p
                for p in _pods(kueue, name)
                if POD_GROUP_LABEL in p["metadata"].get("labels", {})
                and p["status"].get("phase") == "Running"
            ]
            return (
                len(groups) == 3
                and all(_cond(w, "Admitted") == "True" for w in groups.values())
                and len(running) >= 4
            )

        _wait(
            training,
            DEADLINE_S - 10 if end == "deadline" else 300,
            "the three groups admitted and their pods running",
        )
        if end == "stop":
            kueue.kubectl("patch", "workflow", name, "--type=merge", "-p", '{"spec": {"shutdown": "Stop"}}')
        else:
            assert not _free(kueue), "the groups hold quota while they train"
        done = _ended(kueue, name)
        handler = _handler_pods(done)
        print(
            f"\n[e2e] {name} ({end}): {done['status']['phase']}: {done['status'].get('message')}; its release "
            "handler: " + json.dumps([(n["displayName"], n["phase"], n.get("message")) for n in handler])
        )
        assert done["status"]["phase"] in ("Failed", "Error"), done["status"]
        if end == "deadline":  # ended by the deadline, not by something else that went wrong
            said = {
                n["displayName"]: n.get("message")
                for n in done["status"]["nodes"].values()
                if "deadline" in (n.get("message") or "").lower()
            }
            print(f"[e2e] nodes that name the deadline: {json.dumps(said)}")
            assert said, {n["displayName"]: n.get("message") for n in done["status"]["nodes"].values()}
        assert handler and handler[-1]["phase"] == "Succeeded", handler
        _wait(lambda: _free(kueue), 180, f"baton-local's quota free after the {end} drill's exit handler")
        _wait(
            lambda: not any(_finalizers(kueue, name).values()), 60, "Kueue's finalizers off the group's pods"
        )
    finally:
        kueue.kubectl("delete", "workflow", name, "--ignore-not-found", "--wait=false", check=False)


def test_a_grouped_drill_passes_with_each_node_evicted_once(kueue: Local, tmp_path: Path):
    """nodes=2, two evictions drawn under seed 0 (node 1, then node 0: steps.evict.eviction_nodes): each item
    of the trial's group loses one attempt to an eviction and comes back as a replacement in the same admitted
    Workload; every tensor is equal (compare passes), nothing is replayed, and the quota is free after."""
    from steps.evict import eviction_nodes

    assert eviction_nodes(2, 2, seed=0) == [1, 0]
    _wait(lambda: _free(kueue), 120, "baton-local free before the drill")
    wf = grouped_drill(tmp_path, "-p", "total_steps=48", "-p", "evictions=2", "-p", "seed=0")
    name = _submit(kueue, wf)
    t0 = time.monotonic()
    try:
        trial_workloads: dict[str, Any] = {}

        def ended() -> bool:
            trial_workloads.update(
                {k: v for k, v in _group_workloads(kueue, name).items() if k.endswith("-trial")}
            )
            return kueue.get("workflow", name).get("status", {}).get("phase") in (
                "Succeeded",
                "Failed",
                "Error",
            )

        _wait(ended, 1200, f"{name} ended", every=3)
        done = kueue.get("workflow", name)
        nodes = done["status"]["nodes"]
        items = {
            n["displayName"]: [
                (nodes[c]["phase"], nodes[c].get("message"), (nodes[c].get("outputs") or {}).get("exitCode"))
                for c in n.get("children", [])
            ]
            for n in nodes.values()
            if n.get("type") == "Retry" and n["displayName"].startswith("trial(")
        }
        compare = next(
            (
                n
                for n in nodes.values()
                if n.get("type") == "Pod"
                and n["displayName"].startswith("compare")
                and n.get("phase") == "Succeeded"
            ),
            {},
        )
        outs = {p["name"]: p.get("value") for p in (compare.get("outputs") or {}).get("parameters", [])}
        print(
            f"\n[e2e] grouped drill {name}: {done['status']['phase']} after {time.monotonic() - t0:.0f} s; "
            f"trial items {json.dumps(items)}; compare {json.dumps(outs)}; trial Workloads "
            f"{sorted(trial_workloads)}"
        )
        assert done["status"]["phase"] == "Succeeded", _describe(done, kueue.user_env())
        assert outs.get("preemptions") == "2" and outs.get("replayed_steps") == "0", outs
        assert set(items) == {"trial(0:0)", "trial(1:1)"}, items
        for item, attempts in items.items():  # each node: its eviction, its peer's 75, the finish
            assert len(attempts) == 3 and attempts[-1][0] == "Succeeded", (item, attempts)
        # One Workload for the trial's group across all its retries: the replacements joined it.
        assert list(trial_workloads) == [f"{name}-trial"], sorted(trial_workloads)
        _wait(lambda: _free(kueue), 120, "baton-local's quota free after the drill passed")
    finally:
        kueue.kubectl("delete", "workflow", name, "--ignore-not-found", "--wait=false", check=False)
