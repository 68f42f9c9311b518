"""Kueue (issue 17): the `queue` parameter puts every pod in a LocalQueue through spec.podMetadata, a bad
label value is refused before anything is sent, and the gke-kueue overlay's Kueue objects hang together:
kinds, the names each references, and quota that admits a drill's concurrent pods at once. Kueue's CRDs
are not vendored, so its objects are checked by structure; the Argo objects against Argo's CRDs."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from steps.lib.contract import RELEASE_TEMPLATE
from tests.crd import validate_kueue
from tests.helpers import PY, REPO, base_env
from tests.workflow.test_argo import (  # noqa: F401  (fixtures)
    CREATE,
    OVERLAYS,
    _one,
    argo,
    error_of,
    fixture,
    kustomize,
    needs_kubectl,
    overlays,
    templates_of,
    validate,
)
from workflows import equivalence as eq

LABEL = "kueue.x-k8s.io/queue-name"
KUEUE = "kueue.x-k8s.io/v1beta2"


def _render(*params: str) -> subprocess.CompletedProcess:
    cmd = [PY, "workflows/equivalence.py", "render"]
    for prm in params:
        cmd += ["-p", prm]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=base_env(), timeout=120)


def test_render_with_a_queue_labels_every_pod_and_stays_crd_valid():
    p = _render("queue=team-a")
    assert p.returncode == 0, p.stderr
    docs = list(yaml.safe_load_all(p.stdout))
    assert [d["kind"] for d in docs] == ["Workflow", "CronWorkflow"]
    for d in docs:
        validate(d)
        spec = d["spec"].get("workflowSpec", d["spec"])
        # spec.podMetadata reaches every pod Argo creates: each template's own metadata adds to it.
        assert spec["podMetadata"] == {"labels": {LABEL: "team-a"}}
        assert not any(LABEL in t.get("metadata", {}).get("labels", {}) for t in spec["templates"])
        assert {p["name"]: p["value"] for p in spec["arguments"]["parameters"]}["queue"] == "team-a"


def test_without_a_queue_no_pod_is_labelled():
    for obj in eq.rendered():
        spec = obj["spec"].get("workflowSpec", obj["spec"])
        assert "podMetadata" not in spec
        assert eq.PARAMETERS["queue"][0] == ""


@pytest.mark.parametrize("value", ["Team A", "-q", "q-", "q" * 64, "a/b", "$(id)"])
def test_an_invalid_label_value_is_refused_before_render(value):
    p = _render(f"queue={value}")
    assert p.returncode != 0 and "parameter queue" in p.stderr and "label value" in p.stderr
    assert p.stdout == ""


def test_an_invalid_label_value_is_refused_before_submit(argo):  # noqa: F811 (the fixture)
    assert "parameter queue" in error_of(["submit", "-p", "queue=bad queue"])
    assert argo.requests == []


def test_submit_with_a_queue_sends_the_label_and_an_empty_queue_takes_it_off(argo, tmp_path):  # noqa: F811
    argo.routes[("POST", CREATE)] = (200, fixture("created.json"))
    assert eq.main(["submit", "-p", "queue=team-a"]) == 0
    wf = json.loads(argo.requests[-1]["body"])["workflow"]
    validate(wf)
    assert wf["spec"]["podMetadata"]["labels"][LABEL] == "team-a"
    # A file that carries the label (the gke-kueue overlay's) leaves the queue with -p queue=
    wf["metadata"].pop("namespace", None)
    path = tmp_path / "wf.yaml"
    path.write_text(yaml.safe_dump(wf))
    assert eq.main(["submit", "--from-file", str(path), "-p", "queue="]) == 0
    sent = json.loads(argo.requests[-1]["body"])["workflow"]
    assert "podMetadata" not in sent["spec"]


EXECUTOR = {"cpu": 0.1, "memory": 128 * 2**20}  # the allowance a pod for Argo's wait sidecar (kueue.yaml)


def _patch(template: dict, values: dict[str, str]) -> dict:
    """The template's podSpecPatch, as Argo substitutes it (workflow parameters) and applies it."""
    raw = template.get("podSpecPatch", "{}")
    for k, v in values.items():
        raw = raw.replace("{{workflow.parameters." + k + "}}", v)
    return json.loads(raw)


