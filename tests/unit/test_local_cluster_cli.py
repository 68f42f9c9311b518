"""The local control plane's tooling on bad input, without its binaries (tests/e2e runs the cluster itself):
each case ends in one clear line and leaves nothing behind. Controls: the same commands succeed, or say
something else, when the condition is removed."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

BUILD = REPO / "infra" / "local" / "build.sh"


def _env(tmp_path: Path, path: str | None = None) -> dict[str, str]:
    env = dict(
        os.environ, BATON_CLUSTER_CACHE=str(tmp_path / "cache"), BATON_CLUSTER_STATE=str(tmp_path / "state")
    )
    if path is not None:
        env["PATH"] = path
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def _fake_go(tmp_path: Path, version: str) -> str:
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    go = bindir / "go"
    go.write_text(f"#!/bin/sh\n[ \"$1 $2\" = 'env GOVERSION' ] && echo go{version} && exit 0\nexit 3\n")
    go.chmod(go.stat().st_mode | stat.S_IXUSR)
    return f"{bindir}:/usr/bin:/bin"


def test_a_build_without_go_says_so_in_one_line_and_makes_no_cache(tmp_path):
    # The shell's tools without go: every command of /usr/bin and /bin but go, linked into one folder.
    tools = tmp_path / "no-go-bin"
    tools.mkdir()
    for d in (Path("/bin"), Path("/usr/bin")):
        for exe in d.iterdir():
            if exe.name != "go" and not (tools / exe.name).exists():
                (tools / exe.name).symlink_to(exe)
    assert shutil.which("go", path=str(tools)) is None and shutil.which("sha256sum", path=str(tools))
    r = _run(["bash", str(BUILD)], _env(tmp_path, str(tools)))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        "error: no 'go' on PATH: the local control plane is built from Go modules and needs Go >= 1.26.0"
    ]
    assert not (tmp_path / "cache").exists()


def test_a_go_older_than_the_modules_need_is_refused_by_version(tmp_path):
    r = _run(["bash", str(BUILD)], _env(tmp_path, _fake_go(tmp_path, "1.22.5")))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Go 1.22.5 is older than 1.26.0" in r.stderr
    assert not (tmp_path / "cache").exists()


def test_check_names_a_missing_and_a_stale_cache_and_accepts_a_complete_one(tmp_path):
    env = _env(tmp_path)
    dest = Path(_run(["bash", str(BUILD), "--print-dir"], env).stdout.strip())
    r = _run(["bash", str(BUILD), "--check"], env)
    assert r.returncode == 1 and "not built; run: bash infra/local/build.sh" in r.stderr
    # A build cut short: binaries there, no stamp. It must never pass for a finished one.
    (dest / "bin").mkdir(parents=True)
    (dest / "crds").mkdir()
    (dest / "crds" / "x.yaml").write_text("x")
    binaries = re.search(r"^BINARIES=\((.*)\)$", BUILD.read_text(), re.M).group(1).split()  # build.sh's list
    assert "argo" in binaries and "kubelet" in binaries, binaries
    for b in binaries:
        (dest / "bin" / b).write_text("#!/bin/sh\n")
        (dest / "bin" / b).chmod(0o755)
    r = _run(["bash", str(BUILD), "--check"], env)
    assert r.returncode == 1 and "incomplete (no .complete stamp: a build cut short)" in r.stderr, r.stderr
    (dest / ".complete").write_text("")
    (dest / "bin" / "argo").unlink()
    r = _run(["bash", str(BUILD), "--check"], env)
    assert r.returncode == 1 and "incomplete (bin/argo is missing)" in r.stderr, r.stderr
    shutil.copy(dest / "bin" / "etcd", dest / "bin" / "argo")
    assert _run(["bash", str(BUILD), "--check"], env).returncode == 0  # control: a complete one passes


def test_down_and_status_with_nothing_running_say_so(tmp_path):
    env = _env(tmp_path)
    down = _run([sys.executable, "-m", "infra.local.cluster", "down"], env)
    assert (
        down.returncode == 0 and down.stdout.strip() == f"cluster: not running (state {tmp_path / 'state'})"
    )
    status = _run([sys.executable, "-m", "infra.local.cluster", "status"], env)
    assert status.returncode == 1 and "not running" in status.stdout
    assert "Traceback" not in down.stderr + status.stderr


def test_up_without_the_binaries_names_the_build_and_starts_nothing(tmp_path):
    r = _run([sys.executable, "-m", "infra.local.cluster", "up"], _env(tmp_path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: cluster binaries in {Path(_run(['bash', str(BUILD), '--print-dir'], _env(tmp_path)).stdout.strip())}"
        ": not built; run: bash infra/local/build.sh"
    ]
    assert not (tmp_path / "state" / "pids.json").exists()


def test_down_signals_only_the_processes_it_started_and_counts_only_those(tmp_path):
    """pids.json names each component by pid and start time. One written inside another PID namespace (an e2e
    session's `up`) names pids that mean other processes here: `down` must leave a process whose start time
    differs alone, and say nothing was running. Control: with its true start time, the same process is stopped."""
    import json

    from infra.local.components import _start_time

    state = tmp_path / "state"
    state.mkdir()
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        entry = {
            "pid": victim.pid,
            "start": "1",
            "log": str(tmp_path / "etcd.log"),
        }  # another process's start
        (state / "pids.json").write_text(json.dumps({"procs": {"etcd": entry}, "ports": {}}))
        down = _run([sys.executable, "-m", "infra.local.cluster", "down"], _env(tmp_path))
        assert down.returncode == 0 and down.stdout.strip() == f"cluster: not running (state {state})", (
            down.stdout
        )
        assert victim.poll() is None  # untouched
        entry["start"] = _start_time(victim.pid)
        (state / "pids.json").write_text(json.dumps({"procs": {"etcd": entry}, "ports": {}}))
        down = _run([sys.executable, "-m", "infra.local.cluster", "down"], _env(tmp_path))
        assert down.returncode == 0 and "(1 components stopped)" in down.stdout, down.stdout + down.stderr
        assert victim.wait(timeout=30) is not None
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
