"""The local cluster's parts that are not orchestration: certificates, tokens and kubeconfigs; starting,
stopping and finding processes by pid and start time; readiness probes. `cluster.py` runs them in order."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.local.pins import ARGO_VERSION

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "infra" / "local" / "build.sh"
NAMESPACE = "baton"
NODE_NAME = "baton-local"
EXECUTOR_IMAGE = f"quay.io/argoproj/argoexec:{ARGO_VERSION}"
# The Argo controller's health server: `http.ListenAndServe(":6060", nil)` in cmd/workflow-controller/main.go.
ARGO_HEALTH_PORT = 6060
COMPONENTS = (
    "s3",
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "workflow-controller",
    "argo-server",
    "containerd",
    "kubelet",
)
# The drill's bucket on moto, and its placeholder keys (moto checks no signature): the same values are in
# templates/overlays/local/s3.yaml, which the pods and Argo's artifact repository read.
BUCKET = "baton"
S3_KEYS = {
    "AWS_ACCESS_KEY_ID": "baton-local",
    "AWS_SECRET_ACCESS_KEY": "baton-local-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}
OVERLAY = REPO / "templates" / "overlays" / "local"
# The endpoint written in the overlay, replaced by moto's port of this `up` (write_overlay).
OVERLAY_S3_PLACEHOLDER = "127.0.0.1:9000"
SUBMITTER_TOKEN_SECRET = "baton-submitter.service-account-token"
# kube-controller-manager's controllers: what pods, service accounts and workflows need here. No node IPAM,
# no volumes, no workload controllers (Argo creates bare pods).
KCM_CONTROLLERS = (
    "serviceaccount-controller,serviceaccount-token-controller,namespace-controller,"
    "garbage-collector-controller,root-ca-certificate-publisher-controller,"
    "node-lifecycle-controller,pod-garbage-collector-controller,"
    "clusterrole-aggregation-controller,ttl-after-finished-controller"
)


class ClusterError(Exception):
    """An expected failure, reported as one line without a traceback."""


def state_dir() -> Path:
    return Path(os.environ.get("BATON_CLUSTER_STATE") or Path.home() / ".cache/baton/cluster-state")


def binaries() -> Path:
    """The cached build's folder, checked complete by build.sh itself."""
    check = subprocess.run(["bash", str(BUILD), "--check"], capture_output=True, text=True)
    if check.returncode != 0:
        why = check.stderr.strip().removeprefix("error: ")
        raise ClusterError(why or "the cluster binaries are not built: bash infra/local/build.sh")
    out = subprocess.run(["bash", str(BUILD), "--print-dir"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def kubectl() -> str:
    path = os.environ.get("KUBECTL") or shutil.which("kubectl")
    if not path:
        raise ClusterError("no kubectl on PATH (or $KUBECTL): it installs the Argo CRDs and RBAC")
    return path


def free_port(taken: set[int]) -> int:
    """A port the kernel says is free on 127.0.0.1 now (a race with another program is possible; the
    component's start then fails with its log named)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in taken and port != ARGO_HEALTH_PORT:
            taken.add(port)
            return port


# --- certificates, tokens, kubeconfigs -------------------------------------------------------------------


def _openssl(*args: str) -> None:
    r = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {r.stderr.strip().splitlines()[-1:]}")


def _signed(pki: Path, name: str, cn: str, ext: str, org: str = "") -> None:
    """pki/name.{key,crt}: a key and a certificate signed by the cluster CA with the given extensions."""
    subj = f"/CN={cn}" + (f"/O={org}" if org else "")
    _openssl(
        "req",
        "-new",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        subj,
        "-keyout",
        str(pki / f"{name}.key"),
        "-out",
        str(pki / f"{name}.csr"),
    )
    (pki / f"{name}.ext").write_text(ext + "\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(pki / f"{name}.csr"),
        "-CA",
        str(pki / "ca.crt"),
        "-CAkey",
        str(pki / "ca.key"),
        "-CAcreateserial",
        "-days",
        "3650",
        "-sha256",
        "-extfile",
        str(pki / f"{name}.ext"),
        "-out",
        str(pki / f"{name}.crt"),
    )


def ensure_pki(pki: Path) -> None:
    """A CA, the API server's serving certificate, its client certificate for the kubelet (logs, exec), and the
    service-account key pair. Kept across `up`s (only 127.0.0.1 is named in them); the kubelet's own are made
    by infra/local/kubelet.py, which knows the node's address."""
    if (pki / ".complete").exists():
        return
    if pki.exists():
        shutil.rmtree(pki)
    pki.mkdir(parents=True, mode=0o700)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "3650",
        "-subj",
        "/CN=baton-local-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout",
        str(pki / "ca.key"),
        "-out",
        str(pki / "ca.crt"),
    )
    # The in-cluster names are there because pods read KUBERNETES_SERVICE_HOST=127.0.0.1, and a client that
    # dials kubernetes.default.svc still gets a certificate that names it.
    _signed(
        pki,
        "apiserver",
        "kube-apiserver",
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth",
    )
    _signed(
        pki,
        "apiserver-kubelet-client",
        "kube-apiserver-kubelet-client",
        "extendedKeyUsage=clientAuth",
        org="system:masters",
    )
    _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
    _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    for p in pki.iterdir():
        p.chmod(0o600)
    (pki / ".complete").write_text("")


# user name, groups: one token each, in the API server's --token-auth-file.
USERS = {
    "admin": ("baton:admin", "system:masters"),
    "kube-controller-manager": ("system:kube-controller-manager", ""),
    "kube-scheduler": ("system:kube-scheduler", ""),
    "workflow-controller": ("baton:workflow-controller", ""),
    "argo-server": ("baton:argo-server", ""),
}


def ensure_tokens(state: Path) -> dict[str, str]:
    path = state / "tokens.json"
    tokens: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    for who in USERS:
        tokens.setdefault(who, secrets.token_hex(24))
    path.write_text(json.dumps(tokens, indent=1))
    path.chmod(0o600)
    lines = [f'{tokens[who]},{user},{who}-uid,"{groups}"' for who, (user, groups) in USERS.items()]
    (state / "tokens.csv").write_text("\n".join(lines) + "\n")
    (state / "tokens.csv").chmod(0o600)
    return tokens


def write_kubeconfig(path: Path, server: str, ca: Path, token: str, namespace: str = "default") -> None:
    # JSON is YAML: client-go and kubectl read it as a kubeconfig.
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "baton-local",
        "clusters": [
            {"name": "baton-local", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "baton-local", "user": {"token": token}}],
        "contexts": [
            {
                "name": "baton-local",
                "context": {"cluster": "baton-local", "user": "baton-local", "namespace": namespace},
            }
        ],
    }
    path.write_text(json.dumps(cfg, indent=1))
    path.chmod(0o600)