def _requests(template: dict, values: dict[str, str]) -> dict[str, float]:
    """What Kueue counts for one pod of `template`: its main container's requests, the executor's allowance,
    and the GPUs of the gke overlay's podSpecPatch (an extended resource's limit is its request)."""
    req = template.get("container", {}).get("resources", {}).get("requests", {})
    out = {
        "cpu": _quantity(req.get("cpu", "0")) + EXECUTOR["cpu"],
        "memory": _quantity(req.get("memory", "0")) + EXECUTOR["memory"],
        "nvidia.com/gpu": 0.0,
    }
    for c in _patch(template, values).get("containers", []):
        out["nvidia.com/gpu"] += float(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
    return out


def _quantity(q: str | int) -> float:
    m = re.fullmatch(r"([0-9.]+)(m|Ki|Mi|Gi|Ti)?", str(q))
    assert m, f"unexpected quantity {q!r}"
    scale = {None: 1, "m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[m.group(2)]
    return float(m.group(1)) * scale


def _flavor_for(template: dict, flavors: dict[str, dict], values: dict[str, str]) -> str:
    """The flavor Kueue can assign a pod of `template`: the pod's nodeSelector (the template's, or the one
    its podSpecPatch gives) must match the flavor's nodeLabels, and its tolerations cover the nodeTaints."""
    fits = []
    selector = {**template.get("nodeSelector", {}), **_patch(template, values).get("nodeSelector", {})}
    for name, f in flavors.items():
        labels = f["spec"].get("nodeLabels", {})
        if any(labels.get(k) != v for k, v in selector.items()):
            continue
        tolerated = all(
            any(
                t.get("key") == taint["key"]
                and t.get("effect") in (None, taint["effect"])
                and (t.get("operator") == "Exists" or t.get("value") == taint.get("value"))
                for t in template.get("tolerations", [])
            )
            for taint in f["spec"].get("nodeTaints", [])
        )
        if tolerated:
            fits.append(name)
    assert len(fits) == 1, (template["name"], fits)
    return fits[0]


@needs_kubectl
def test_the_kueue_overlay_builds_and_its_objects_reference_each_other_and_cover_a_drill():
    docs = kustomize(overlays() / "gke-kueue")  # no flags; every non-Kueue document validated
    gke = kustomize(overlays() / "gke")
    kueue = [d for d in docs if d["apiVersion"] == KUEUE]
    assert sorted(d["kind"] for d in kueue) == ["ClusterQueue", "LocalQueue"] + ["ResourceFlavor"] * 3
    for d in kueue:  # strictly, against Kueue v0.19.2's own CRDs (tests/kueue/), at v1beta2
        validate_kueue(d)
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs if d["apiVersion"] != KUEUE) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in gke
    )  # the gke overlay, nothing lost
    for d in kueue:  # cluster-scoped ones carry no namespace; the LocalQueue is in the drill's
        assert d["metadata"].get("namespace") == ("baton" if d["kind"] == "LocalQueue" else None), d["kind"]
    flavors = {d["metadata"]["name"]: d for d in kueue if d["kind"] == "ResourceFlavor"}
    cq = _one(kueue, "ClusterQueue")
    lq = _one(kueue, "LocalQueue")
    assert lq["spec"]["clusterQueue"] == cq["metadata"]["name"]
    assert cq["spec"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": lq["metadata"]["namespace"]}
    }
    [group] = cq["spec"]["resourceGroups"]
    assert set(group["coveredResources"]) == {"cpu", "memory", "nvidia.com/gpu"}
    quota: dict[str, dict[str, float]] = {}
    for f in group["flavors"]:
        assert f["name"] in flavors  # every flavor the ClusterQueue names exists
        assert [r["name"] for r in f["resources"]] == group["coveredResources"]
        quota[f["name"]] = {r["name"]: _quantity(r["nominalQuota"]) for r in f["resources"]}
    assert set(quota) == set(flavors)

    # The flavors' node labels and taints are the pools' (infra/gke, read by tests/unit/test_infra.py).
    from tests.unit.test_infra import _resources, _tf

    tf = _tf(REPO / "infra" / "gke" / "main.tf")
    pools: set[str] = (
        set()
    )  # each pool's baton.dev/pool label: a literal, or (for_each) a key of local.gpu_pools
    for body in _resources(tf, "google_container_node_pool").values():
        label = re.search(r'"baton.dev/pool" = ("([\w-]+)"|each\.key)', body["node_config"][0]["labels"])
        assert label, body["node_config"][0]["labels"]
        keys = (
            [label.group(2)]
            if label.group(2)
            else [k for entry in tf["locals"] for n, v in entry.items() if n == "gpu_pools" for k in v]
        )
        pools.update(keys)
    assert len(pools) == 3, pools  # system, gpu-spot, gpu-on-demand
    for f in flavors.values():
        assert f["spec"]["nodeLabels"] == {"baton.dev/pool": f["spec"]["nodeLabels"].get("baton.dev/pool")}
        assert f["spec"]["nodeLabels"]["baton.dev/pool"] in pools, (f["spec"]["nodeLabels"], pools)
    for gpu in ("baton-spot-gpu", "baton-on-demand-gpu"):
        assert flavors[gpu]["spec"]["nodeTaints"] == [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
        ]

    # The CronWorkflow: the queue parameter names the LocalQueue, and every pod carries its label.
    cron = _one(docs, "CronWorkflow")
    spec = cron["spec"]["workflowSpec"]
    values = {p["name"]: p["value"] for p in spec["arguments"]["parameters"]}
    assert values["queue"] == lq["metadata"]["name"] == spec["podMetadata"]["labels"][LABEL]
    # A drill's concurrent pods (reference, reference-replay, trial, evict) fit in the quota together, with the
    # baseline on Spot (the default) and on demand (-p baseline_pool=on-demand).
    ts = templates_of(cron)
    ranks = int(values["ranks"])
    for pool, expected in (
        ("spot", {"baton-spot-gpu": 3}),
        ("on-demand", {"baton-spot-gpu": 1, "baton-on-demand-gpu": 2}),
    ):
        at = {**values, "grace": "15", "baseline_pool": pool}
        used: dict[str, dict[str, float]] = {f: dict.fromkeys(group["coveredResources"], 0.0) for f in quota}
        for t in [ts["train"], ts["train"], ts["trial"], ts["evict"]]:
            flavor = _flavor_for(t, flavors, at)
            for r, v in _requests(t, at).items():
                used[flavor][r] += v
        for flavor, res in used.items():
            for r, v in res.items():
                assert v <= quota[flavor][r], (
                    f"{pool}: {flavor} {r}: a drill needs {v}, the quota is {quota[flavor][r]}"
                )
        assert {f: int(u["nvidia.com/gpu"]) for f, u in used.items() if u["nvidia.com/gpu"]} == {
            f: n * ranks for f, n in expected.items()
        }, pool  # one GPU per rank of each training pod
    for name in ("verify", "compare"):  # run after trial and evict end: admitted into the same quota
        assert _flavor_for(ts[name], flavors, values) == "baton-system"
        assert all(v > 0 for k, v in _requests(ts[name], values).items() if k != "nvidia.com/gpu")


