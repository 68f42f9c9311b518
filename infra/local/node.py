"""The node agent: a stand-in for the kubelet on the local cluster (infra/local/cluster.py starts it).

    python -m infra.local.node --config STATE/node.json

It registers Node `baton-local` (InternalIP 127.0.0.1), renews its Lease in kube-node-lease every 10 s and
its status every 60 s, watches the pods bound to it and runs each one's containers as host processes
(infra/local/pods.py), and serves container logs over HTTPS to the API server (`kubectl logs`), checking the
API server's client certificate against the cluster CA. Exec, attach and port-forward are not served.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import ssl
import sys
import threading
import time
import urllib.parse
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from infra.local.kube import ApiError, Kube
from infra.local.pins import K8S_VERSION
from infra.local.pods import TERMINAL, PodWorker, _mem_bytes, delete_now, now
from trainer.exits import EXIT_SIGKILL

LEASE_S = 10
STATUS_S = 60
VERSION = f"{K8S_VERSION}-baton-node-agent"


def micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Agent:
    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.node = cfg["node_name"]
        self.kube = self._client()
        self.workers: dict[str, PodWorker] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def _client(self) -> Kube:
        # One client per thread: a requests.Session is not meant to be shared across threads.
        return Kube(self.cfg["server"], self.cfg["token"], self.cfg["ca"])

    # --- the Node object ---
    def node_status(self) -> dict[str, Any]:
        t = now()
        cond = [("Ready", "True", "KubeletReady", "the baton node agent is posting ready status"),
                ("MemoryPressure", "False", "KubeletHasSufficientMemory", "no memory pressure is checked"),
                ("DiskPressure", "False", "KubeletHasNoDiskPressure", "no disk pressure is checked"),
                ("PIDPressure", "False", "KubeletHasSufficientPID", "no PID pressure is checked")]
        capacity = {"cpu": str(os.cpu_count() or 1), "memory": f"{_mem_bytes() // 1024}Ki", "pods": "110",
                    "ephemeral-storage": f"{shutil.disk_usage(self.cfg['state']).total // 1024}Ki"}
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        machine = Path("/etc/machine-id").read_text().strip() if Path("/etc/machine-id").exists() else boot
        return {
            "capacity": capacity, "allocatable": capacity,
            "conditions": [{"type": k, "status": s, "reason": r, "message": m, "lastHeartbeatTime": t,
                            "lastTransitionTime": t} for k, s, r, m in cond],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.cfg["port"]}},
            "nodeInfo": {"machineID": machine, "systemUUID": machine, "bootID": boot,
                         "kernelVersion": platform.release(), "osImage": _os_image(),
                         "containerRuntimeVersion": "baton-host-process://0", "kubeletVersion": VERSION,
                         "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(),
                                                                                   platform.machine())},
        }

    def register(self) -> None:
        path = f"/api/v1/nodes/{self.node}"
        if self.kube.get(path, ok404=True) is None:
            labels = {"kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux",
                      "kubernetes.io/arch": self.node_status()["nodeInfo"]["architecture"]}
            self.kube.post("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                             "metadata": {"name": self.node, "labels": labels}})
        self.kube.merge_patch(path + "/status", {"status": self.node_status()})
        self.renew_lease(self.kube)

    def renew_lease(self, kube: Kube) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.node}"
        spec = {"holderIdentity": self.node, "leaseDurationSeconds": 40, "renewTime": micro_now()}
        try:
            kube.merge_patch(path, {"spec": spec})
        except ApiError as e:
            if e.code != 404:
                raise
            node = kube.get(f"/api/v1/nodes/{self.node}") or {}
            owner = [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": node["metadata"]["uid"]}]
            kube.post("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                      {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                       "metadata": {"name": self.node, "ownerReferences": owner}, "spec": spec})

    def heartbeat(self) -> None:
        kube = self._client()
        last_status = time.monotonic()
        while not self.stopping.wait(LEASE_S):
            try:
                self.renew_lease(kube)
                if time.monotonic() - last_status >= STATUS_S:
                    kube.merge_patch(f"/api/v1/nodes/{self.node}/status", {"status": self.node_status()})
                    last_status = time.monotonic()
            except Exception as e:  # noqa: BLE001 -- the API server may be restarting; try again next beat
                print(f"node-agent: heartbeat failed: {e}", flush=True)

    # --- pods ---
    def sync(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        with self.lock:
            w = self.workers.get(uid)
        if w is not None:
            w.update(pod)
            if w.done and pod["metadata"].get("deletionTimestamp"):
                delete_now(self.kube, pod)
                shutil.rmtree(w.dir, ignore_errors=True)
            return
        phase = pod.get("status", {}).get("phase", "Pending")
        if pod["metadata"].get("deletionTimestamp") and (phase in TERMINAL or not pod["status"].get("startTime")):
            delete_now(self.kube, pod)  # never started here, or long finished: nothing to stop
            return
        if phase in TERMINAL:
            return
        if pod.get("status", {}).get("startTime"):
            # Started by an earlier node agent, whose processes `down` stopped: it cannot be resumed.
            self._fail_orphan(pod)
            return
        w = PodWorker(pod, self._client(), self.cfg)
        with self.lock:
            self.workers[uid] = w
        w.start()

    def _fail_orphan(self, pod: dict[str, Any]) -> None:
        m = pod["metadata"]
        status: dict[str, Any] = {"phase": "Failed", "reason": "NodeAgentRestarted",
                                  "message": "the node agent restarted; the pod's processes had been stopped"}
        # What was running is gone with an unknown end, as the kubelet reports a container it lost.
        for key in ("initContainerStatuses", "containerStatuses"):
            statuses = pod["status"].get(key)
            if not statuses:
                continue
            status[key] = [dict(cs, ready=False, started=False, state={"terminated": {
                "exitCode": EXIT_SIGKILL, "reason": "ContainerStatusUnknown", "finishedAt": now(),
                "startedAt": cs["state"]["running"].get("startedAt"),
                "message": "The container could not be located when the pod was terminated"}})
                if "running" in cs.get("state", {}) else cs for cs in statuses]
        try:
            self.kube.merge_patch(f"/api/v1/namespaces/{m['namespace']}/pods/{m['name']}/status", {
                "metadata": {"uid": m["uid"]}, "status": status})
        except ApiError as e:
            print(f"node-agent: failing orphan {m['namespace']}/{m['name']}: {e}", flush=True)

    def watch_pods(self) -> None:
        kube = Kube(self.cfg["server"], self.cfg["token"], self.cfg["ca"])
        params = {"fieldSelector": f"spec.nodeName={self.node}"}
        rv = ""
        while not self.stopping.is_set():
            try:
                if not rv:
                    listing = kube.get("/api/v1/pods", params=params) or {}
                    for pod in listing.get("items", []):
                        self.sync(pod)
                    rv = listing["metadata"]["resourceVersion"]
                for ev in kube.watch("/api/v1/pods", dict(params, resourceVersion=rv)):
                    obj = ev["object"]
                    if ev["type"] == "ERROR":
                        rv = ""  # 410 Gone: the version is too old; list again
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self.sync(obj)
                    elif ev["type"] == "DELETED":
                        with self.lock:
                            w = self.workers.pop(obj["metadata"]["uid"], None)
                        if w is not None and not w.done:
                            w.update(_deleted(obj))
            except Exception as e:  # noqa: BLE001 -- reconnect after any watch failure
                if self.stopping.is_set():
                    return
                print(f"node-agent: pod watch: {e}; listing again", flush=True)
                rv = ""
                time.sleep(1)

    def find(self, ns: str, name: str) -> PodWorker | None:
        with self.lock:
            for w in self.workers.values():
                if w.ns == ns and w.name == name:
                    return w
        return None

    def shutdown(self) -> None:
        """Stop every pod's processes (SIGTERM, then SIGKILL after 5 s): nothing outlives the agent."""
        self.stopping.set()
        with self.lock:
            workers = list(self.workers.values())
        for w in workers:
            w.killing = True
        # All at once, so that many pods cost one grace period, not one each.
        threads = [threading.Thread(target=w._kill_all, args=(5,), daemon=True) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)


