"""Everything a user applies or submits, judged by the real API server of the local cluster: a server-side dry
run (`kubectl apply --dry-run=server --validate=strict`, `create` for a Workflow's generateName), which runs
defaulting, the CRDs' structural schemas with strict field validation, CEL rules, built-in types' validation
and admission, Kueue's webhooks included, and stores nothing.

What is judged: every overlay as its generator builds it (gke and gke-kueue with the cluster values that
infra/scripts/cluster_overlay.py writes from a recorded Terraform output, tests/overlays.py), the drill's
Workflow and nightly CronWorkflow as `render` writes them for each target and at two nodes, and Argo's install
manifest that make gke-up and make e2e-kind apply. With the CRDs of the pinned Argo (full, as `cluster up`
installs them), Kueue (running, with its webhooks) and JobSet installed. The control: a misspelled key under a
retry strategy is refused, naming the field.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.localcluster import REPO, Local
from tests.overlays import generated_templates
from workflows import equivalence as eq
from workflows import targets

OVERLAYS = ("gke", "gke-kueue", "kind", "local", "local-kueue")


def _kubectl(cluster: Local, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(cluster.state / "admin.kubeconfig"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def refusal(cluster: Local, obj: dict[str, Any], namespace: str = "baton") -> str | None:
    """None when the API server accepts `obj` in a dry run, else its answer. `-n` only for an object that names no
    namespace (kubectl refuses one that disagrees; a cluster-scoped object ignores it)."""
    verb = "create" if obj.get("metadata", {}).get("generateName") else "apply"
    ns = [] if obj.get("metadata", {}).get("namespace") else ["-n", namespace]
    r = _kubectl(
        cluster,
        verb,
        *ns,
        "--dry-run=server",
        "--validate=strict",
        "-o",
        "name",
        "-f",
        "-",
        stdin=json.dumps(obj),
    )
    if r.returncode == 0:
        return None
    why = " ".join(r.stderr.split())  # an apply's refusal quotes the whole patch: keep its two ends
    return why if len(why) <= 700 else f"{why[:200]} ... {why[-500:]}"


def _name(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata", {})
    return f"{obj.get('kind')}/{meta.get('name') or meta.get('generateName')}"


def judged(cluster: Local, objs: list[dict[str, Any]], namespace: str = "baton") -> None:
    assert objs
    refused = [f"{_name(o)}: {why}" for o in objs if (why := refusal(cluster, o, namespace))]
    assert not refused, "the API server refused:\n" + "\n".join(refused)


@pytest.fixture(scope="module")
def server(kueue: Local) -> Local:
    """The session's cluster with Kueue running, JobSet's CRDs, and namespace argo (Argo's install manifest's)."""
    from infra.local.kueue import kueue_dir

    crds = kueue_dir() / "jobset-crds"
    r = _kubectl(kueue, "apply", "--server-side", "--force-conflicts", "-f", str(crds))
    assert r.returncode == 0, r.stderr
    # A CRD applied a moment ago may have no status yet, which `kubectl wait` takes for an error: ask again.
    deadline = time.monotonic() + 60
    while (
        r := _kubectl(kueue, "wait", "--for=condition=Established", "--timeout=60s", "-f", str(crds))
    ).returncode:
        assert "status.conditions accessor error" in r.stderr and time.monotonic() < deadline, r.stderr
        time.sleep(1)
    if _kubectl(kueue, "get", "namespace", "argo").returncode != 0:
        assert _kubectl(kueue, "create", "namespace", "argo").returncode == 0
    return kueue


def _kustomized(overlay: str) -> list[dict[str, Any]]:
    built = subprocess.run(
        ["kubectl", "kustomize", str(generated_templates() / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [d for d in yaml.safe_load_all(built.stdout) if d]


def _rendered(target: str | None, nodes: int) -> list[dict[str, Any]]:
    """`render --target TARGET -p nodes=N`, in this process, with the gke overlays' generated values."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(targets, "TEMPLATES", generated_templates())
        mp.setattr(targets, "OVERLAYS", generated_templates() / "overlays")
        return eq.rendered_for(target, nodes)


KUEUE_KINDS = ("LocalQueue", "ClusterQueue", "ResourceFlavor")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_of_each_overlay_is_accepted(server: Local, overlay: str):
    objs = _kustomized(overlay)
    assert {"ServiceAccount", "CronWorkflow", "ConfigMap"} <= {o["kind"] for o in objs}, [
        o["kind"] for o in objs
    ]
    # Judged as a cluster of that kind would first get them: the session's Kueue objects are the local-kueue
    # overlay's, and gke-kueue's LocalQueue `baton` names another ClusterQueue, a field Kueue keeps immutable (the
    # dry run refused it as a change to the local one). The kueue fixture applies its own again when next entered.
    for o in objs:
        if o["kind"] in KUEUE_KINDS:
            ns = ["-n", o["metadata"]["namespace"]] if o["metadata"].get("namespace") else []
            assert (
                _kubectl(
                    server,
                    "delete",
                    o["kind"].lower(),
                    o["metadata"]["name"],
                    *ns,
                    "--ignore-not-found",
                    "--wait=true",
                ).returncode
                == 0
            )
    judged(server, objs)


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("target", [None, *OVERLAYS])
def test_the_rendered_workflow_and_cronworkflow_are_accepted_for_each_target(
    server: Local, target: str | None, nodes: int
):
    objs = _rendered(target, nodes)
    assert [o["kind"] for o in objs] == ["Workflow", "CronWorkflow"]
    judged(server, objs)


def test_argos_install_manifest_is_accepted(server: Local):
    objs = [d for d in yaml.safe_load_all((REPO / "infra" / "argo" / "install.yaml").read_text()) if d]
    assert len(objs) == 24, len(objs)
    judged(server, objs, namespace="argo")


def test_a_misspelled_key_under_a_retry_strategy_is_refused_naming_the_field(server: Local):
    wf, _ = _rendered("local", 1)
    bad = copy.deepcopy(wf)
    trial = next(t for t in bad["spec"]["templates"] if t["name"] == "trial")
    trial["retryStrategy"]["limitt"] = trial["retryStrategy"].pop("limit")
    why = refusal(server, bad)
    assert why is not None and 'unknown field "spec.templates[1].retryStrategy.limitt"' in why, why
    assert refusal(server, wf) is None  # the control: the same Workflow without the typo


def test_the_install_manifest_is_the_render_of_the_verified_module():
    """infra/argo/install.yaml is what the release's recipe makes from the module that build.sh verified (its
    manifests/ kept in the build cache): rendered again here, byte for byte, and its digest the pinned one."""
    r = subprocess.run(
        [sys.executable, "-m", "infra.scripts.argo_install", "check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    assert (
        Path(REPO / "infra" / "argo" / "install.yaml").read_bytes().startswith(b"# This is an auto-generated")
    )
