"""A local pod's SIGKILL reaches every process it started, as a container's does: real torchrun, whose
workers call setsid and so leave the pod's process group, real signals. With only the group killed
(the runner before pod_init), the workers outlive their pod: the control below shows it."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO
from workflows.local import run_workflow, runner

pytestmark = pytest.mark.slow

# A torchrun worker that ignores SIGTERM (so only SIGKILL ends it) and says where it lives.
WORKER = """
import os, signal, sys, time
from pathlib import Path
signal.signal(signal.SIGTERM, signal.SIG_IGN)
out = Path(sys.argv[1])
(out / f"worker-{os.environ['RANK']}").write_text(f"{os.getpid()} {os.getsid(0)} {os.getpgid(0)}")
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _spec(tmp_path: Path) -> dict:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(script),
        str(tmp_path),
    ]
    evict = [
        sys.executable,
        "-c",
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from steps.lib.local_pods import list_pods, request_deletion\n"
        "d = Path(sys.argv[1])\n"
        "while len(list(d.glob('worker-*'))) < 2: time.sleep(0.05)\n"
        "pods = os.environ['BATON_LOCAL_PODS']\n"
        "pod = [p for p in list_pods(pods) if p['task'] == 'train' and p['phase'] == 'Running'][0]\n"
        "request_deletion(pods, pod['name'])\n",
        str(tmp_path),
    ]
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "tree"},
        "spec": {
            "entrypoint": "main",
            "templates": [
                {
                    "name": "main",
                    "dag": {
                        "tasks": [
                            {"name": "train", "template": "train"},
                            {"name": "evict", "template": "evict"},
                        ]
                    },
                },
                {
                    "name": "train",
                    "container": {"image": "x", "command": torchrun[:1], "args": torchrun[1:]},
                    "podSpecPatch": '{"terminationGracePeriodSeconds": 2}',
                },
                {"name": "evict", "container": {"image": "x", "command": evict[:1], "args": evict[1:]}},
            ],
        },
    }


def _workers(tmp_path: Path) -> list[tuple[int, int, int]]:
    return [tuple(int(x) for x in f.read_text().split()) for f in sorted(tmp_path.glob("worker-*"))]


def _run(tmp_path: Path):
    return run_workflow(
        _spec(tmp_path), tmp_path / "out", progress=io.StringIO(), cwd=REPO, env={"PYTHONPATH": str(REPO)}
    )


def test_a_deleted_pods_sigkill_reaches_torchruns_setsid_workers(tmp_path):
    res = _run(tmp_path)
    node = res.attempts("train")[0]
    assert (node.status, node.message) == ("Error", "pod deleted")  # as Argo records a deleted pod
    pod = json.loads((tmp_path / "out" / "pods" / f"{node.pod_name}.json").read_text())
    assert pod["exit_code"] == 137  # the container's own end: torchrun outlived the 2 s grace
    workers = _workers(tmp_path)
    assert len(workers) == 2
    for pid, sid, pgid in workers:
        assert sid == pid and pgid == pid  # the precondition: each worker is a session leader of its own
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid, _, _ in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid, _, _ in workers if _alive(pid)], "a torchrun worker outlived its pod's SIGKILL"


def test_control_killing_only_the_pods_process_group_leaves_the_workers_running(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "_kill_tree", lambda pid: runner._killpg(pid, signal.SIGKILL))
    try:
        _run(tmp_path)
        workers = _workers(tmp_path)
        assert len(workers) == 2
        time.sleep(0.5)
        assert all(_alive(pid) for pid, _, _ in workers), "the control should leave the workers behind"
    finally:  # what the control left behind: torchrun and its workers (their command lines name tmp_path)
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and str(tmp_path).encode() in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
