"""The local cluster's node: containerd (Debian's package, its CRI plugin) and the kubelet (built from
k8s.io/kubernetes at the pinned version by build.sh), registered with the real API server as node baton-local.
Every pod is a set of real containers run by runc from images that infra/local/image.sh built (baton's own, Argo's
executor, the pause sandbox), with the limits of its spec enforced by cgroups (v1 on this host).

What this node does to the host, and how each is undone (`down`, or the next `up` after a crash):
- six kernel settings the kubelet requires (`setupKernelTunables`, pkg/kubelet/cm/container_manager_linux.go:
  it writes them unless `protectKernelDefaults`, and no setting leaves them alone): recorded, set here, checked by
  the kubelet (`protectKernelDefaults: true`), restored from the record;
- one NAT rule that sends the `kubernetes` Service's address (10.96.0.1:443, which the kubelet gives every
  container as KUBERNETES_SERVICE_HOST) to the API server on 127.0.0.1: there is no kube-proxy; removed by its
  comment;
- the cgroups the kubelet creates (`kubepods` in each v1 hierarchy) and the mounts under the state folder.
containerd keeps its root, state and socket in the state folder; its shims' sockets and runc's state still go to
/run/containerd (containerd 1.6 puts them there whatever its configuration says): `down` removes those folders
once they are empty.

Pods use the host's network (the local overlay sets hostNetwork): the bucket (moto) and the API server listen on
127.0.0.1, and a pod network would need a proxy for both. The node's address is the host's own (the kubelet
refuses a loopback node IP).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from infra.local.components import NODE_NAME, ClusterError, _signed, spawn

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "infra" / "local" / "image.sh"
SERVICE_HOST = "10.96.0.1"  # the first address of the API server's --service-cluster-ip-range 10.96.0.0/24
CGROUP_ROOT = Path("/sys/fs/cgroup")
# pkg/kubelet/cm/container_manager_linux.go, setupKernelTunables (values from component-helpers' sysctl.go).
KERNEL_SETTINGS = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}
CNI_BIN = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
HOST_TOOLS = {
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "runc": "runc",
    "ctr": "containerd",
    "iptables": "iptables",
}
NAMESPACE_K8S = "k8s.io"  # containerd's namespace for CRI


def missing_tools() -> list[str]:
    """Debian packages to install for the node (empty when every tool is there)."""
    pkgs = {pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None}
    if not (CNI_BIN / "loopback").exists():
        pkgs.add("containernetworking-plugins")
    return sorted(pkgs)


def node_ip() -> str:
    """The host's address on its default route: the kubelet's node IP (a loopback one is refused)."""
    out = subprocess.run(["ip", "-4", "-o", "route", "get", "192.0.2.255"], capture_output=True, text=True)
    words = out.stdout.split()
    if out.returncode or "src" not in words:
        raise ClusterError(
            f"no IPv4 address on a default route for the node (ip route get: {out.stderr.strip()})"
        )
    return words[words.index("src") + 1]


def image_archives() -> list[Path]:
    """The archives of the images that image.sh built last (its `current` list), checked there by --check."""
    folder = Path(
        subprocess.run(
            ["bash", str(IMAGES), "--print-dir"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    return [folder / name for name in (folder / "current").read_text().split()]


def pause_image(bin_dir: Path) -> str:
    """The sandbox image's name: the tag of Kubernetes' pause that build.sh compiled (bin/pause.tag)."""
    return f"registry.k8s.io/pause:{(bin_dir / 'pause.tag').read_text().strip()}"


class Paths:
    """Where the node keeps what it writes, all under the cluster's state folder."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.containerd = state / "containerd"
        self.sock = self.containerd / "containerd.sock"
        self.containerd_config = self.containerd / "config.toml"
        self.cni = state / "cni" / "net.d"
        self.kubelet = state / "kubelet"
        self.kubelet_config = state / "kubelet-config.json"
        self.kubelet_kubeconfig = state / "kubelet.kubeconfig"
        self.pod_logs = state / "pod-logs"
        self.host = state / "host-changes.json"


def containerd_config(p: Paths, pause_image: str) -> str:
    """containerd 1.6's configuration (version 2). `restrict_oom_score_adj`: runc cannot lower a sandbox's
    oom_score_adj below 0 here (no CAP_SYS_RESOURCE), and the CRI plugin asks for -998 without it."""
    return f'''version = 2
root = "{p.containerd / "root"}"
state = "{p.containerd / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{p.sock}"
[ttrpc]
  address = "{p.containerd / "ttrpc.sock"}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{p.containerd / "opt"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{p.cni}"
'''


def cni_config() -> dict[str, Any]:
    """No pod network: every pod uses the node's (hostNetwork). containerd's CRI still wants a network
    configuration, or it reports NetworkReady false and the node stays NotReady; this one only brings up the
    loopback device, so a pod without hostNetwork fails at its sandbox ("failed to find network info"), in its
    events, instead of starting where it could reach neither the API server nor the bucket."""
    return {"cniVersion": "0.4.0", "name": "baton-no-pod-network", "plugins": [{"type": "loopback"}]}


