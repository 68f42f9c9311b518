"""Kueue on the local cluster: `python -m infra.local.cluster up --kueue` (docs/cluster-local.md, "Kueue on the
local cluster"). Its controller manager, built by infra/local/build-kueue.sh into a cache entry of its own,
runs beside the control plane with:

- the CRDs of its module (config/components/crd/bases), server-side applied;
- its ClusterRole (config/components/rbac/role.yaml, renamed kueue-manager-role) and the metrics endpoint's
  TokenReview/SubjectAccessReview role, bound to ServiceAccount kueue-system/kueue-controller-manager, whose
  token (TokenRequest) is in <state>/kueue.kubeconfig;
- a Configuration file (<state>/kueue/config.yaml): internal certificate management off, the webhook server
  on 127.0.0.1 with a certificate from the cluster CA, health and metrics on 127.0.0.1, no leader election,
  integrations.frameworks [pod] with managedJobsNamespaceSelector naming namespace baton, waitForPodsReady on,
  and the VisibilityOnDemand feature gate off (its aggregated API server would need an APIService and the
  front proxy's client CA, which this cluster does not set up);
- its webhook configurations as the module ships them (config/components/webhook/manifests.yaml), kept to
  the webhooks this Kueue serves (pods and kueue.x-k8s.io objects), renamed with Kueue's `kueue-` prefix,
  each pointed at `clientConfig.url: https://127.0.0.1:PORT/<path>` with the cluster CA as caBundle. They
  are registered only once Kueue answers /readyz, and deleted before it stops: a pod webhook with
  failurePolicy Fail and no server behind it would refuse every pod in namespace baton.

Kueue v0.19.2 reads its metrics certificate from the fixed path /etc/kueue/metrics/certs when internal
certificate management is off (cmd/kueue/main.go, `metricsCertPath`). So the process runs in a mount
namespace of its own (unshare --mount) with <state>/kueue/etc bound at /etc/kueue; the host keeps only the
empty mount point /etc/kueue.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from infra.local.components import (
    NAMESPACE,
    REPO,
    ClusterError,
    _signed,
    alive,
    free_port,
    http_get,
    spawn,
    stop,
    wait_ready,
    write_kubeconfig,
)
from steps.lib.contract import QUEUE_LABEL

BUILD_KUEUE = REPO / "infra" / "local" / "build-kueue.sh"
KUEUE_NAMESPACE = "kueue-system"
SERVICE_ACCOUNT = "kueue-controller-manager"
MUTATING = "kueue-mutating-webhook-configuration"
VALIDATING = "kueue-validating-webhook-configuration"
# Where cmd/kueue/main.go reads the metrics certificate when internal certificate management is off.
ETC_KUEUE = Path("/etc/kueue")
GATE = "kueue.x-k8s.io/admission"


def why_not_built() -> str:
    """'' when build-kueue.sh's cache entry is complete, else its one line."""
    check = subprocess.run(["bash", str(BUILD_KUEUE), "--check"], capture_output=True, text=True)
    return check.stderr.strip().removeprefix("error: ") if check.returncode else ""


def kueue_dir() -> Path:
    why = why_not_built()
    if why:
        raise ClusterError(why)
    out = subprocess.run(
        ["bash", str(BUILD_KUEUE), "--print-dir"], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


def configuration(ports: dict[str, int], certs: Path, pods_ready_s: int | None = None) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2, apis/config/v1beta2/configuration_types.go).
    `pods_ready_s`: waitForPodsReady's timeout and recoveryTimeout, both (a test's short ones)."""
    pods_ready = (
        {"timeout": "5m", "recoveryTimeout": "3m"}
        if pods_ready_s is None
        else {"timeout": f"{pods_ready_s}s", "recoveryTimeout": f"{pods_ready_s}s"}
    )
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['kueue_health']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['kueue_metrics']}"},
        "webhook": {"host": "127.0.0.1", "port": ports["kueue_webhook"], "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        # v1beta2 has no integrations.podOptions: the pod integration's namespaces are this selector (a
        # strong exemption for pods: a pod elsewhere is never managed, label or not).
        "managedJobsNamespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
        "manageJobsWithoutQueueName": False,
        # On by default in v0.19 (30 min); the values Kueue's own sample configuration suggests.
        "waitForPodsReady": {**pods_ready, "blockAdmission": False},
        "integrations": {"frameworks": ["pod"]},
        "featureGates": {"VisibilityOnDemand": False},
        "clientConnection": {"qps": 50, "burst": 100},
    }


def webhook_configurations(manifests: Path, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """The module's webhook configurations, kept to pods and kueue.x-k8s.io objects (the other frameworks'
    handlers are not served with integrations.frameworks [pod], and a registered path that answers 404 would
    refuse those objects), each pointed at the loopback server. The pod webhooks get the namespaceSelector
    that Kueue's config/components/webhook/kustomization.yaml gives them (not kube-system, not kueue-system)."""
    out = []
    for doc in yaml.safe_load_all(manifests.read_text()):
        if not doc:
            continue
        keep = []
        for w in doc.get("webhooks", []):
            groups = {g for r in w.get("rules", []) for g in r.get("apiGroups", [])}
            if not groups <= {"", "kueue.x-k8s.io"}:
                continue
            path = w["clientConfig"]["service"]["path"]
            w["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca_pem).decode(),
            }
            if groups == {""}:
                w["namespaceSelector"] = {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": ["kube-system", KUEUE_NAMESPACE],
                        }
                    ]
                }
            w["timeoutSeconds"] = 10
            keep.append(w)
        kind = doc["kind"]
        doc["metadata"] = {
            "name": MUTATING if kind.startswith("Mutating") else VALIDATING,
            "labels": {"app.kubernetes.io/part-of": "baton-local-kueue"},
        }
        doc["webhooks"] = keep
        out.append(doc)
    if {d["metadata"]["name"] for d in out} != {MUTATING, VALIDATING} or not any(
        w["name"] == "mpod.kb.io" for d in out for w in d["webhooks"]
    ):
        raise ClusterError(f"{manifests}: expected Kueue's two webhook configurations with mpod.kb.io")
    return out


