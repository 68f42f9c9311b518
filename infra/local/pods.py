"""One pod on the node agent (infra/local/node.py): its volumes, its containers as host processes, its status.

There are no images and no container runtime here, so a container is a process on the host:
- The image `quay.io/argoproj/argoexec:*` runs the `argoexec` built by infra/local/build.sh (its folder
  first on PATH, where `argoexec init` finds the binary it copies into /var/run/argo). Any other image runs
  with <repo>/.venv/bin first on PATH, in the repository's folder unless the container sets workingDir.
- Each container gets its own mount namespace (`unshare --mount --propagation private`, which needs root):
  the pod's volumes are bind-mounted at their absolute mountPaths (/var/run/argo, /tmp with a subPath,
  /var/run/secrets/kubernetes.io/serviceaccount), seen by that process tree only, as in a container. A
  mount point that the host lacks is created as an empty folder on the host (mkdir is not namespaced).
- Each container gets its own PID namespace (`--pid --fork --mount-proc`). This is not optional: Argo's
  emissary forwards a signal with `kill(-pgid)` where pgid comes from `Getpgid(command.Process.Pid)`, and
  `osspecific.Wait` has already called `Process.Release()`, which sets that Pid to -1, so the forward is
  `kill(-1, SIGTERM)`: in a container, every process of the container; on the host as root, every process
  of the machine. Signals go to the container's PID 1 only, as the kubelet sends them.
- The network is the host's: no network namespace; podIP is 127.0.0.1.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from infra.local.kube import ApiError, Kube
from trainer.exits import signal_exit

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TERMINAL = ("Succeeded", "Failed")


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodFailed(Exception):
    """The pod cannot be started here (a volume type, a missing key): reason and message for its status."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


