"""One local cluster for the whole e2e session (every module), in a temporary state folder, brought down at
the end whatever happens; the teardown then checks that none of its processes is left."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.localcluster import (
    REPO,
    SMALL,
    WORKERS_CONFIGS,
    Drill,
    Local,
    alive,
    cond,
    submit,
    wait,
    watch,
    why_skip,
)


def _host() -> dict[str, Any]:
    """What the node may change on the host and must give back: the kernel settings the kubelet requires, the
    NAT table, the v1 cgroup hierarchies' kubepods trees, what containerd left in /run/containerd."""
    from infra.local.kubelet import CGROUP_ROOT, KERNEL_SETTINGS, RUN_DIR

    nat = subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True).stdout
    return {
        "sysctl": {k: Path("/proc/sys", k).read_text().strip() for k in KERNEL_SETTINGS},
        "nat": sorted(line for line in nat.splitlines() if "baton-local" in line),
        "kubepods": sorted(str(d) for d in CGROUP_ROOT.glob("*/kubepods")),
        "run_containerd": sorted(str(p) for p in RUN_DIR.rglob("*")) if RUN_DIR.exists() else None,
    }


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    if why_skip():
        pytest.skip(why_skip())
    local = Local(tmp_path_factory.mktemp("cluster-state"))
    before = _host()
    t0 = time.monotonic()
    up = local.cli("up", timeout=1800)  # the first up imports the images into containerd
    pids: list[int] = []
    try:
        assert up.returncode == 0, f"cluster up failed: {up.stderr.strip()}"
        print(f"\n[e2e] {up.stdout.strip().splitlines()[0]} (measured {time.monotonic() - t0:.1f} s)")
        pids = local.pids()
        yield local
    finally:
        if (local.state / "pids.json").exists() and not pids:
            pids = local.pids()
        down = local.cli("down")
        assert down.returncode == 0, f"cluster down failed: {down.stderr.strip()}"
        print(f"\n[e2e] {down.stdout.strip()}")
        left = [p for p in pids if alive(p)]
        assert not left, f"processes left running after down: {left}"
        sock = str(local.state / "containerd" / "containerd.sock").encode()
        shims = [d.name for d in Path("/proc").iterdir() if d.name.isdigit() and _argv_has(d, sock)]
        assert not shims, f"containerd shims left running after down: {shims}"
        mounts = [
            line.split()[4]
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split()[4].startswith(str(local.state))
        ]
        assert not mounts, f"mounts left after down: {mounts}"
        assert _host() == before, f"the host is not as it was before up: {before} -> {_host()}"


def _argv_has(proc: Path, word: bytes) -> bool:
    try:
        return word in (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


@pytest.fixture(scope="session")
def drill(cluster: Local) -> Drill:
    """One small drill, submitted through the Argo Server as a user does and watched to its end, whose trainer's
    data loader has two worker processes: what test_drill_real_argo.py asserts on, and what test_argo_ui.py
    watches in the UI (one drill for both: each costs minutes on two cores)."""
    env = cluster.user_env()
    t0 = time.monotonic()
    name = submit(cluster, env, *SMALL, "-p", f"config={WORKERS_CONFIGS['trainer/configs/tiny.yaml']}")
    phase, status = watch(env, name)
    print(f"\n[e2e] drill {name}: {phase} after {time.monotonic() - t0:.0f} s\n{status.stdout}")
    return Drill(name, phase, status, env)


# The local-kueue overlay: its ResourceFlavor, ClusterQueue baton-local and LocalQueue baton.
KUEUE_OVERLAY = REPO / "templates" / "overlays" / "local-kueue"


@contextmanager
def kueue_added(cluster: Local, *up_args: str) -> Iterator[Local]:
    """Kueue added to the session's cluster (`up --kueue`, with `up_args`), with the local-kueue overlay's
    queues, and removed at the end (`down --kueue` unregisters the webhooks first), so the other modules
    see the cluster without it. Skips when Kueue is not built."""
    from infra.local.kueue import MUTATING, VALIDATING, why_not_built

    if why_not_built():
        pytest.skip(f"Kueue not built (make cluster-build-kueue): {why_not_built()}")
    t0 = time.monotonic()
    up = cluster.cli("up", "--kueue", *up_args)
    try:
        assert up.returncode == 0, f"up --kueue failed: {up.stderr.strip()}"
        print(f"\n[e2e] {up.stdout.strip().splitlines()[-1]} (measured {time.monotonic() - t0:.1f} s)")
        objs = subprocess.run(
            ["kubectl", "kustomize", str(KUEUE_OVERLAY)], capture_output=True, text=True, check=True
        )
        docs = [
            d for d in yaml.safe_load_all(objs.stdout) if d and d["apiVersion"].startswith("kueue.x-k8s.io/")
        ]
        assert {d["kind"] for d in docs} == {"ResourceFlavor", "ClusterQueue", "LocalQueue"}, docs
        cluster.kubectl(
            "apply",
            "--server-side",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}),
        )
        wait(
            lambda: cond(cluster.get("clusterqueue", "baton-local"), "Active") == "True",
            60,
            "ClusterQueue baton-local Active",
        )
        yield cluster
    finally:
        down = cluster.cli("down", "--kueue")
        assert down.returncode == 0, f"down --kueue failed: {down.stderr.strip()}"
        left = cluster.kubectl(
            "get", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "-o", "name"
        )
        assert MUTATING not in left and VALIDATING not in left, left
        info = json.loads((cluster.state / "pids.json").read_text())
        assert "kueue" not in info["procs"], info["procs"].keys()


@pytest.fixture(scope="module")
def kueue(cluster: Local) -> Iterator[Local]:
    """Kueue as `up --kueue` configures it (waitForPodsReady 5 min, recovery 3 min)."""
    with kueue_added(cluster) as k:
        yield k


PODS_READY_S = 20


@pytest.fixture(scope="module")
def kueue_quick_ready(cluster: Local) -> Iterator[Local]:
    """Kueue with waitForPodsReady's timeout and recoveryTimeout at PODS_READY_S seconds."""
    with kueue_added(cluster, "--kueue-pods-ready-timeout", str(PODS_READY_S)) as k:
        yield k


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    """The plain closing line issue #35 asks of `make e2e`: `e2e: N passed, N failed` (errors count as
    failed; skips are named when there are any)."""
    stats = terminalreporter.stats
    passed = len([r for r in stats.get("passed", []) if getattr(r, "when", "call") == "call"])
    failed = len(stats.get("failed", [])) + len(stats.get("error", []))
    skipped = len(stats.get("skipped", []))
    terminalreporter.write_line(
        f"e2e: {passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else "")
    )