def _kubectl(
    kc: str, kubeconfig: Path, *args: str, stdin: str | None = None, what: str = ""
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [kc, "--kubeconfig", str(kubeconfig), *args], input=stdin, capture_output=True, text=True
    )
    if r.returncode and what:
        raise ClusterError(f"{what} failed: {r.stderr.strip().splitlines()[-1:]}")
    return r


def install(kc: str, admin: Path, kdir: Path, state: Path, server: str, ca: Path) -> Path:
    """CRDs, namespace, ServiceAccount, RBAC; returns Kueue's kubeconfig (a TokenRequest token)."""
    _kubectl(
        kc,
        admin,
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        str(kdir / "crds"),
        what="applying Kueue's CRDs",
    )
    _kubectl(
        kc,
        admin,
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "-f",
        str(kdir / "crds"),
        what="waiting for Kueue's CRDs",
    )
    role = yaml.safe_load((kdir / "rbac" / "role.yaml").read_text())
    role["metadata"] = {"name": "kueue-manager-role"}
    metrics_role = yaml.safe_load((kdir / "rbac" / "metrics_auth_role.yaml").read_text())
    metrics_role["metadata"] = {"name": "kueue-metrics-auth-role"}
    # The Secrets of its own namespace (MultiKueue's controllers watch them, and the manager does not start
    # until every cache has synced: without this Role it stopped after 2 minutes, "Could not wait for Cache to
    # sync ... *v1.Secret").
    secrets_role = yaml.safe_load((kdir / "rbac" / "manager_secrets_role.yaml").read_text())
    secrets_role["metadata"] = {"name": "kueue-manager-secrets-role", "namespace": KUEUE_NAMESPACE}
    subject = {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": KUEUE_NAMESPACE}

    def crb(name: str) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name.replace("-role", "-binding")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [subject],
        }

    items = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": SERVICE_ACCOUNT, "namespace": KUEUE_NAMESPACE},
        },
        role,
        metrics_role,
        crb("kueue-manager-role"),
        crb("kueue-metrics-auth-role"),
        secrets_role,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "kueue-manager-secrets-rolebinding", "namespace": KUEUE_NAMESPACE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "kueue-manager-secrets-role",
            },
            "subjects": [subject],
        },
    ]
    _kubectl(
        kc,
        admin,
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        what="Kueue's RBAC",
    )
    token = _kubectl(
        kc,
        admin,
        "-n",
        KUEUE_NAMESPACE,
        "create",
        "token",
        SERVICE_ACCOUNT,
        "--duration",
        "8760h",
        what="a token for Kueue's ServiceAccount",
    ).stdout.strip()
    path = state / "kueue.kubeconfig"
    write_kubeconfig(path, server, ca, token, KUEUE_NAMESPACE)
    return path


def certificates(pki: Path, kstate: Path) -> Path:
    """The webhook and metrics serving certificate (IP:127.0.0.1, from the cluster CA), in the two folders
    Kueue reads: the webhook's certDir and what is bound at /etc/kueue (metrics/certs)."""
    if not (pki / "kueue-webhook.crt").exists():
        _signed(
            pki,
            "kueue-webhook",
            "kueue-webhook",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth",
        )
    certs = kstate / "certs"
    metrics = kstate / "etc" / "metrics" / "certs"
    for d in (certs, metrics):
        d.mkdir(parents=True, exist_ok=True)
        for src, dst in (("kueue-webhook.crt", "tls.crt"), ("kueue-webhook.key", "tls.key")):
            (d / dst).write_bytes((pki / src).read_bytes())
            (d / dst).chmod(0o600)
    return certs