def _field(pod: dict[str, Any], path: str) -> str:
    """A downward-API fieldPath (the ones the kubelet supports)."""
    meta, spec = pod["metadata"], pod["spec"]
    simple = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
              "spec.nodeName": spec.get("nodeName", ""), "spec.serviceAccountName": spec.get("serviceAccountName", ""),
              "status.hostIP": "127.0.0.1", "status.hostIPs": "127.0.0.1", "status.podIP": "127.0.0.1",
              "status.podIPs": "127.0.0.1"}
    if path in simple:
        return simple[path]
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return meta.get(m.group(1), {}).get(m.group(2), "")
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1], {})
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise PodFailed("CreateContainerConfigError", f"unsupported fieldPath {path!r}")


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(s: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: a defined variable is replaced, $$ escapes, anything else stays."""
    return _VAR.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), s)


class Container:
    """One container's process and what its status says."""

    def __init__(self, spec: dict[str, Any], init: bool):
        self.spec = spec
        self.name: str = spec["name"]
        self.init = init
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid1: int | None = None  # the container's PID 1, seen from the host
        self.started_at = ""
        self.finished_at = ""
        self.exit_code: int | None = None
        self.reason = ""
        self.message = ""

    def status(self) -> dict[str, Any]:
        s: dict[str, Any] = {"name": self.name, "image": self.spec.get("image", ""), "imageID": "",
                             "restartCount": 0, "ready": False, "started": False}
        if self.proc is not None:
            s["containerID"] = f"baton://{self.proc.pid}"
        if self.exit_code is not None:
            s["state"] = {"terminated": {"exitCode": self.exit_code, "reason": self.reason,
                                         "startedAt": self.started_at or self.finished_at,
                                         "finishedAt": self.finished_at,
                                         **({"message": self.message} if self.message else {}),
                                         **({"containerID": s["containerID"]} if "containerID" in s else {})}}
        elif self.proc is not None:
            s["state"] = {"running": {"startedAt": self.started_at}}
            s["ready"] = s["started"] = True
        else:
            s["state"] = {"waiting": {"reason": self.reason or "PodInitializing"}}
        return s


class PodWorker:
    """Runs one pod from its volumes to its final status; `update` hands it the newest pod object."""

    def __init__(self, pod: dict[str, Any], kube: Kube, cfg: dict[str, Any]):
        self.pod = pod
        self.uid: str = pod["metadata"]["uid"]
        self.ns: str = pod["metadata"]["namespace"]
        self.name: str = pod["metadata"]["name"]
        self.kube = kube
        self.cfg = cfg
        self.dir = Path(cfg["state"]) / "pods" / self.uid
        self.lock = threading.Lock()
        self.changed = threading.Event()
        self.init_containers = [Container(c, True) for c in pod["spec"].get("initContainers", [])]
        self.containers = [Container(c, False) for c in pod["spec"]["containers"]]
        self.phase = "Pending"
        self.reason = ""
        self.message = ""
        self.start_time = ""
        self.killing = False
        self.done = False
        self.thread = threading.Thread(target=self._run, name=f"pod-{self.name}", daemon=True)

    # --- what the watch thread calls ---
    def start(self) -> None:
        self.thread.start()

    def update(self, pod: dict[str, Any]) -> None:
        with self.lock:
            self.pod = pod
        self.changed.set()

    def log_path(self, container: str) -> Path:
        return self.dir / "logs" / f"{container}.log"

    # --- the pod's life ---
    def _run(self) -> None:
        try:
            self._life()
        except Exception as e:  # noqa: BLE001 -- a pod's failure must not take the agent down
            self._kill_all(0)
            self.phase, self.reason, self.message = "Failed", "NodeAgentError", f"{type(e).__name__}: {e}"
            self._report()
        finally:
            self.done = True
            self._finish_deletion()

    def _life(self) -> None:
        self.start_time = now()
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        try:
            volumes = self._volumes()
        except (PodFailed, ApiError) as e:
            reason = e.reason if isinstance(e, PodFailed) else "FailedMount"
            self.phase, self.reason, self.message = "Failed", reason, str(getattr(e, "message", e))
            self._report()
            return
        self._report()
        for c in self.init_containers:
            if self._stopping():
                break
            self._launch(c, volumes)
            self._report()
            self._wait_for([c])
            if c.exit_code != 0:
                break
        else:
            if not self._stopping():
                for c in self.containers:
                    self._launch(c, volumes)
                self.phase = "Running"
                self._report()
                self._wait_for(self.containers)
        self._kill_all(0)
        everything = self.init_containers + self.containers
        if not self.reason:
            ok = all(c.exit_code == 0 for c in everything)
            self.phase = "Succeeded" if ok and not self.killing else "Failed"
        else:
            self.phase = "Failed"
        # A container that never started (an earlier one failed, or the pod was stopped first) stays
        # waiting, as the kubelet leaves it.
        self._report()

    def _stopping(self) -> bool:
        return self.killing or bool(self.reason)

    def _wait_for(self, group: list[Container]) -> None:
        """Until every container of `group` has exited, handling deletion and activeDeadlineSeconds."""
        while True:
            for c in group:
                if c.proc is not None and c.exit_code is None and c.proc.poll() is not None:
                    self._exited(c)
                    self._report()
            if all(c.exit_code is not None for c in group):
                return
            with self.lock:
                pod = self.pod
            meta, spec = pod["metadata"], pod["spec"]
            if meta.get("deletionTimestamp") and not self.killing:
                self.killing = True
                self._kill_all(int(meta.get("deletionGracePeriodSeconds", 30)))
            deadline = spec.get("activeDeadlineSeconds")
            if deadline is not None and not self.reason and _age(self.start_time) >= int(deadline):
                self.reason = "DeadlineExceeded"
                self.message = "Pod was active on the node longer than the specified deadline"
                self._kill_all(int(spec.get("terminationGracePeriodSeconds", 30)))
            self.changed.wait(0.2)
            self.changed.clear()

    def _exited(self, c: Container) -> None:
        assert c.proc is not None
        rc = c.proc.returncode
        c.exit_code = signal_exit(rc)  # a signalled process: 128+N, as a container runtime reports it
        c.reason = "Completed" if c.exit_code == 0 else "Error"
        c.finished_at = now()

    def _kill_all(self, grace: int) -> None:
        """SIGTERM each running container's process group, SIGKILL what is left after `grace` seconds."""
        running = [c for c in self.init_containers + self.containers
                   if c.proc is not None and c.exit_code is None and c.proc.poll() is None]
        for c in running:
            _signal_pid1(c, signal.SIGTERM)
        end = time.monotonic() + grace
        while time.monotonic() < end and any(c.proc.poll() is None for c in running):  # type: ignore[union-attr]
            time.sleep(0.1)
        for c in running:
            _signal_pid1(c, signal.SIGKILL)
            _signal_group(c.proc, signal.SIGKILL)  # type: ignore[arg-type]
        for c in running:
            c.proc.wait()  # type: ignore[union-attr]
            self._exited(c)

    def _finish_deletion(self) -> None:
        """After the processes have stopped: a pod being deleted is deleted for good (grace 0, this uid).
        `done` is set before the newest pod is read, and the watch thread updates the pod before it reads
        `done`, so one of the two sees a deletion that races with the end."""
        with self.lock:
            pod = self.pod
        if pod["metadata"].get("deletionTimestamp"):
            delete_now(self.kube, pod)
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- status ---
    def _report(self) -> None:
        with self.lock:
            pod = self.pod
        old = {c["type"]: c for c in pod.get("status", {}).get("conditions", [])}
        inits_done = all(c.exit_code == 0 for c in self.init_containers)
        ready = self.phase == "Running" and all(c.proc is not None and c.exit_code is None for c in self.containers)

        def cond(kind: str, ok: bool, reason: str = "") -> dict[str, Any]:
            status = "True" if ok else "False"
            prev = old.get(kind)
            since = prev["lastTransitionTime"] if prev and prev.get("status") == status else now()
            return {"type": kind, "status": status, "lastTransitionTime": since,
                    **({"reason": reason} if reason and not ok else {})}

        conditions = [c for c in old.values() if c["type"] == "PodScheduled"] + [
            cond("PodReadyToStartContainers", self.phase not in TERMINAL),
            cond("Initialized", inits_done, "ContainersNotInitialized"),
            cond("Ready", ready, "PodCompleted" if self.phase in TERMINAL else "ContainersNotReady"),
            cond("ContainersReady", ready, "PodCompleted" if self.phase in TERMINAL else "ContainersNotReady"),
        ]
        status: dict[str, Any] = {
            "phase": self.phase, "conditions": conditions, "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}], "startTime": self.start_time,
            "containerStatuses": [c.status() for c in self.containers],
            "reason": self.reason or None, "message": self.message or None,
        }
        if self.init_containers:
            status["initContainerStatuses"] = [c.status() for c in self.init_containers]
        try:
            self.kube.merge_patch(f"/api/v1/namespaces/{self.ns}/pods/{self.name}/status",
                                  {"metadata": {"uid": self.uid}, "status": status})
        except ApiError as e:
            if e.code not in (404, 409):
                print(f"node-agent: status of {self.ns}/{self.name}: {e}", flush=True)

    # --- volumes ---
    def _volumes(self) -> dict[str, Path]:
        """Each volume materialized under the pod's folder (or the host path itself), by name."""
        out: dict[str, Path] = {}
        for v in self.pod["spec"].get("volumes", []):
            d = self.dir / "volumes" / v["name"]
            if "emptyDir" in v:
                d.mkdir(parents=True, exist_ok=True)
            elif "hostPath" in v:
                d = Path(v["hostPath"]["path"])
                if v["hostPath"].get("type") in ("DirectoryOrCreate",):
                    d.mkdir(parents=True, exist_ok=True)
            elif "configMap" in v:
                self._write_files(d, self._source("configMap", v["configMap"]), v["configMap"])
            elif "secret" in v:
                self._write_files(d, self._source("secret", v["secret"]), v["secret"])
            elif "downwardAPI" in v:
                self._write_files(d, self._downward(v["downwardAPI"]["items"]), v["downwardAPI"], items=False)
            elif "projected" in v:
                d.mkdir(parents=True, exist_ok=True)
                mode = v["projected"].get("defaultMode", 0o644)
                for src in v["projected"].get("sources", []):
                    if "serviceAccountToken" in src:
                        t = src["serviceAccountToken"]
                        _write(d / t["path"], self._token(t), 0o600)
                    elif "configMap" in src:
                        self._write_files(d, self._source("configMap", src["configMap"]),
                                          {**src["configMap"], "defaultMode": mode}, clear=False)
                    elif "secret" in src:
                        self._write_files(d, self._source("secret", src["secret"]),
                                          {**src["secret"], "defaultMode": mode}, clear=False)
                    elif "downwardAPI" in src:
                        self._write_files(d, self._downward(src["downwardAPI"]["items"]), {"defaultMode": mode},
                                          items=False, clear=False)
                    else:
                        raise PodFailed("FailedMount", f"projected source {sorted(src)} is not supported here")
            else:
                kinds = sorted(k for k in v if k != "name")
                raise PodFailed("FailedMount", f"volume {v['name']}: type {kinds} is not supported by the node agent")
            out[v["name"]] = d
        return out

    def _source(self, kind: str, ref: dict[str, Any]) -> dict[str, bytes]:
        name = ref.get("name") or ref.get("secretName")
        path = f"/api/v1/namespaces/{self.ns}/{'configmaps' if kind == 'configMap' else 'secrets'}/{name}"
        obj = self.kube.get(path, ok404=True)
        if obj is None:
            if ref.get("optional"):
                return {}
            raise PodFailed("FailedMount", f"{kind} {name!r} not found in namespace {self.ns}")
        if kind == "secret":
            return {k: base64.b64decode(v) for k, v in obj.get("data", {}).items()}
        data = {k: v.encode() for k, v in obj.get("data", {}).items()}
        data.update({k: base64.b64decode(v) for k, v in obj.get("binaryData", {}).items()})
        return data

    def _downward(self, items: list[dict[str, Any]]) -> dict[str, bytes]:
        out = {}
        for it in items:
            if "fieldRef" in it:
                out[it["path"]] = _field(self.pod, it["fieldRef"]["fieldPath"]).encode()
            else:
                out[it["path"]] = self._resource(it["resourceFieldRef"]).encode()
        return out

    def _resource(self, ref: dict[str, Any]) -> str:
        c = next((c for c in self.pod["spec"]["containers"] if c["name"] == ref.get("containerName")),
                 self.pod["spec"]["containers"][0])
        kind, res = ref["resource"].split(".", 1)
        value = c.get("resources", {}).get(kind, {}).get(res)
        if value is None:  # no limit: the node's capacity, as the kubelet reports
            value = str(os.cpu_count()) if res == "cpu" else str(_mem_bytes())
        return str(value)

    def _write_files(self, d: Path, data: dict[str, bytes], src: dict[str, Any], items: bool = True,
                     clear: bool = True) -> None:
        if clear and d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True, exist_ok=True)
        mode = src.get("defaultMode", 0o644)
        if items and src.get("items"):
            for it in src["items"]:
                if it["key"] not in data:
                    if src.get("optional"):
                        continue
                    raise PodFailed("FailedMount", f"key {it['key']!r} is missing from {src.get('name')}")
                _write(d / it["path"], data[it["key"]], it.get("mode", mode))
        else:
            for k, v in data.items():
                _write(d / k, v, mode)

    def _token(self, t: dict[str, Any]) -> bytes:
        sa = self.pod["spec"].get("serviceAccountName") or "default"
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": [t["audience"]] if t.get("audience") else [],
                         "expirationSeconds": int(t.get("expirationSeconds", 3607)),
                         "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": self.name, "uid": self.uid}}}
        r = self.kube.post(f"/api/v1/namespaces/{self.ns}/serviceaccounts/{sa}/token", body)
        return r["status"]["token"].encode()

    # --- containers ---
    def _env(self, c: dict[str, Any], executor: bool) -> dict[str, str]:
        port = self.cfg["server"].rsplit(":", 1)[1]
        path = f"{self.cfg['bin']}:{SYSTEM_PATH}" if executor else f"{REPO / '.venv' / 'bin'}:{SYSTEM_PATH}"
        env = {"PATH": path, "HOME": "/root", "HOSTNAME": self.name, "LANG": "C.UTF-8",
               "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port,
               "KUBERNETES_SERVICE_PORT_HTTPS": port, "KUBERNETES_PORT": f"tcp://127.0.0.1:{port}",
               self.cfg["marker"]: self.cfg["state"]}
        for ef in c.get("envFrom", []):
            kind = "configMap" if "configMapRef" in ef else "secret"
            ref = ef.get("configMapRef") or ef.get("secretRef") or {}
            for k, v in self._source(kind, ref).items():
                env[ef.get("prefix", "") + k] = v.decode(errors="replace")
        for e in c.get("env", []):
            if "valueFrom" not in e:
                env[e["name"]] = expand(e.get("value", ""), env)
                continue
            vf = e["valueFrom"]
            if "fieldRef" in vf:
                env[e["name"]] = _field(self.pod, vf["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in vf:
                env[e["name"]] = self._resource({"containerName": c["name"], **vf["resourceFieldRef"]})
            else:
                kind = "configMap" if "configMapKeyRef" in vf else "secret"
                ref = vf.get("configMapKeyRef") or vf.get("secretKeyRef") or {}
                data = self._source(kind, ref)
                if ref["key"] in data:
                    env[e["name"]] = data[ref["key"]].decode(errors="replace")
                elif not ref.get("optional"):
                    raise PodFailed("CreateContainerConfigError",
                                    f"couldn't find key {ref['key']} in {kind} {self.ns}/{ref.get('name')}")
        return env

    def _launch(self, c: Container, volumes: dict[str, Path]) -> None:
        spec = c.spec
        executor = spec.get("image", "").startswith(self.cfg["executor_image_prefix"])
        try:
            env = self._env(spec, executor)
        except PodFailed as e:
            c.exit_code, c.reason, c.message, c.finished_at = 1, e.reason, e.message, now()
            return
        argv = [expand(a, env) for a in spec.get("command", []) + spec.get("args", [])]
        if not argv:
            c.exit_code, c.reason, c.finished_at = 1, "CreateContainerError", now()
            c.message = "no command or args: images are not run here, only host processes"
            return
        workdir = spec.get("workingDir") or ("/" if executor else str(REPO))
        mounts = list(spec.get("volumeMounts", []))
        # A private /tmp, as an image would give: pods never share the host's /tmp (an Argo output
        # parameter at /tmp/x is the pod's own). Host files reach a pod through a hostPath volume.
        if not any(m["mountPath"].rstrip("/") == "/tmp" for m in mounts):
            (self.dir / "tmp" / c.name).mkdir(parents=True, exist_ok=True)
            volumes = dict(volumes, **{"\0tmp": self.dir / "tmp" / c.name})
            mounts.append({"name": "\0tmp", "mountPath": "/tmp"})
        # The host's own files stand in for the image: the repository (with its .venv) and the built binaries.
        # A mount path above one of them (the private /tmp, when the clone lives under /tmp, as a CI folder
        # may) would hide them, and the container could not even cd to its working directory: bind each
        # back at its own path, after the mount above it (the depth order below).
        for k, host in enumerate((REPO, Path(self.cfg["bin"]))):
            over = [m for m in mounts if host.is_relative_to(m["mountPath"].rstrip("/") or "/")]
            if over and not any(Path(m["mountPath"]) == host for m in over):
                volumes = dict(volumes, **{f"\0host{k}": host})
                mounts.append({"name": f"\0host{k}", "mountPath": str(host)})
        # Each source is first bound under a tmpfs of this namespace, then onto its mount path, parents
        # before children: a mount path (/tmp) that hides a later source (the state folder under /tmp) or
        # a child mount's source then hides nothing that is still needed.
        stage = "/run/baton-stage"
        lines = ["set -e", f"mkdir -p {stage}", f"mount -t tmpfs -o size=1m tmpfs {stage}"]
        ordered = sorted(mounts, key=lambda m: m["mountPath"].rstrip("/").count("/"))
        is_dir = []
        for i, m in enumerate(ordered):
            src = volumes.get(m["name"])
            if src is None:
                c.exit_code, c.reason, c.finished_at = 1, "CreateContainerConfigError", now()
                c.message = f"volumeMount {m['name']} names no volume"
                return
            if m.get("subPath"):
                src = src / m["subPath"]
                if not src.exists():
                    src.mkdir(parents=True)
            is_dir.append(src.is_dir())
            lines += [f"{'mkdir -p' if is_dir[i] else 'touch'} {stage}/{i}",
                      f"mount --bind {shlex.quote(str(src))} {stage}/{i}"]
        for i, m in enumerate(ordered):
            dst = shlex.quote(m["mountPath"])
            if is_dir[i]:
                lines.append(f"mkdir -p {dst}")
            else:
                lines.append(f'mkdir -p "$(dirname {dst})"; [ -e {dst} ] || touch {dst}')
            lines.append(f"mount --bind {stage}/{i} {dst}")
            if m.get("readOnly"):
                lines.append(f"mount -o remount,bind,ro {dst}")
        lines.append(f"umount -l {stage}")
        lines.append(f"cd {shlex.quote(workdir)}")
        lines.append('exec "$@"')
        script = self.dir / f"start-{c.name}.sh"
        script.write_text("\n".join(lines) + "\n")
        log = open(self.log_path(c.name), "ab")  # noqa: SIM115 -- the child keeps it; closed below
        try:
            c.proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc", "--",
                 "/bin/sh", str(script), *argv],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd="/",
                start_new_session=True)
        except OSError as e:
            c.exit_code, c.reason, c.message, c.finished_at = 128, "StartError", str(e), now()
        finally:
            log.close()
        c.started_at = now()
        if c.proc is not None:
            c.pid1 = _child_of(c.proc)
        (self.dir / f"{c.name}.json").write_text(json.dumps({"argv": argv, "pid": c.proc.pid if c.proc else None}))


