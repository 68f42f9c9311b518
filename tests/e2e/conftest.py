"""One local cluster for the whole e2e session (every module), in a temporary state folder, brought down at
the end whatever happens; the teardown then checks that none of its processes is left."""
from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tests.e2e.localcluster import (
    REPO,
    SMALL,
    Drill,
    Local,
    alive,
    cond,
    submit,
    wait,
    watch,
    why_skip,
    workers_config,
)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    if why_skip():
        pytest.skip(why_skip())
    local = Local(tmp_path_factory.mktemp("cluster-state"))
    t0 = time.monotonic()
    up = local.cli("up")
    pids: list[int] = []
    try:
        assert up.returncode == 0, f"cluster up failed: {up.stderr.strip()}"
        print(f"\n[e2e] {up.stdout.strip().splitlines()[0]} (measured {time.monotonic() - t0:.1f} s)")
        pids = local.pids()
        yield local
    finally:
        if (local.state / "pids.json").exists() and not pids:
            pids = local.pids()
        marker = f"BATON_LOCAL_POD_OF={local.state}".encode()
        down = local.cli("down")
        assert down.returncode == 0, f"cluster down failed: {down.stderr.strip()}"
        left = [p for p in pids if alive(p)]
        assert not left, f"processes left running after down: {left}"
        strays = []
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and marker in (d / "environ").read_bytes().split(b"\0"):
                    strays.append(int(d.name))
            except OSError:
                continue
        assert not strays, f"pod processes left running after down: {strays}"


@pytest.fixture(scope="session")
def drill(cluster: Local) -> Drill:
    """One small drill, submitted through the Argo Server as a user does and watched to its end, whose trainer's
    data loader has two worker processes: what test_drill_real_argo.py asserts on, and what test_argo_ui.py
    watches in the UI (one drill for both: each costs minutes on two cores)."""
    env = cluster.user_env()
    t0 = time.monotonic()
    name = submit(cluster, env, *SMALL, "-p", f"config={workers_config('trainer/configs/tiny.yaml')}")
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
        objs = subprocess.run(["kubectl", "kustomize", str(KUEUE_OVERLAY)], capture_output=True, text=True,
                              check=True)
        docs = [d for d in yaml.safe_load_all(objs.stdout) if d and d["apiVersion"].startswith("kueue.x-k8s.io/")]
        assert {d["kind"] for d in docs} == {"ResourceFlavor", "ClusterQueue", "LocalQueue"}, docs
        cluster.kubectl("apply", "--server-side", "-f", "-",
                        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
        wait(lambda: cond(cluster.get("clusterqueue", "baton-local"), "Active") == "True", 60,
             "ClusterQueue baton-local Active")
        yield cluster
    finally:
        down = cluster.cli("down", "--kueue")
        assert down.returncode == 0, f"down --kueue failed: {down.stderr.strip()}"
        left = cluster.kubectl("get", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "-o", "name")
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

def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    """The plain closing line issue #35 asks of `make e2e`: `e2e: N passed, N failed` (errors count as
    failed; skips are named when there are any)."""
    stats = terminalreporter.stats
    passed = len([r for r in stats.get("passed", []) if getattr(r, "when", "call") == "call"])
    failed = len(stats.get("failed", [])) + len(stats.get("error", []))
    skipped = len(stats.get("skipped", []))
    terminalreporter.write_line(f"e2e: {passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
