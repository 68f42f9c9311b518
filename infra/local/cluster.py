"""A real local control plane from the binaries that infra/local/build.sh caches.

    python -m infra.local.cluster up        start moto's S3 server, etcd, kube-apiserver, kube-controller-manager,
                                            kube-scheduler, Argo's workflow-controller and Argo Server, and the
                                            node: containerd and the kubelet (infra/local/kubelet.py), with the
                                            images of infra/local/image.sh; apply templates/overlays/local
    python -m infra.local.cluster up --kueue   the same, plus Kueue's controller manager, its CRDs and its
                                            webhooks (infra/local/kueue.py; built by build-kueue.sh); on a
                                            running cluster it adds Kueue
    python -m infra.local.cluster down      stop them all, by process id, in reverse order; remove the node's
                                            containers, mounts and cgroups, and undo its changes to the host
    python -m infra.local.cluster down --kueue   stop Kueue only (its webhooks unregistered first)
    python -m infra.local.cluster status    one line per component
    python -m infra.local.cluster env       the `export` lines a user needs (eval "$(... env)"): KUBECONFIG,
                                            ARGO_SERVER, ARGO_TOKEN, ARGO_SECURE, ARGO_INSECURE_SKIP_VERIFY,
                                            ARGO_NAMESPACE, BATON_TARGET, BATON_S3_ENDPOINT and the bucket's keys

State (certificates, tokens, kubeconfigs, etcd's data, logs/, pids.json) lives in
${BATON_CLUSTER_STATE:-~/.cache/baton/cluster-state}. Every server listens on 127.0.0.1 only, on free ports
chosen at each `up`, except two that Argo binds on every interface with no flag to change it: the
workflow-controller's health port :6060 and the Argo Server's port, and the kubelet, on the host's own address
(it refuses a loopback node IP; docs/cluster-local.md).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.local import kubelet as node_mod
from infra.local import kueue as kueue_mod
from infra.local.components import (
    ARGO_HEALTH_PORT,
    COMPONENTS,
    EXECUTOR_IMAGE,
    KCM_CONTROLLERS,
    NAMESPACE,
    NODE_NAME,
    S3_KEYS,
    SUBMITTER_TOKEN_SECRET,
    USERS,
    ClusterError,
    alive,
    binaries,
    binding,
    create_bucket,
    ensure_pki,
    ensure_tokens,
    free_port,
    http_get,
    kubectl,
    listener_pids,
    rss_mb,
    spawn,
    state_dir,
    stop,
    wait_ready,
    write_kubeconfig,
    write_overlay,
)
from workflows.targets import TARGET_ENV


class Cluster:
    def __init__(self, state: Path):
        self.state = state
        self.pids_file = state / "pids.json"

    # The state written by `up`: ports, and each component's process.
    def load(self) -> dict[str, Any]:
        if not self.pids_file.exists():
            return {}
        return json.loads(self.pids_file.read_text())

    def save(self, info: dict[str, Any]) -> None:
        tmp = self.pids_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=1))
        tmp.replace(self.pids_file)

    def health(self, info: dict[str, Any]) -> dict[str, str]:
        """Each component: 'ok', or why not (a few words)."""
        out: dict[str, str] = {}
        procs = info.get("procs", {})
        tokens = (
            json.loads((self.state / "tokens.json").read_text())
            if (self.state / "tokens.json").exists()
            else {}
        )
        ports = info.get("ports", {})
        ca = self.state / "pki" / "ca.crt"
        for name in COMPONENTS:
            e = procs.get(name)
            if not e:
                out[name] = "not started"
            elif not alive(e):
                out[name] = f"not running (log {e['log']})"
            else:
                ok = {
                    "s3": lambda: "ListAllMyBucketsResult" in http_get(f"http://127.0.0.1:{ports['s3']}/"),
                    "argo-server": lambda: self._argo_server_ready(ports),
                    "etcd": lambda: '"health":"true"' in http_get(f"http://127.0.0.1:{ports['etcd']}/health"),
                    "kube-apiserver": lambda: (
                        http_get(f"https://127.0.0.1:{ports['apiserver']}/readyz", tokens.get("admin"), ca)
                        == "ok"
                    ),
                    "kube-controller-manager": lambda: (
                        http_get(f"https://127.0.0.1:{ports['kcm']}/healthz") == "ok"
                    ),
                    "kube-scheduler": lambda: (
                        http_get(f"https://127.0.0.1:{ports['scheduler']}/healthz") == "ok"
                    ),
                    "workflow-controller": lambda e=e: self._argo_ready(e),
                    "containerd": lambda: node_mod.containerd_ready(node_mod.Paths(self.state)),
                    "kubelet": lambda: self._node_ready(ports, tokens, ca),
                }[name]()
                out[name] = "ok" if ok else "running, not ready"
        return out

    def _argo_ready(self, entry: dict[str, Any]) -> bool:
        # The health port is Argo's fixed :6060. When another cluster's controller holds it, this one's
        # health server failed to start (Argo logs it and goes on), so fall back to its log.
        if entry["pid"] in listener_pids(ARGO_HEALTH_PORT):
            return http_get(f"http://127.0.0.1:{ARGO_HEALTH_PORT}/healthz") != ""
        try:
            # Only this start's part of the log (each start appends after a "=== " line).
            text = Path(entry["log"]).read_text(errors="replace").rsplit("\n=== ", 1)[-1]
            return "Starting Workflow Controller" in text
        except OSError:
            return False

    def _argo_server_ready(self, ports: dict[str, int]) -> bool:
        """A real request through the Argo Server to the API server, as `submit` and the UI make one, with the
        submitter's token: the server answers its static pages before its gateway can reach its own gRPC port,
        and a submit made then got "HTTP 503 ... connection refused" (seen once right after `up`)."""
        token_file = self.state / "submitter.token"
        token = token_file.read_text().strip() if token_file.exists() else None
        body = http_get(
            f"https://127.0.0.1:{ports['argo_server']}/api/v1/workflows/{NAMESPACE}?listOptions.limit=1",
            token,
        )
        return body.startswith("{") and '"metadata"' in body

    def _node_ready(self, ports: dict[str, int], tokens: dict[str, str], ca: Path) -> bool:
        body = http_get(
            f"https://127.0.0.1:{ports['apiserver']}/api/v1/nodes/{NODE_NAME}", tokens.get("admin"), ca
        )
        if not body:
            return False
        conds = json.loads(body).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    # --- up ---
    def up(self, timeout: float = 180.0, kueue: bool = False, pods_ready_s: int | None = None) -> None:
        bindir = binaries()
        if kueue:
            kueue_mod.kueue_dir()  # built, or one line saying how to build it, before anything starts
        if os.geteuid() != 0:
            raise ClusterError(
                "the node needs root: containerd, runc and the kubelet mount, make cgroups and set "
                "the kernel settings the kubelet requires"
            )
        missing = node_mod.missing_tools()
        if missing:
            raise ClusterError(
                f"the node needs Debian's {', '.join(missing)}: apt-get install {' '.join(missing)} "
                "(make cluster-build installs them)"
            )
        images = subprocess.run(["bash", str(node_mod.IMAGES), "--check"], capture_output=True, text=True)
        if images.returncode:
            raise ClusterError(images.stderr.strip().removeprefix("error: "))
        self.state.mkdir(parents=True, exist_ok=True)
        (self.state / "logs").mkdir(exist_ok=True)
        info = self.load()
        if info:
            health = self.health(info)
            if all(v == "ok" for v in health.values()):
                if kueue and kueue_mod.healthy(info) != "ok":
                    self.up_kueue(info, timeout, pods_ready_s)
                    return
                print(
                    f"cluster: already up, all {len(health)} components healthy "
                    f"(state {self.state}; `python -m infra.local.cluster status`); paste these, or eval "
                    '"$(python -m infra.local.cluster env)":'
                )
                self.env()  # a new shell needs them as much as the first one did
                return
            if any(alive(e) for e in info.get("procs", {}).values()):
                bad = ", ".join(f"{k}: {v}" for k, v in health.items() if v != "ok")
                print(f"cluster: partly up ({bad}); stopping what runs and starting again")
            self.down(quiet=True)
        t_start = time.monotonic()
        kc = kubectl()
        pki = self.state / "pki"
        ensure_pki(pki)
        tokens = ensure_tokens(self.state)
        taken: set[int] = set()
        ports = {
            k: free_port(taken)
            for k in (
                "s3",
                "etcd",
                "etcd_peer",
                "apiserver",
                "kcm",
                "scheduler",
                "kubelet",
                "kubelet_healthz",
                "argo_server",
                "argo_metrics",
            )
        }
        server = f"https://127.0.0.1:{ports['apiserver']}"
        kcfg = {}
        for who in USERS:
            kcfg[who] = self.state / f"{who}.kubeconfig"
            write_kubeconfig(
                kcfg[who],
                server,
                pki / "ca.crt",
                tokens[who],
                NAMESPACE if who in ("admin", "workflow-controller", "argo-server") else "default",
            )
        info = {"ports": ports, "server": server, "bin": str(bindir), "procs": {}, "figures": {}}
        self.save(info)
        procs: dict[str, Any] = info["procs"]
        figures: dict[str, float] = info["figures"]

        def started(name: str, entry: dict[str, Any], ready: Callable[[], bool]) -> None:
            procs[name] = entry
            self.save(info)
            figures[name] = round(wait_ready(name, entry, ready, timeout), 1)
            self.save(info)

        try:
            b = bindir / "bin"
            # moto's S3 server: the drill's bucket and Argo's artifact repository. Its objects live in its
            # memory, so they are gone after `down`.
            moto = Path(sys.executable).parent / "moto_server"
            if not moto.exists():
                raise ClusterError(
                    f"no moto_server beside {sys.executable}: run make install (moto is a test "
                    "dependency) and start the cluster with .venv/bin/python"
                )
            started(
                "s3",
                spawn("s3", [str(moto), "-H", "127.0.0.1", "-p", str(ports["s3"])], self.state),
                lambda: "ListAllMyBucketsResult" in http_get(f"http://127.0.0.1:{ports['s3']}/"),
            )
            create_bucket(ports["s3"])

            etcd_dir = self.state / "etcd"
            started(
                "etcd",
                spawn(
                    "etcd",
                    [
                        str(b / "etcd"),
                        "--name",
                        "baton-local",
                        "--data-dir",
                        str(etcd_dir),
                        "--listen-client-urls",
                        f"http://127.0.0.1:{ports['etcd']}",
                        "--advertise-client-urls",
                        f"http://127.0.0.1:{ports['etcd']}",
                        "--listen-peer-urls",
                        f"http://127.0.0.1:{ports['etcd_peer']}",
                        "--initial-advertise-peer-urls",
                        f"http://127.0.0.1:{ports['etcd_peer']}",
                        "--initial-cluster",
                        f"baton-local=http://127.0.0.1:{ports['etcd_peer']}",
                        "--initial-cluster-state",
                        "existing" if (etcd_dir / "member").exists() else "new",
                    ],
                    self.state,
                ),
                lambda: '"health":"true"' in http_get(f"http://127.0.0.1:{ports['etcd']}/health"),
            )

            # An audit log of evictions and pod deletions only: what shows that a drill's evict step went through
            # the Eviction API, as whom, and what deleted each pod (tests/e2e reads it).
            audit_policy = self.state / "audit-policy.json"
            audit_policy.write_text(
                json.dumps(
                    {
                        "apiVersion": "audit.k8s.io/v1",
                        "kind": "Policy",
                        "omitStages": ["RequestReceived"],
                        "rules": [
                            {
                                "level": "Metadata",
                                "verbs": ["create"],
                                "resources": [{"group": "", "resources": ["pods/eviction"]}],
                            },
                            {
                                "level": "Metadata",
                                "verbs": ["delete"],
                                "resources": [{"group": "", "resources": ["pods"]}],
                            },
                            {"level": "None"},
                        ],
                    }
                )
            )
            # --endpoint-reconciler-type none: the lease reconciler refuses a loopback --advertise-address.
            # The kubelet flags let `kubectl logs` and `exec` reach the kubelet over TLS checked both ways.
            started(
                "kube-apiserver",
                spawn(
                    "kube-apiserver",
                    [
                        str(b / "kube-apiserver"),
                        "--etcd-servers",
                        f"http://127.0.0.1:{ports['etcd']}",
                        "--bind-address",
                        "127.0.0.1",
                        "--advertise-address",
                        "127.0.0.1",
                        "--secure-port",
                        str(ports["apiserver"]),
                        "--tls-cert-file",
                        str(pki / "apiserver.crt"),
                        "--tls-private-key-file",
                        str(pki / "apiserver.key"),
                        "--cert-dir",
                        str(self.state / "apiserver-certs"),
                        "--client-ca-file",
                        str(pki / "ca.crt"),
                        "--service-account-issuer",
                        server,
                        "--service-account-key-file",
                        str(pki / "sa.pub"),
                        "--service-account-signing-key-file",
                        str(pki / "sa.key"),
                        "--service-cluster-ip-range",
                        "10.96.0.0/24",
                        "--endpoint-reconciler-type",
                        "none",
                        "--authorization-mode",
                        "RBAC",
                        "--token-auth-file",
                        str(self.state / "tokens.csv"),
                        "--kubelet-certificate-authority",
                        str(pki / "ca.crt"),
                        "--kubelet-client-certificate",
                        str(pki / "apiserver-kubelet-client.crt"),
                        "--kubelet-client-key",
                        str(pki / "apiserver-kubelet-client.key"),
                        "--kubelet-preferred-address-types",
                        "InternalIP",
                        "--allow-privileged=true",
                        "--profiling=false",
                        "--audit-policy-file",
                        str(audit_policy),
                        "--audit-log-path",
                        str(self.state / "logs" / "audit.log"),
                        "--audit-log-maxsize",
                        "50",
                        "--audit-log-maxbackup",
                        "2",
                    ],
                    self.state,
                ),
                lambda: http_get(f"{server}/readyz", tokens["admin"], pki / "ca.crt") == "ok",
            )

            self.bootstrap(kc, kcfg["admin"], bindir, ports["argo_metrics"])
            # Kueue's webhooks from an earlier `up --kueue` whose `down` did not run would point at a server
            # that is gone, and their failurePolicy Fail would refuse every labelled pod.
            kueue_mod.remove_webhooks(kc, kcfg["admin"])

            started(
                "kube-controller-manager",
                spawn(
                    "kube-controller-manager",
                    [
                        str(b / "kube-controller-manager"),
                        "--kubeconfig",
                        str(kcfg["kube-controller-manager"]),
                        "--authentication-kubeconfig",
                        str(kcfg["kube-controller-manager"]),
                        "--authorization-kubeconfig",
                        str(kcfg["kube-controller-manager"]),
                        "--bind-address",
                        "127.0.0.1",
                        "--secure-port",
                        str(ports["kcm"]),
                        "--cert-dir",
                        str(self.state / "kcm-certs"),
                        "--service-account-private-key-file",
                        str(pki / "sa.key"),
                        "--root-ca-file",
                        str(pki / "ca.crt"),
                        "--use-service-account-credentials",
                        "--leader-elect=false",
                        "--controllers",
                        KCM_CONTROLLERS,
                        "--profiling=false",
                    ],
                    self.state,
                ),
                lambda: http_get(f"https://127.0.0.1:{ports['kcm']}/healthz") == "ok",
            )

            started(
                "kube-scheduler",
                spawn(
                    "kube-scheduler",
                    [
                        str(b / "kube-scheduler"),
                        "--kubeconfig",
                        str(kcfg["kube-scheduler"]),
                        "--authentication-kubeconfig",
                        str(kcfg["kube-scheduler"]),
                        "--authorization-kubeconfig",
                        str(kcfg["kube-scheduler"]),
                        "--bind-address",
                        "127.0.0.1",
                        "--secure-port",
                        str(ports["scheduler"]),
                        "--cert-dir",
                        str(self.state / "scheduler-certs"),
                        "--leader-elect=false",
                        "--profiling=false",
                    ],
                    self.state,
                ),
                lambda: http_get(f"https://127.0.0.1:{ports['scheduler']}/healthz") == "ok",
            )

            # Pods need the namespace's default ServiceAccount (the ServiceAccount admission plugin refuses a
            # pod until it exists) and kube-root-ca.crt (the token volume projects it): both come from the
            # controller manager, so wait for them before anything creates a pod.
            self._wait_api(
                kc,
                kcfg["admin"],
                ["get", "serviceaccount", "default", "-n", NAMESPACE],
                "the default ServiceAccount in namespace baton (kube-controller-manager)",
                timeout,
            )
            self._wait_api(
                kc,
                kcfg["admin"],
                ["get", "configmap", "kube-root-ca.crt", "-n", NAMESPACE],
                "ConfigMap kube-root-ca.crt in namespace baton (kube-controller-manager)",
                timeout,
            )

            self.apply_overlay(kc, kcfg["admin"], ports["s3"], timeout)

            argo_env = dict(os.environ, LEADER_ELECTION_DISABLE="true")
            started(
                "workflow-controller",
                spawn(
                    "workflow-controller",
                    [
                        str(b / "workflow-controller"),
                        "--kubeconfig",
                        str(kcfg["workflow-controller"]),
                        "--namespace",
                        NAMESPACE,
                        "--executor-image",
                        EXECUTOR_IMAGE,
                        "--loglevel",
                        "info",
                    ],
                    self.state,
                    argo_env,
                ),
                lambda: self._argo_ready(procs["workflow-controller"]),
            )

            # The Argo Server in `client` auth mode: each request is made with the caller's own token
            # (ARGO_TOKEN, baton-submitter's). Its TLS certificate is self-signed, made at each start
            # (--secure, the default, with no --tls-certificate-secret-name). It listens on every interface:
            # argoserver.go's net.Listen("tcp", ":PORT") takes no address (docs/cluster-local.md).
            server_env = {k: v for k, v in os.environ.items() if not k.startswith("ARGO_")}
            # In `client` mode each request's REST config comes from client-go's default loading rules
            # (util/kubeconfig.DefaultRestConfig: $KUBECONFIG, else in-cluster), not from --kubeconfig; its
            # credentials are then replaced by the caller's token.
            server_env["KUBECONFIG"] = str(kcfg["argo-server"])
            started(
                "argo-server",
                spawn(
                    "argo-server",
                    [
                        str(b / "argo"),
                        "server",
                        "--kubeconfig",
                        str(kcfg["argo-server"]),
                        "--namespace",
                        NAMESPACE,
                        "--auth-mode",
                        "client",
                        "--port",
                        str(ports["argo_server"]),
                        "--secure=true",
                        "--loglevel",
                        "info",
                    ],
                    self.state,
                    server_env,
                ),
                lambda: self._argo_server_ready(ports),
            )

            # The node: containerd, the images imported into it, the host's changes, the kubelet.
            node = node_mod.Paths(self.state)
            ip = node_mod.node_ip()
            info["node_ip"] = ip
            node_mod.prepare(node, pki, pki / "ca.crt", server, ip, ports, node_mod.pause_image(b))
            started("containerd", node_mod.start_containerd(node), lambda: node_mod.containerd_ready(node))
            t_import = time.monotonic()
            imported = node_mod.import_images(node, node_mod.image_archives())
            figures["images_imported"] = round(time.monotonic() - t_import, 1)
            if imported:
                print(
                    f"cluster: imported {', '.join(imported)} into containerd in {figures['images_imported']:.0f} s"
                )
            changed = node_mod.change_host(node, ports["apiserver"])
            if changed:
                print(f"cluster: changed on this host (down restores them): {'; '.join(changed)}")
            started(
                "kubelet",
                node_mod.start_kubelet(node, b, ip),
                lambda: self._node_ready(ports, tokens, pki / "ca.crt"),
            )
            if kueue:
                kueue_mod.start(self, info, kc, kcfg["admin"], timeout, pods_ready_s)
        except BaseException:
            self.down(quiet=True)
            raise
        figures["up_total"] = round(time.monotonic() - t_start, 1)
        self.save(info)
        names = [*COMPONENTS, "kueue"] if kueue else COMPONENTS
        print(
            f"cluster: up in {figures['up_total']:.0f} s: {', '.join(names)} on 127.0.0.1 "
            f'(API {server}); paste these, or eval "$(python -m infra.local.cluster env)":'
        )
        self.env()

    def up_kueue(self, info: dict[str, Any], timeout: float, pods_ready_s: int | None = None) -> None:
        """Kueue added to a running, healthy cluster."""
        admin = self.state / "admin.kubeconfig"
        try:
            kueue_mod.start(self, info, kubectl(), admin, timeout, pods_ready_s)
        except BaseException:
            self.down_kueue(quiet=True)
            raise
        print(
            f"cluster: Kueue up in {info['figures']['kueue']:.0f} s (webhooks on "
            f"127.0.0.1:{info['ports']['kueue_webhook']}; log {info['procs']['kueue']['log']})"
        )

    def down_kueue(self, quiet: bool = False) -> None:
        info = self.load()
        try:
            kc: str | None = kubectl()
        except ClusterError:
            kc = None
        ran = kueue_mod.stop_kueue(info, kc, self.state / "admin.kubeconfig")
        if info.get("procs", {}).pop("kueue", None) is not None:
            self.save(info)
        if not quiet:
            print(
                "cluster: Kueue stopped, its webhooks unregistered"
                if ran
                else "cluster: Kueue was not running"
            )

    def _wait_api(self, kc: str, kubeconfig: Path, args: list[str], what: str, timeout: float) -> None:
        t0 = time.monotonic()
        while subprocess.run([kc, "--kubeconfig", str(kubeconfig), *args], capture_output=True).returncode:
            if time.monotonic() - t0 > timeout:
                raise ClusterError(f"{what} did not appear within {timeout:.0f} s; see {self.state}/logs/")
            time.sleep(0.5)

    def apply_overlay(self, kc: str, kubeconfig: Path, s3_port: int, timeout: float) -> None:
        """templates/overlays/local (namespace, the drill's RBAC, the bucket's ConfigMap and Secret, Argo's
        artifact repository, the submitter's token Secret, the nightly CronWorkflow), with this `up`'s moto
        port; then the submitter's token, once the token controller has filled it in, saved for `env`."""
        overlay = write_overlay(self.state, s3_port)
        built = subprocess.run([kc, "kustomize", str(overlay)], capture_output=True, text=True)
        if built.returncode:
            raise ClusterError(
                f"kubectl kustomize {overlay} failed: {built.stderr.strip().splitlines()[-1:]}"
            )
        docs = built.stdout
        r = subprocess.run(
            [kc, "--kubeconfig", str(kubeconfig), "apply", "--server-side", "--force-conflicts", "-f", "-"],
            input=docs,
            capture_output=True,
            text=True,
        )
        if r.returncode:
            raise ClusterError(
                f"applying templates/overlays/local failed: {r.stderr.strip().splitlines()[-1:]}"
            )
        # The nightly drill is installed suspended: a cluster left up at 03:00 would otherwise run a full
        # drill. `argo cron resume baton-equivalence-nightly` turns it on.
        subprocess.run(
            [
                kc,
                "--kubeconfig",
                str(kubeconfig),
                "-n",
                NAMESPACE,
                "patch",
                "cronworkflow",
                "baton-equivalence-nightly",
                "--type",
                "merge",
                "-p",
                '{"spec":{"suspend":true}}',
            ],
            capture_output=True,
        )
        t0 = time.monotonic()
        while True:
            out = subprocess.run(
                [
                    kc,
                    "--kubeconfig",
                    str(kubeconfig),
                    "-n",
                    NAMESPACE,
                    "get",
                    "secret",
                    SUBMITTER_TOKEN_SECRET,
                    "-o",
                    "jsonpath={.data.token}",
                ],
                capture_output=True,
                text=True,
            ).stdout.strip()
            if out:
                break
            if time.monotonic() - t0 > timeout:
                raise ClusterError(
                    f"Secret {SUBMITTER_TOKEN_SECRET} got no token within {timeout:.0f} s "
                    f"(kube-controller-manager's token controller); see {self.state}/logs/"
                )
            time.sleep(0.5)
        path = self.state / "submitter.token"
        path.write_text(base64.b64decode(out).decode())
        path.chmod(0o600)

    def bootstrap(self, kc: str, kubeconfig: Path, bindir: Path, metrics_port: int) -> None:
        """Argo's CRDs, namespace baton, the RBAC of Argo's own manifests, the node's binding, and the
        controller's configuration (its Prometheus endpoint on `metrics_port`)."""
        rbac = bindir / "argo-manifests" / "cluster-install-no-crds" / "workflow-controller-rbac"

        def apply(args: list[str], what: str, stdin: str | None = None) -> None:
            r = subprocess.run(
                [kc, "--kubeconfig", str(kubeconfig), *args], input=stdin, capture_output=True, text=True
            )
            if r.returncode:
                raise ClusterError(f"installing {what} failed: {r.stderr.strip().splitlines()[-1:]}")

        # Server-side apply: the full CRDs are too large for client-side apply's last-applied annotation.
        apply(["apply", "--server-side", "--force-conflicts", "-f", str(bindir / "crds")], "Argo's CRDs")
        apply(
            ["apply", "--server-side", "-f", "-"],
            "namespace baton",
            json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        )
        # The controller's ClusterRole (argo-cluster-role) and Role (argo-role) as Argo ships them, bound to
        # the controller's token user instead of Argo's service account (it runs outside the cluster).
        apply(
            ["apply", "--server-side", "-f", str(rbac / "workflow-controller-clusterrole.yaml")],
            "Argo's ClusterRole",
        )
        apply(
            ["apply", "--server-side", "-n", NAMESPACE, "-f", str(rbac / "workflow-controller-role.yaml")],
            "Argo's Role",
        )
        server_rbac = bindir / "argo-manifests" / "cluster-install-no-crds" / "argo-server-rbac"
        apply(
            ["apply", "--server-side", "-f", str(server_rbac / "argo-server-clusterole.yaml")],
            "the Argo Server's ClusterRole",
        )
        executor_role = (
            bindir
            / "argo-manifests"
            / "quick-start"
            / "base"
            / "executor"
            / "emissary"
            / "executor-role.yaml"
        )
        apply(["apply", "--server-side", "-n", NAMESPACE, "-f", str(executor_role)], "Argo's executor Role")
        user = USERS["workflow-controller"][0]
        docs: list[dict[str, Any]] = [
            binding(
                "ClusterRoleBinding",
                "baton-argo-controller",
                "ClusterRole",
                "argo-cluster-role",
                {"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"},
            ),
            binding(
                "ClusterRoleBinding",
                "baton-argo-server",
                "ClusterRole",
                "argo-server-cluster-role",
                {"kind": "User", "name": USERS["argo-server"][0], "apiGroup": "rbac.authorization.k8s.io"},
            ),
            binding(
                "RoleBinding",
                "baton-argo-controller",
                "Role",
                "argo-role",
                {"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"},
                NAMESPACE,
            ),
            # The executor (the pods' wait container) writes WorkflowTaskResults as the pod's service account.
            binding(
                "RoleBinding",
                "executor-default",
                "Role",
                "executor",
                {"kind": "ServiceAccount", "name": "default", "namespace": NAMESPACE},
                NAMESPACE,
            ),
            # The bootstrap ClusterRole system:node, which RBAC no longer binds to system:nodes by itself.
            binding(
                "ClusterRoleBinding",
                "baton-node",
                "ClusterRole",
                "system:node",
                {"kind": "User", "name": f"system:node:{NODE_NAME}", "apiGroup": "rbac.authorization.k8s.io"},
            ),
            # The controller's configuration. Its Prometheus endpoint serves the drill's gauges
            # (argo_workflows_baton_drill_*) on a free port, over its self-signed TLS (Argo's default); it
            # listens on every interface, as exporter_prometheus.go's ":PORT" has it, and panics if the port
            # is taken, so the port is one of this start's free ones. The telemetry server (another ":PORT"
            # listener, nothing the drill uses) stays off.
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "workflow-controller-configmap", "namespace": NAMESPACE},
                "data": {
                    "metricsConfig": f"enabled: true\nport: {metrics_port}\n",
                    "telemetryConfig": "enabled: false\n",
                },
            },
        ]
        apply(
            ["apply", "--server-side", "-f", "-"],
            "the RBAC bindings",
            json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}),
        )

    # --- down ---
    def down(self, quiet: bool = False) -> None:
        info = self.load()
        procs = info.get("procs", {})
        # Kueue first, its webhooks unregistered while the API server still answers (infra/local/kueue.py).
        kueue_ran = False
        if "kueue" in procs:
            kueue_ran = alive(procs["kueue"])
            self.down_kueue(quiet=True)
        # Only live ones count: pids.json written inside another PID namespace (an e2e session's `up`) names
        # pids that mean other processes here, and stop() leaves any whose start time differs alone.
        live = [name for name in reversed(COMPONENTS) if name in procs and alive(procs[name])]
        node = node_mod.Paths(self.state)
        containers = 0
        for name in live:
            if name == "containerd" and node_mod.containerd_ready(node):
                containers = node_mod.remove_containers(
                    node
                )  # the kubelet is stopped: nothing starts them again
            stop(procs[name])
        left = [n for n, e in procs.items() if alive(e)]
        if left:
            raise ClusterError(f"still running after SIGKILL: {', '.join(left)}")
        shims = node_mod.stop_shims(node)
        mounts = node_mod.unmount_below(self.state)
        cgroups_left = node_mod.remove_cgroups()
        node_mod.remove_run_dirs()
        restored = node_mod.restore_host(node)
        live += ["kueue"] if kueue_ran else []
        if self.pids_file.exists():
            self.pids_file.unlink()
        if cgroups_left:
            raise ClusterError(f"{cgroups_left} cgroups under kubepods still hold processes after down")
        if not quiet:
            extra = "".join(
                f", {n} {what}"
                for n, what in (
                    (containers, "containers removed"),
                    (shims, "shims stopped"),
                    (mounts, "mounts unmounted"),
                )
                if n
            )
            extra += f"; restored: {', '.join(restored)}" if restored else ""
            print(
                f"cluster: down ({len(live)} components stopped{extra}); state kept in {self.state}"
                if live or restored
                else f"cluster: not running (state {self.state})"
            )

    # --- status / env ---
    def status(self) -> int:
        info = self.load()
        if not info:
            print(f"cluster: not running (state {self.state})")
            return 1
        health = self.health(info)
        for name in COMPONENTS:
            e = info["procs"].get(name)
            extra = f"pid {e['pid']}, RSS {rss_mb(e['pid']):.0f} MB" if e and alive(e) else ""
            print(f"{name:24} {health[name]:20} {extra}")
        if "kueue" in info["procs"]:
            e = info["procs"]["kueue"]
            extra = f"pid {e['pid']}, RSS {rss_mb(e['pid']):.0f} MB" if alive(e) else ""
            print(f"{'kueue':24} {kueue_mod.healthy(info):20} {extra}")
        return 0 if all(v == "ok" for v in health.values()) else 1

    def env(self) -> None:
        info = self.load()
        if not info:
            raise ClusterError(
                f"cluster: not running (state {self.state}); run: python -m infra.local.cluster up"
            )
        ports = info["ports"]
        token_file = self.state / "submitter.token"
        token = token_file.read_text().strip() if token_file.exists() else ""
        lines = {
            "KUBECONFIG": str(self.state / "admin.kubeconfig"),
            "BATON_CLUSTER_STATE": str(self.state),
            "ARGO_SERVER": f"127.0.0.1:{ports['argo_server']}",
            "ARGO_TOKEN": f"Bearer {token}",
            # The server's certificate is self-signed, made at its start: TLS, not verified (loopback).
            "ARGO_SECURE": "true",
            "ARGO_INSECURE_SKIP_VERIFY": "true",
            "ARGO_NAMESPACE": NAMESPACE,
            # The overlay a bare `python workflows/equivalence.py submit` renders the drill with (its bucket and keys).
            TARGET_ENV: "local-kueue" if "kueue" in info["procs"] else "local",
            # What `status` needs to read the drill's bucket on moto.
            "BATON_S3_ENDPOINT": f"http://127.0.0.1:{ports['s3']}",
            **S3_KEYS,
        }
        for k, v in lines.items():
            print(f"export {k}={shlex.quote(v)}")
        print(f"export PATH={shlex.quote(info['bin'] + '/bin')}:$PATH")
        # A comment, so that `eval "$(... env)"` still works: where to watch a drill, and how to log in.
        print(
            f"# Argo UI: https://127.0.0.1:{ports['argo_server']}/ (self-signed certificate); log in with "
            "the whole of $ARGO_TOKEN, 'Bearer ...', pasted into its login page"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.local.cluster", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["up", "down", "status", "env"])
    ap.add_argument(
        "--timeout", type=float, default=180.0, help="seconds each component may take to be ready"
    )
    ap.add_argument(
        "--kueue",
        action="store_true",
        help="up: also Kueue (infra/local/kueue.py; make cluster-build-kueue); down: Kueue only",
    )
    ap.add_argument(
        "--kueue-pods-ready-timeout",
        type=int,
        metavar="SECONDS",
        help="up --kueue: Kueue's waitForPodsReady timeout and recoveryTimeout (default 5 and 3 min)",
    )
    args = ap.parse_args(argv)
    if args.kueue_pods_ready_timeout is not None and args.kueue_pods_ready_timeout < 1:
        ap.error("--kueue-pods-ready-timeout must be at least 1")
    cluster = Cluster(state_dir())
    try:
        if args.command == "up":
            cluster.up(args.timeout, kueue=args.kueue, pods_ready_s=args.kueue_pods_ready_timeout)
        elif args.command == "down" and args.kueue:
            cluster.down_kueue()
        elif args.command == "down":
            cluster.down()
        elif args.command == "status":
            return cluster.status()
        else:
            cluster.env()
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; what had started was stopped", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `up | head -1`: the reader left; what was started keeps running, as asked
        # Python would flush stdout again at exit and fail once more (the idiom of Python's signal docs).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