def _child_of(proc: subprocess.Popen[bytes]) -> int | None:
    """unshare's one child: the container's PID 1 (unshare --fork stays outside the new PID namespace)."""
    for _ in range(250):
        try:
            kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        except OSError:
            return None
        if kids:
            return int(kids[0])
        if proc.poll() is not None:
            return None
        time.sleep(0.02)
    return None


def _signal_pid1(c: Container, sig: int) -> None:
    """Signal the container's PID 1 only, as the kubelet does (with no handler, PID 1 ignores SIGTERM, as in a
    container). Checked to be still unshare's child, so a recycled pid is never hit. When PID 1 of a PID
    namespace dies, the kernel kills the rest of that namespace."""
    if c.pid1 is None or c.proc is None:
        return
    try:
        stat = Path(f"/proc/{c.pid1}/stat").read_text()
        if int(stat.rsplit(")", 1)[1].split()[1]) != c.proc.pid:
            return
        os.kill(c.pid1, sig)
    except (OSError, ValueError):
        pass


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.pid <= 1:  # never kill(-1) or our own group
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def delete_now(kube: Kube, pod: dict[str, Any]) -> None:
    """Delete this pod (its uid only) with grace 0, as the kubelet does once its containers have stopped."""
    meta = pod["metadata"]
    try:
        kube.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                    {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                     "preconditions": {"uid": meta["uid"]}})
    except ApiError as e:
        if e.code != 409:  # 409: another pod of that name now; ours is gone
            print(f"node-agent: deleting {meta['namespace']}/{meta['name']}: {e}", flush=True)


def _write(p: Path, data: bytes, mode: int) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    p.chmod(mode)


def _age(start: str) -> float:
    return time.time() - datetime.strptime(start, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _mem_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0