def kubelet_config(p: Paths, pki: Path, ip: str, port: int, healthz_port: int) -> dict[str, Any]:
    """The kubelet's KubeletConfiguration (k8s.io/kubelet config/v1beta1): x509 and webhook authentication, the
    API server's SubjectAccessReviews for authorization, cgroup v1 through cgroupfs (containerd 1.6 does not
    answer RuntimeConfig, so the kubelet's own driver is used), the kernel settings checked, not written."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": ip,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(pki / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(pki / "kubelet-serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{p.sock}",
        "imageServiceEndpoint": f"unix://{p.sock}",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "cgroupsPerQOS": True,
        "cgroupRoot": "/",
        "enforceNodeAllocatable": ["pods"],
        "protectKernelDefaults": True,
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
        "podLogsDir": str(p.pod_logs),
        "resolvConf": "/etc/resolv.conf",
        "registerNode": True,
        "serializeImagePulls": False,
        # Images are imported, never pulled: none may be collected. Disk-pressure eviction would evict the drill
        # on a nearly full disk; memory pressure keeps the kubelet's default.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "localStorageCapacityIsolation": True,
        "shutdownGracePeriod": "0s",
    }


def prepare(
    p: Paths, pki: Path, ca: Path, server: str, ip: str, ports: dict[str, int], pause_image: str
) -> None:
    """Every file the two daemons read: their configurations, the CNI network, the kubelet's client and serving
    certificates (the serving one names the node's address, made again when the address changes)."""
    for d in (p.containerd, p.cni, p.kubelet, p.pod_logs):
        d.mkdir(parents=True, exist_ok=True)
    p.containerd_config.write_text(containerd_config(p, pause_image))
    (p.cni / "10-baton.conflist").write_text(json.dumps(cni_config(), indent=1))
    if not (pki / "kubelet-client.crt").exists():
        _signed(
            pki,
            "kubelet-client",
            f"system:node:{NODE_NAME}",
            "extendedKeyUsage=clientAuth",
            org="system:nodes",
        )
    served = pki / "kubelet-serving.ip"
    if not served.exists() or served.read_text() != ip:
        _signed(
            pki,
            "kubelet-serving",
            NODE_NAME,
            f"subjectAltName=IP:{ip},IP:127.0.0.1,DNS:{NODE_NAME}\nextendedKeyUsage=serverAuth",
        )
        served.write_text(ip)
    for f in pki.iterdir():
        f.chmod(0o600)
    p.kubelet_config.write_text(
        json.dumps(kubelet_config(p, pki, ip, ports["kubelet"], ports["kubelet_healthz"]), indent=1)
    )
    p.kubelet_kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "node",
                "clusters": [
                    {"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}
                ],
                "users": [
                    {
                        "name": "node",
                        "user": {
                            "client-certificate": str(pki / "kubelet-client.crt"),
                            "client-key": str(pki / "kubelet-client.key"),
                        },
                    }
                ],
                "contexts": [{"name": "node", "context": {"cluster": "local", "user": "node"}}],
            },
            indent=1,
        )
    )
    p.kubelet_kubeconfig.chmod(0o600)


def start_containerd(p: Paths) -> dict[str, Any]:
    return spawn("containerd", ["containerd", "--config", str(p.containerd_config)], p.state)