def _deleted(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod removed at once (grace 0 by someone else): its processes are stopped without grace."""
    meta = dict(pod["metadata"], deletionTimestamp=pod["metadata"].get("deletionTimestamp") or now(),
                deletionGracePeriodSeconds=0)
    return dict(pod, metadata=meta)


def _os_image() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return "Linux"


class LogHandler(BaseHTTPRequestHandler):
    """GET /containerLogs/NS/POD/CONTAINER (?follow, tailLines, limitBytes) and /healthz."""

    agent: Agent
    protocol_version = "HTTP/1.0"  # the body ends when the connection closes, which suits follow

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- the base class's name
        pass

    def do_GET(self) -> None:  # noqa: N802 -- the base class's name
        url = urllib.parse.urlsplit(self.path)
        q = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        if parts == ["healthz"]:
            return self._text(200, "ok")
        if len(parts) != 4 or parts[0] != "containerLogs":
            return self._text(404 if parts[0] not in ("exec", "attach", "portForward", "run") else 501,
                              f"{url.path}: not served by the baton node agent (only containerLogs)\n")
        _, ns, name, container = parts
        w = self.agent.find(ns, name)
        path = w.log_path(container) if w else self._old_log(ns, name, container)
        if path is None or not path.exists():
            return self._text(404, f"no logs for container {container} of pod {ns}/{name} on this node\n")
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        limit = int(q["limitBytes"]) if "limitBytes" in q else None
        data = path.read_bytes()
        if "tailLines" in q:
            n = int(q["tailLines"])
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-n:]) if n > 0 else b""
        sent = 0
        try:
            sent += self._send(data, limit)
            if q.get("follow") in ("true", "1") and w is not None:
                with open(path, "rb") as f:
                    f.seek(0, 2)
                    while limit is None or sent < limit:
                        chunk = f.read(65536)
                        if chunk:
                            sent += self._send(chunk, None if limit is None else limit - sent)
                            continue
                        if _container_done(w, container) or self.agent.stopping.is_set():
                            rest = f.read()
                            self._send(rest, None if limit is None else limit - sent)
                            break
                        time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _send(self, data: bytes, limit: int | None) -> int:
        if limit is not None:
            data = data[:max(limit, 0)]
        self.wfile.write(data)
        self.wfile.flush()
        return len(data)

    def _old_log(self, ns: str, name: str, container: str) -> Path | None:
        """A pod that an earlier node agent ran: its folder is named by its uid, read from the API."""
        try:
            pod = self.agent._client().get(f"/api/v1/namespaces/{ns}/pods/{name}", ok404=True)
        except ApiError:
            return None
        if not pod:
            return None
        return Path(self.agent.cfg["state"]) / "pods" / pod["metadata"]["uid"] / "logs" / f"{container}.log"

    def _text(self, code: int, body: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body.encode())))
        self.end_headers()
        self.wfile.write(body.encode())


def _container_done(w: PodWorker, name: str) -> bool:
    c = next((c for c in w.init_containers + w.containers if c.name == name), None)
    return w.done or c is None or c.exit_code is not None


def serve_logs(agent: Agent) -> ThreadingHTTPServer:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(agent.cfg["cert"], agent.cfg["key"])
    # Only the API server, which holds a client certificate from the cluster CA, may read logs.
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(agent.cfg["ca"])
    LogHandler.agent = agent
    srv = ThreadingHTTPServer(("127.0.0.1", agent.cfg["port"]), LogHandler)
    srv.daemon_threads = True
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, name="logs", daemon=True).start()
    return srv


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.local.node", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="the node.json that infra/local/cluster.py writes")
    args = ap.parse_args(argv)
    cfg = json.loads(Path(args.config).read_text())
    agent = Agent(cfg)
    done = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    srv = serve_logs(agent)
    try:
        agent.register()
    except Exception as e:  # noqa: BLE001 -- one line, and the cluster script names this log
        print(f"error: node-agent: registering node {agent.node}: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"node-agent: node {agent.node} registered; logs on https://127.0.0.1:{cfg['port']}", flush=True)
    threading.Thread(target=agent.heartbeat, name="heartbeat", daemon=True).start()
    threading.Thread(target=agent.watch_pods, name="watch", daemon=True).start()
    done.wait()
    print("node-agent: stopping every pod's processes", flush=True)
    agent.shutdown()
    srv.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
