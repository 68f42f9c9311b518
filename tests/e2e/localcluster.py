"""What the e2e tests share: why they are skipped, and a handle on one running local cluster
(infra/local/cluster.py) in a temporary state folder. The cluster fixture itself is in conftest.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "infra" / "local" / "build.sh"


def why_skip() -> str:
    check = subprocess.run(["bash", str(BUILD), "--check"], capture_output=True, text=True)
    if check.returncode != 0:
        return f"local cluster binaries not built (bash infra/local/build.sh): {check.stderr.strip()}"
    if os.geteuid() != 0:
        return (
            "the node needs root (containerd, runc and the kubelet mount, make cgroups, set kernel settings)"
        )
    from infra.local.kubelet import IMAGES, missing_tools

    if missing_tools():
        return f"the node's Debian packages are missing: apt-get install {' '.join(missing_tools())}"
    images = subprocess.run(["bash", str(IMAGES), "--check"], capture_output=True, text=True)
    if images.returncode != 0:
        return f"the node's images are not built (make image): {images.stderr.strip()}"
    if not any((Path(d) / "kubectl").exists() for d in os.environ.get("PATH", "").split(os.pathsep)):
        return "no kubectl on PATH"
    return ""


class Local:
    """The running cluster: its state folder and a kubectl bound to its admin kubeconfig."""

    def __init__(self, state: Path):
        self.state = state
        self.env = dict(os.environ, BATON_CLUSTER_STATE=str(state))

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "infra.local.cluster", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def user_env(self) -> dict[str, str]:
        """The environment a user gets from `eval "$(python -m infra.local.cluster env)"`."""
        r = self.cli("env")
        assert r.returncode == 0, r.stderr
        env = dict(self.env)
        for line in r.stdout.splitlines():
            if line.startswith("#"):  # a comment for people (where the UI is), which eval skips too
                continue
            words = shlex.split(line)
            assert words[0] == "export" and "=" in words[1], line
            k, v = words[1].split("=", 1)
            env[k] = v.replace("$PATH", env.get("PATH", ""))
        return env

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        r = subprocess.run(
            ["kubectl", "--kubeconfig", str(self.state / "admin.kubeconfig"), "-n", "baton", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and r.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def get(self, kind: str, name: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", kind, name, "-o", "json"))

    def wait_phase(
        self, kind: str, name: str, phases: tuple[str, ...], timeout: float = 180
    ) -> dict[str, Any]:
        t0 = time.monotonic()
        while True:
            obj = self.get(kind, name)
            if obj.get("status", {}).get("phase") in phases:
                return obj
            if time.monotonic() - t0 > timeout:
                raise AssertionError(
                    f"{kind} {name} not in {phases} after {timeout:.0f} s: "
                    f"{json.dumps(obj.get('status', {}))[:1500]}"
                )
            time.sleep(0.5)

    def pids(self) -> list[int]:
        info = json.loads((self.state / "pids.json").read_text())
        return [p["pid"] for p in info["procs"].values()]

    def ports(self) -> dict[str, int]:
        return json.loads((self.state / "pids.json").read_text())["ports"]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait(pred: Any, timeout: float, what: str, every: float = 1.0) -> None:
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < timeout, f"not within {timeout:.0f} s: {what}"
        time.sleep(every)


def cond(obj: dict[str, Any], kind: str) -> str | None:
    for c in obj.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return c["status"]
    return None


# Small enough for 2 cores, large enough that the one eviction lands inside the trial's training. The tiny
# trainer runs about 7 steps a second here, and evict sees a step record up to ~2 s after it was written (the
# evidence is flushed every BATON_EVIDENCE_FLUSH_S = 2 s): at 60 steps, the 12 steps after the point at 48
# took under 2 s, and the eviction reached a trial that had finished (INCONCLUSIVE, "the trial outran
# them": measured 2026-12-04, evict saw step 50 when the trial was at 58). 200 steps leave 40 after the point.
SMALL_STEPS = "200"
SMALL = ["-p", f"total_steps={SMALL_STEPS}", "-p", "evictions=1"]
FINAL = ("Succeeded", "Failed", "Error")


def submit(cluster: Local, env: dict[str, str], *params: str) -> str:
    """A bare `python workflows/equivalence.py submit`, as a user types it after pasting `cluster up`'s export
    lines: BATON_TARGET, one of them, renders the drill with the local overlay (no pipe, no file)."""
    r = subprocess.run(
        [sys.executable, "workflows/equivalence.py", "submit", *params],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, f"submit failed: {r.stderr.strip()}"
    assert f"target: {env['BATON_TARGET']} (BATON_TARGET)" in r.stderr, r.stderr
    name, url = r.stdout.split()[:2]
    assert url == f"https://{env['ARGO_SERVER']}/workflows/baton/{name}", r.stdout
    return name


def watch(
    env: dict[str, str], name: str, timeout: float = 900
) -> tuple[str, subprocess.CompletedProcess[str]]:
    """`status NAME` against the Argo Server every few seconds, until its first line names a final phase."""
    t0 = time.monotonic()
    while True:
        r = subprocess.run(
            [sys.executable, "workflows/equivalence.py", "status", name],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.stdout.startswith(f"workflow {name}  "), f"status: {r.stdout[:300]} {r.stderr.strip()}"
        phase = r.stdout.split()[2].rstrip(":")
        if phase in FINAL:
            return phase, r
        assert time.monotonic() - t0 < timeout, f"{name} not finished after {timeout:.0f} s:\n{r.stdout}"
        time.sleep(5)


# The shipped configs with two data loader workers, by the config they are a twin of (tests/unit/test_config.py):
# files in the image, which is where a pod reads its config.
WORKERS_CONFIGS = {
    "trainer/configs/tiny.yaml": "trainer/configs/tiny-workers.yaml",
    "examples/hf_trainer/config.yaml": "examples/hf_trainer/config-workers.yaml",
}


@dataclass
class Drill:
    """A drill submitted and watched to its end: its name, its final phase, the last `status` output, and
    the user's environment it was submitted with."""

    name: str
    phase: str
    status: subprocess.CompletedProcess[str]
    env: dict[str, str]