def ctr(p: Paths, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ctr", "--address", str(p.sock), "--namespace", NAMESPACE_K8S, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def containerd_ready(p: Paths) -> bool:
    return p.sock.exists() and ctr(p, "version", timeout=10).returncode == 0


def import_images(p: Paths, archives: list[Path]) -> list[str]:
    """Each archive whose content containerd does not hold yet (a label names the archive it came from):
    imported, so the kubelet finds the image and never pulls it. Returns the archives imported."""
    listed = ctr(p, "images", "ls").stdout
    done = []
    for archive in archives:
        mark = f"baton.dev/archive={archive.name}"
        if mark in listed:
            continue
        r = ctr(p, "images", "import", "--snapshotter", "overlayfs", str(archive), timeout=1800)
        if r.returncode:
            raise ClusterError(f"importing {archive.name} into containerd failed: {r.stderr.strip()[-300:]}")
        for line in r.stdout.splitlines():  # "unpacking NAME (sha256:...)...done"
            words = line.split()
            if len(words) > 1 and words[0] == "unpacking":
                ctr(p, "images", "label", words[1], mark)
        done.append(archive.name)
    return done


def start_kubelet(p: Paths, bin_dir: Path, ip: str) -> dict[str, Any]:
    return spawn(
        "kubelet",
        [
            str(bin_dir / "kubelet"),
            "--config",
            str(p.kubelet_config),
            "--kubeconfig",
            str(p.kubelet_kubeconfig),
            "--root-dir",
            str(p.kubelet),
            "--cert-dir",
            str(p.kubelet / "pki"),
            "--hostname-override",
            NODE_NAME,
            "--node-ip",
            ip,
            "--v",
            "2",
        ],
        p.state,
    )


# ---- what the node changes on the host, recorded so that `down` (or a later `up`) undoes it ----------------


def _nat_rule(p: Paths, api_port: int) -> list[str]:
    tag = "baton-local:" + hashlib.sha256(str(p.state).encode()).hexdigest()[:12]
    return [
        "-d",
        f"{SERVICE_HOST}/32",
        "-p",
        "tcp",
        "--dport",
        "443",
        "-m",
        "comment",
        "--comment",
        tag,
        "-j",
        "DNAT",
        "--to-destination",
        f"127.0.0.1:{api_port}",
    ]


def change_host(p: Paths, api_port: int) -> list[str]:
    """The kernel settings (recorded first, kept from the first record until they are restored) and the NAT
    rule; returns what changed, for one line at `up`."""
    record = json.loads(p.host.read_text()) if p.host.exists() else {}
    before = record.get("sysctl") or {k: int(Path("/proc/sys", k).read_text()) for k in KERNEL_SETTINGS}
    record["sysctl"] = before
    record["nat"] = _nat_rule(p, api_port)
    p.host.write_text(json.dumps(record, indent=1))
    changed = []
    for key, want in KERNEL_SETTINGS.items():
        path = Path("/proc/sys", key)
        now = int(path.read_text())
        if now != want:
            path.write_text(str(want))
            changed.append(f"{key.replace('/', '.')} {now} -> {want}")
    if subprocess.run(
        ["iptables", "-t", "nat", "-C", "OUTPUT", *record["nat"]], capture_output=True
    ).returncode:
        r = subprocess.run(
            ["iptables", "-t", "nat", "-A", "OUTPUT", *record["nat"]], capture_output=True, text=True
        )
        if r.returncode:
            raise ClusterError(
                f"iptables: the rule for the kubernetes Service's address failed: {r.stderr.strip()}"
            )
        changed.append(f"iptables nat OUTPUT: {SERVICE_HOST}:443 -> 127.0.0.1:{api_port}")
    return changed


def restore_host(p: Paths) -> list[str]:
    """Undo change_host from its record; returns what was restored."""
    if not p.host.exists():
        return []
    record = json.loads(p.host.read_text())
    done = []
    for key, value in (record.get("sysctl") or {}).items():
        path = Path("/proc/sys", key)
        if int(path.read_text()) != value:
            path.write_text(str(value))
            done.append(f"{key.replace('/', '.')} -> {value}")
    rule = record.get("nat")
    while (
        rule
        and subprocess.run(["iptables", "-t", "nat", "-D", "OUTPUT", *rule], capture_output=True).returncode
        == 0
    ):
        done.append("iptables nat rule removed")
    p.host.unlink()
    return done


# ---- stopping: containers, then mounts and cgroups ----------------------------------------------------------


def remove_containers(p: Paths) -> int:
    """Every task of containerd's CRI namespace killed and deleted, every container removed (the shims go with
    their tasks); returns how many containers there were. containerd must be running."""
    containers = ctr(p, "containers", "ls", "-q").stdout.split()
    for cid in ctr(p, "tasks", "ls", "-q").stdout.split():
        ctr(p, "tasks", "kill", "--all", "--signal", "SIGKILL", cid)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        tasks = ctr(p, "tasks", "ls").stdout.splitlines()[1:]
        if all("STOPPED" in t for t in tasks):
            break
        time.sleep(0.2)
    for cid in ctr(p, "tasks", "ls", "-q").stdout.split():
        ctr(p, "tasks", "delete", "--force", cid)
    for cid in containers:
        ctr(p, "containers", "delete", cid)
    return len(containers)


def stop_shims(p: Paths) -> int:
    """The runc shims of this containerd left after it stopped (each daemonizes, so it is not in containerd's
    process group): found by the socket address on their command line, SIGKILLed. Returns how many."""
    found = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and str(p.sock).encode() in argv:
            try:
                os.kill(int(d.name), 9)
                found += 1
            except ProcessLookupError:
                pass
    return found


def unmount_below(folder: Path) -> int:
    """Every mount at or below `folder`, deepest first (overlay rootfs, tmpfs volumes, shm); returns how many."""
    prefix = str(folder.resolve()) + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix):
            points.append(point)
    for point in sorted(set(points), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)
    return len(set(points))


RUN_DIR = Path(
    "/run/containerd"
)  # containerd 1.6's shim sockets (s/) and runc's state (runc/), whatever its config


def remove_run_dirs() -> None:
    """/run/containerd's folders, those left empty once the containers are gone (one that holds something is
    another containerd's, and stays)."""
    if not RUN_DIR.is_dir():
        return
    for d in sorted((d for d in RUN_DIR.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True):
        try:
            d.rmdir()
        except OSError:
            pass
    try:
        RUN_DIR.rmdir()
    except OSError:
        pass


def remove_cgroups() -> int:
    """The kubelet's `kubepods` tree in every v1 hierarchy, leaves first (a cgroup with a process stays and is
    counted as left). Returns how many folders remain."""
    left = 0
    for hierarchy in CGROUP_ROOT.iterdir():
        top = hierarchy / "kubepods"
        if not top.is_dir():
            continue
        for d in sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True):
            try:
                d.rmdir()
            except OSError:
                left += 1
        try:
            top.rmdir()
        except OSError:
            left += 1
    return left