def remove_webhooks(kc: str, admin: Path) -> None:
    _kubectl(
        kc, admin, "delete", "mutatingwebhookconfiguration", MUTATING, "--ignore-not-found", "--wait=false"
    )
    _kubectl(
        kc,
        admin,
        "delete",
        "validatingwebhookconfiguration",
        VALIDATING,
        "--ignore-not-found",
        "--wait=false",
    )


def gated_dry_run(kc: str, admin: Path) -> bool:
    """A server-side dry run of a pod with the queue label in namespace baton: True when Kueue's webhook
    answered and gated it (what every drill pod with `-p queue=...` goes through)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kueue-webhook-probe", "namespace": NAMESPACE, "labels": {QUEUE_LABEL: "probe"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "probe", "command": ["true"]}],
        },
    }
    r = _kubectl(kc, admin, "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(pod))
    if r.returncode:
        return False
    gates = json.loads(r.stdout).get("spec", {}).get("schedulingGates", [])
    return any(g.get("name") == GATE for g in gates)


def start(
    cluster: Any, info: dict[str, Any], kc: str, admin: Path, timeout: float, pods_ready_s: int | None = None
) -> None:
    """Install Kueue and start its controller manager on a running cluster; register its webhooks once it is
    ready, and wait until the pod webhook gates a labelled pod. Adds `kueue` to info's procs, ports, figures."""
    t0 = time.monotonic()
    kdir = kueue_dir()
    state: Path = cluster.state
    kstate = state / "kueue"
    kstate.mkdir(exist_ok=True)
    pki = state / "pki"
    kubeconfig = install(kc, admin, kdir, state, info["server"], pki / "ca.crt")
    certs = certificates(pki, kstate)
    taken = set(info["ports"].values())
    ports = {k: free_port(taken) for k in ("kueue_webhook", "kueue_health", "kueue_metrics")}
    info["ports"].update(ports)
    config = kstate / "config.yaml"
    config.write_text(yaml.safe_dump(configuration(ports, certs, pods_ready_s), sort_keys=False))
    ETC_KUEUE.mkdir(exist_ok=True)  # the mount point only; what Kueue reads there is bound from kstate/etc
    argv = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-ec",
        'mount --bind "$1" /etc/kueue; shift; exec "$@"',
        "sh",
        str(kstate / "etc"),
        str(kdir / "bin" / "kueue"),
        "--config",
        str(config),
        "--zap-log-level",
        "info",
    ]
    entry = spawn("kueue", argv, state, {"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin"})
    info["procs"]["kueue"] = entry
    info["kueue_dir"] = str(kdir)
    cluster.save(info)
    health = f"http://127.0.0.1:{ports['kueue_health']}/readyz"
    # /readyz says ok once the webhook server listens, before the controllers' caches have synced (a missing
    # permission showed that: ready, then stopped 2 minutes later). The pod controller starting its workers
    # means they have.
    wait_ready("kueue", entry, lambda: http_get(health) == "ok" and _pod_controller_started(entry), timeout)
    docs = webhook_configurations(
        kdir / "webhook" / "manifests.yaml", ports["kueue_webhook"], (pki / "ca.crt").read_bytes()
    )
    _kubectl(
        kc,
        admin,
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}),
        what="registering Kueue's webhooks",
    )
    wait_ready(
        "kueue (its pod webhook gating a labelled pod)", entry, lambda: gated_dry_run(kc, admin), timeout
    )
    info["figures"]["kueue"] = round(time.monotonic() - t0, 1)
    cluster.save(info)


def _pod_controller_started(entry: dict[str, Any]) -> bool:
    try:
        text = Path(entry["log"]).read_text(errors="replace").rsplit("\n=== ", 1)[-1]
    except OSError:
        return False
    return any(
        '"msg":"Starting workers"' in line and '"logger":"v1_pod"' in line for line in text.splitlines()
    )


def healthy(info: dict[str, Any]) -> str:
    e = info.get("procs", {}).get("kueue")
    if not e:
        return "not started"
    if not alive(e):
        return f"not running (log {e['log']})"
    ok = http_get(f"http://127.0.0.1:{info['ports']['kueue_health']}/readyz") == "ok"
    return "ok" if ok else "running, not ready"


def stop_kueue(info: dict[str, Any], kc: str | None, admin: Path) -> bool:
    """Unregister the webhooks (while the API server still answers), then stop the process. True if it ran."""
    e = info.get("procs", {}).get("kueue")
    if kc and admin.exists():
        remove_webhooks(kc, admin)
    if not e or not alive(e):
        return False
    stop(e)
    return True