def test_the_kueue_schema_check_can_fail():
    """Strict: a misspelt field, or a version Kueue does not serve, is refused (the check is not vacuous)."""
    import jsonschema

    docs = [d for d in yaml.safe_load_all((REPO / "templates/components/kueue/kueue.yaml").read_text()) if d]
    cq = next(d for d in docs if d["kind"] == "ClusterQueue")
    typo = {**cq, "spec": {**cq["spec"], "queueingStrategi": "BestEffortFIFO"}}
    with pytest.raises(jsonschema.ValidationError):
        validate_kueue(typo)
    with pytest.raises(AssertionError, match="does not serve"):
        validate_kueue({**cq, "apiVersion": "kueue.x-k8s.io/v1alpha9"})


def _overlays_for(tmp_path, drill_nodes: int):
    """The overlays as make gke-up writes them for a cluster whose Terraform says drill_nodes."""
    import shutil

    from tests.workflow.test_argo import CLUSTER_IMAGE, TERRAFORM_OUTPUT, cluster_overlay

    gen = cluster_overlay()
    shutil.copytree(REPO / "templates", tmp_path / "templates", ignore=shutil.ignore_patterns(gen.FOLDER))
    raw = json.loads(TERRAFORM_OUTPUT.read_text())
    raw["drill_nodes"] = {"sensitive": False, "type": "number", "value": drill_nodes}
    (tmp_path / "tf.json").write_text(json.dumps(raw))
    gen.write(
        tmp_path / "templates" / "overlays" / "gke" / gen.FOLDER,
        gen.outputs(tmp_path / "tf.json"),
        CLUSTER_IMAGE,
    )
    return tmp_path / "templates" / "overlays"