# --- processes -----------------------------------------------------------------------------------------


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat): with the pid, it names one
    process, so a recycled pid is never signalled."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def alive(entry: dict[str, Any]) -> bool:
    start = _start_time(entry["pid"])
    if start is None or start != entry["start"]:
        return False
    # A zombie has exited: it only waits to be reaped.
    return Path(f"/proc/{entry['pid']}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def spawn(name: str, argv: list[str], state: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Start one component in its own session (so `down` can signal its whole process group), its output
    appended to logs/NAME.log."""
    log = state / "logs" / f"{name}.log"
    with open(log, "ab") as f:
        f.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        f.flush()
        p = subprocess.Popen(
            argv,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            env=env,
            start_new_session=True,
        )
    return {"pid": p.pid, "start": _start_time(p.pid), "log": str(log), "argv": argv}


def stop(entry: dict[str, Any], grace: float = 10.0) -> None:
    """SIGTERM the component's process group, SIGKILL it after `grace` seconds."""
    if not alive(entry):
        return
    pid = entry["pid"]
    if pid <= 1:
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and alive(entry):
        _reap(pid)
        time.sleep(0.1)
    if alive(entry):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for _ in range(50):
            _reap(pid)
            if not alive(entry):
                break
            time.sleep(0.1)
    _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


# --- readiness -----------------------------------------------------------------------------------------

_INSECURE = ssl.create_default_context()
_INSECURE.check_hostname = False
_INSECURE.verify_mode = ssl.CERT_NONE


def http_get(url: str, token: str | None = None, ca: Path | None = None) -> str:
    """The body of a GET, or '' on any error. Health ports of the controller manager and scheduler serve
    self-signed certificates they make themselves, so those are read without verification (loopback only)."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    ctx = ssl.create_default_context(cafile=str(ca)) if ca else _INSECURE
    try:
        handlers = [urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)]
        with urllib.request.build_opener(*handlers).open(req, timeout=5) as r:
            return r.read().decode(errors="replace")
    except Exception:  # noqa: BLE001 -- any failure means "not ready yet"
        return ""


def wait_ready(name: str, entry: dict[str, Any], ready: Callable[[], bool], timeout: float) -> float:
    t0 = time.monotonic()
    while True:
        if ready():
            return time.monotonic() - t0
        if not alive(entry):
            raise ClusterError(f"{name} exited during start-up; see {entry['log']}")
        if time.monotonic() - t0 > timeout:
            raise ClusterError(f"{name} not ready after {timeout:.0f} s; see {entry['log']}")
        time.sleep(0.3)


def listener_pids(port: int) -> set[int]:
    out = subprocess.run(["ss", "-Htlnp", f"sport = :{port}"], capture_output=True, text=True).stdout
    return {int(x.split("=")[1]) for x in out.replace(",", " ").split() if x.startswith("pid=")}


def binding(
    kind: str, name: str, role_kind: str, role: str, subject: dict[str, str], namespace: str | None = None
) -> dict[str, Any]:
    meta: dict[str, str] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [subject],
    }


# --- the drill's bucket and overlay -------------------------------------------------------------------------


def create_bucket(port: int, bucket: str = BUCKET) -> None:
    """PUT /bucket on moto (which needs no signature); an existing bucket is fine."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/{bucket}", method="PUT")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        opener.open(req, timeout=10).close()
    except urllib.error.HTTPError as e:
        if e.code != 409:  # BucketAlreadyOwnedByYou
            raise ClusterError(
                f"creating bucket {bucket} on moto (127.0.0.1:{port}) failed: HTTP {e.code}"
            ) from None
    except OSError as e:
        raise ClusterError(f"creating bucket {bucket} on moto (127.0.0.1:{port}) failed: {e}") from None


def write_overlay(state: Path, s3_port: int) -> Path:
    """state/overlay: templates/overlays/local with moto's endpoint of this `up` in ConfigMaps baton-s3 and
    artifact-repositories. Kustomize refuses an absolute path to a base, so the base is named relative to it."""
    out = state / "overlay"
    out.mkdir(exist_ok=True)
    repo_text = (OVERLAY / "artifact-repositories.yaml").read_text()
    if repo_text.count(OVERLAY_S3_PLACEHOLDER) != 1:
        raise ClusterError(
            f"{OVERLAY / 'artifact-repositories.yaml'}: expected the endpoint "
            f"{OVERLAY_S3_PLACEHOLDER} exactly once, to replace with moto's port"
        )
    (out / "artifact-repositories.yaml").write_text(
        repo_text.replace(OVERLAY_S3_PLACEHOLDER, f"127.0.0.1:{s3_port}")
    )
    endpoint = json.dumps(
        [{"op": "replace", "path": "/data/endpoint", "value": f"http://127.0.0.1:{s3_port}"}]
    )
    # JSON is YAML: kustomize reads this file as a Kustomization.
    (out / "kustomization.yaml").write_text(
        json.dumps(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(OVERLAY, out)],
                "patches": [
                    {"path": "artifact-repositories.yaml"},
                    {"target": {"kind": "ConfigMap", "name": "baton-s3"}, "patch": endpoint},
                ],
            },
            indent=1,
        )
        + "\n"
    )
    return out