@needs_kubectl
def test_a_cluster_for_two_node_drills_has_quota_for_three_groups_of_two_and_one_node_quota_does_not(
    tmp_path,
):
    built: dict[int, list[dict]] = {}

    def quota_and_use(drill_nodes: int, nodes: int) -> list[str]:
        if drill_nodes not in built:
            built[drill_nodes] = kustomize(
                _overlays_for(tmp_path / f"tf{drill_nodes}", drill_nodes) / "gke-kueue"
            )
        docs = built[drill_nodes]
        kueue = [d for d in docs if d["apiVersion"] == KUEUE]
        flavors = {d["metadata"]["name"]: d for d in kueue if d["kind"] == "ResourceFlavor"}
        [group] = _one(kueue, "ClusterQueue")["spec"]["resourceGroups"]
        quota = {
            f["name"]: {r["name"]: _quantity(r["nominalQuota"]) for r in f["resources"]}
            for f in group["flavors"]
        }
        cron = _one(docs, "CronWorkflow")
        values = {p["name"]: p["value"] for p in cron["spec"]["workflowSpec"]["arguments"]["parameters"]}
        ts = templates_of(cron)
        over = []
        for pool in ("spot", "on-demand"):
            at = {**values, "grace": "15", "baseline_pool": pool}
            used = {f: dict.fromkeys(group["coveredResources"], 0.0) for f in quota}
            for t in [ts["train"], ts["train"], ts["trial"]] * nodes + [ts["evict"]]:
                for r, v in _requests(t, at).items():
                    used[_flavor_for(t, flavors, at)][r] += v
            over += [
                f"{pool}: {f} {r} {v:g} > {quota[f][r]:g}"
                for f, res in used.items()
                for r, v in res.items()
                if v > quota[f][r]
            ]
        return over

    assert quota_and_use(2, 2) == []
    assert quota_and_use(1, 1) == []
    assert quota_and_use(1, 2), "the one-node quota admitted a two-node drill: the check cannot fail"


def test_at_two_nodes_each_role_is_one_kueue_pod_group_whose_size_is_the_nodes_parameter():
    p = _render("nodes=2", "queue=baton")
    assert p.returncode == 0, p.stderr
    wf = next(d for d in yaml.safe_load_all(p.stdout) if d and d["kind"] == "Workflow")
    validate(wf)
    spec = wf["spec"]
    assert {x["name"]: x["value"] for x in spec["arguments"]["parameters"]}["nodes"] == "2"
    ts = templates_of(wf)
    assert (
        ts["trial"]["metadata"]["labels"][LABEL] == "baton"
    )  # per template here: the release handler's pod has none
    tasks = {t["name"]: t for t in ts["drill"]["dag"]["tasks"]}
    groups = {}
    for task in ("reference", "reference-replay", "trial"):
        t = tasks[task]
        assert t["withSequence"] == {"count": "{{workflow.parameters.nodes}}"}
        args = {a["name"]: a["value"] for a in t["arguments"]["parameters"]}
        assert args["node"] == "{{item}}"
        meta = ts[t["template"]]["metadata"]
        # Kueue v0.19.2 (pkg/controller/jobs/pod/constants/constants.go): the group's name and its size.
        assert meta["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "{{workflow.parameters.nodes}}"
        name = meta["labels"]["kueue.x-k8s.io/pod-group-name"].replace(
            "{{inputs.parameters.role}}", args.get("role", "")
        )
        assert "retries" not in name and "pod.name" not in name  # one group per role, across every retry
        groups[task] = name
    assert groups == {
        "reference": "{{workflow.name}}-reference",
        "reference-replay": "{{workflow.name}}-replay",
        "trial": "{{workflow.name}}-trial",
    }
    assert "withSequence" not in tasks["evict"] and ts["evict"]["metadata"] == {
        "labels": {LABEL: "baton"}
    }  # no group
    # At one node the DAG is what it always was: no group, no expansion.
    one = eq.rendered(1)[0]
    assert all("withSequence" not in t for t in templates_of(one)["drill"]["dag"]["tasks"])
    assert all("metadata" not in t for t in templates_of(one).values())


# ---- the release exit handler of a grouped drill (issue 36: no quota held after a drill that fails) ----------


def _handler(spec: dict) -> tuple[str | None, list[dict]]:
    return spec.get("onExit"), [t for t in spec["templates"] if t["name"] == RELEASE_TEMPLATE]


def test_a_queued_drill_of_pod_groups_gets_the_release_handler_out_of_the_queue():
    """At nodes=2 with a queue: spec.onExit runs steps.release, in a pod out of the queue, so that a queue full
    of the drill's own held quota cannot keep it from running. Kueue's webhook refuses an empty queue name
    (seen on the real one), so the label moves from spec.podMetadata onto each other pod template. Controls:
    no queue, or one node (no pod group), no handler and the label on spec.podMetadata."""
    p = _render("nodes=2", "queue=team-a")
    assert p.returncode == 0, p.stderr
    for d in yaml.safe_load_all(p.stdout):
        validate(d)
        spec = d["spec"].get("workflowSpec", d["spec"])
        on_exit, [tmpl] = _handler(spec)
        assert on_exit == RELEASE_TEMPLATE
        assert LABEL not in (tmpl.get("metadata") or {}).get("labels", {})
        assert LABEL not in (spec.get("podMetadata") or {}).get("labels", {})
        pods = [t for t in spec["templates"] if "container" in t and t["name"] != RELEASE_TEMPLATE]
        assert {t["name"] for t in pods} == {"train", "trial", "evict", "verify", "compare"}
        assert all(t["metadata"]["labels"][LABEL] == "team-a" for t in pods)
        assert tmpl["container"]["args"][:2] == ["-m", "steps.release"]
        assert "{{workflow.name}}" in tmpl["container"]["args"]
        # No Argo retry: a retried handler's pod is not exempt from a passed deadline (release_template).
        assert "retryStrategy" not in tmpl
    for params in (("nodes=2",), ("queue=team-a",), ()):
        p = _render(*params)
        assert p.returncode == 0, p.stderr
        for d in yaml.safe_load_all(p.stdout):
            assert _handler(d["spec"].get("workflowSpec", d["spec"])) == (None, []), params


def test_submit_from_a_file_keeps_one_handler_and_an_empty_queue_takes_it_off(argo, tmp_path):  # noqa: F811
    argo.routes[("POST", CREATE)] = (200, fixture("created.json"))
    p = _render("nodes=2", "queue=team-a")
    wf = next(yaml.safe_load_all(p.stdout))
    path = tmp_path / "wf.yaml"
    path.write_text(yaml.safe_dump(wf))
    assert eq.main(["submit", "--from-file", str(path)]) == 0
    sent = json.loads(argo.requests[-1]["body"])["workflow"]["spec"]
    assert _handler(sent)[0] == RELEASE_TEMPLATE and len(_handler(sent)[1]) == 1
    assert eq.main(["submit", "--from-file", str(path), "-p", "queue="]) == 0
    sent = json.loads(argo.requests[-1]["body"])["workflow"]["spec"]
    assert _handler(sent) == (None, [])
    assert not any(LABEL in (t.get("metadata") or {}).get("labels", {}) for t in sent["templates"])
    assert LABEL not in (sent.get("podMetadata") or {}).get("labels", {})
    # A file with the label on spec.podMetadata (what the kustomize components patch in) loses it there.
    wf["spec"]["podMetadata"] = {"labels": {LABEL: "team-a"}}
    path.write_text(yaml.safe_dump(wf))
    assert eq.main(["submit", "--from-file", str(path)]) == 0
    sent = json.loads(argo.requests[-1]["body"])["workflow"]["spec"]
    assert "podMetadata" not in sent and _handler(sent)[0] == RELEASE_TEMPLATE


def test_a_workflow_with_its_own_exit_handler_is_not_overwritten():
    wf = eq.build_workflow(2).to_dict()
    wf["spec"]["onExit"] = "notify"
    with pytest.raises(ValueError, match="already has an exit handler"):
        eq.set_queue_label(wf, "team-a")
