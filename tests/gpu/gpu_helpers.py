"""Shared by the GPU tests: the skip marks, trainer runs on the device, tensor distances, measurements.

Nothing here touches CUDA at import time, so that collecting tests/gpu on a CPU machine only skips.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from tests.helpers import CORPUS, PY, REPO, TINY_YAML, base_env, records, tensors

HAS_CUDA = torch.cuda.is_available()
N_GPUS = torch.cuda.device_count() if HAS_CUDA else 0

requires_cuda = pytest.mark.skipif(
    not HAS_CUDA,
    reason="no CUDA device (torch.cuda.is_available() is False): the GPU pre-flight suite "
    "runs on a GPU machine, see gpu/README.md",
)
requires_two_gpus = pytest.mark.skipif(
    N_GPUS < 2, reason=f"multi-rank NCCL needs 2 CUDA devices, this machine has {N_GPUS}"
)

GPU_MARKS = [pytest.mark.gpu, requires_cuda]


def gpu_env(**extra: str) -> dict[str, str]:
    """The tests' environment (no BATON_* leaks in), a grace long enough that a save is never cut."""
    return base_env(BATON_GRACE="60", **extra)


def train_cmd(model: Path | str, ckpt: Path | str, *sets: str, nproc: int | None = None) -> list[str]:
    """`python -m trainer` (one process, its own 1-rank group) when `nproc` is None, else
    `python -m steps.train --nproc N` (PID 1 of a pod: torchrun, rendezvous, NCCL across ranks)."""
    if nproc is None:
        cmd = [PY, "-m", "trainer", "--config", str(TINY_YAML)]
    else:
        cmd = [PY, "-m", "steps.train", "--nproc", str(nproc), "--config", str(TINY_YAML)]
    for s in (f"model.path={model}", f"checkpoint.uri={ckpt}", f"data.uri={CORPUS}", *sets):
        cmd += ["--set", s]
    return cmd


@dataclass
class Result:
    rc: int
    records: list[dict]
    stderr: str
    signalled: bool = False

    def tail(self, n: int = 4000) -> str:
        return self.stderr[-n:]

    def of(self, event: str) -> list[dict]:
        return [r for r in self.records if r.get("event") == event]


class Proc:
    """A background run; stdout and stderr go to files, so a chatty child never blocks on a pipe."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="baton-gpu-"))
        self._out = open(self._dir / "out", "w+")
        self._err = open(self._dir / "err", "w+")
        self.p = subprocess.Popen(
            cmd, stdout=self._out, stderr=self._err, text=True, env=env or gpu_env(), cwd=REPO
        )

    def wait(self, timeout: float = 300) -> Result:
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait()
        self._out.seek(0)
        self._err.seek(0)
        res = Result(rc, records(self._out.read()), self._err.read())
        self._out.close()
        self._err.close()
        shutil.rmtree(self._dir, ignore_errors=True)
        return res


def sigterm_at(
    cmd: list[str], step: int, env: dict[str, str] | None = None, target=None, timeout: float = 300
) -> Result:
    """Run with BATON_PAUSE_AFTER_STEP=step; when the step record for `step` shows, send a real SIGTERM
    to the process (or to `target(popen)`'s pid), and collect everything."""
    env = dict(env or gpu_env(), BATON_PAUSE_AFTER_STEP=str(step))
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=REPO)
        killer = threading.Timer(timeout, p.kill)
        killer.start()
        out, sent = [], False
        assert p.stdout is not None
        try:
            for line in p.stdout:
                out.append(line)
                if sent or not line.startswith("{"):
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if rec.get("event") == "step" and rec.get("step") == step:
                    os.kill(target(p) if target else p.pid, signal.SIGTERM)
                    sent = True
            rc = p.wait()
        finally:
            killer.cancel()
        err.seek(0)
        return Result(rc, records("".join(out)), err.read(), sent)


def worker_pid(root_pid: int, rank: int, timeout: float = 30) -> int:
    """The pid of torchrun's worker `rank` somewhere below `root_pid` (read from /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        todo = [root_pid]
        while todo:
            pid = todo.pop()
            try:
                kids = [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
            except OSError:
                continue
            todo += kids
            for k in kids:
                try:
                    env = dict(
                        e.split("=", 1)
                        for e in Path(f"/proc/{k}/environ").read_text().split("\0")
                        if "=" in e
                    )
                    cmdline = Path(f"/proc/{k}/cmdline").read_bytes()
                except OSError:
                    continue
                if "TORCHELASTIC_RUN_ID" in env and env.get("RANK") == str(rank) and b"trainer" in cmdline:
                    return k
        time.sleep(0.1)
    raise AssertionError(f"no torchrun worker of rank {rank} below pid {root_pid} within {timeout} s")


# ---- comparing checkpoints ------------------------------------------------------------------------------


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, int, int]:
    """(max |a - b| over model and optimizer tensors, tensors that differ, tensors compared): the
    drill's own comparison (steps.compare), so the tests and the drill measure the same thing."""
    from steps.compare import compared_keys, max_abs_diff

    keys = compared_keys(a)
    assert keys and set(keys) <= set(b), (
        f"checkpoints hold different tensors: {sorted(set(keys) - set(b))[:5]}"
    )
    worst, differing = max_abs_diff(a, b, keys)
    return worst, len(differing), len(keys)


def manifest(ckpt: Path | str, step: int) -> dict:
    from tests.helpers import step_dir

    return json.loads((step_dir(ckpt, step) / "manifest.json").read_text())


def measure(name: str, **values) -> None:
    """A number worth reporting: printed (pytest -s / -rA shows it) and appended as a JSON line to
    $BATON_GPU_MEASURE when set (gpu/check.py collects them into its report)."""
    line = json.dumps({"name": name, **values}, sort_keys=True, default=str)
    print(f"[gpu-measure] {line}")
    path = os.environ.get("BATON_GPU_MEASURE")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


# ---- one small drill on the device: reference, replay, trial (SIGTERM + resume), optional control -----


@dataclass
class Drill:
    root: Path
    total: int
    stop: int
    reference: Result
    replay: Result
    first: Result  # the trial's first attempt, SIGTERMed after `stop`
    second: Result | None  # the trial's resume
    control: Result | None = None  # a resume of a copy of the trial with BATON_SKIP_RESTORE=rng
    at_stop: dict[str, torch.Tensor] = field(default_factory=dict)  # the trial's checkpoint at `stop`
    before_stop: dict[str, torch.Tensor] = field(default_factory=dict)  # its previous checkpoint, if any
    roots: dict[str, Path] = field(default_factory=dict)  # checkpoint roots that live elsewhere (shared)

    def ckpt(self, role: str) -> Path:
        return self.roots.get(role, self.root / role)

    def final(self, role: str) -> dict[str, torch.Tensor]:
        return tensors(self.ckpt(role), self.total)


def run_drill(
    root: Path,
    model: Path | str,
    *sets: str,
    total: int,
    stop: int,
    every: int,
    nproc: int | None = None,
    control: bool = False,
    sigterm_rank: int | None = None,
    reference_from: Drill | None = None,
) -> Drill:
    """Reference and replay run in the background while the trial is stopped by SIGTERM after `stop`;
    then the trial (and, with `control`, a copy of it without the RNG restore) resumes to the end.
    `sigterm_rank`: signal only that torchrun worker instead of the launcher (needs nproc).
    `reference_from`: reuse another drill's reference and replay (same fingerprint: same computation)."""
    sets = (f"total_steps={total}", "model.dropout=0.1", f"checkpoint.every_steps={every}", *sets)
    root.mkdir(parents=True, exist_ok=True)
    bg = []
    if reference_from is None:
        bg = [Proc(train_cmd(model, root / role, *sets, nproc=nproc)) for role in ("reference", "replay")]
    target = (lambda p: worker_pid(p.pid, sigterm_rank)) if sigterm_rank is not None else None
    first = sigterm_at(train_cmd(model, root / "trial", *sets, nproc=nproc), stop, target=target)
    at_stop, before = {}, {}
    if first.rc == 75:
        from tests.helpers import step_dir

        at_stop = tensors(root / "trial", stop)
        earlier = sorted(
            int(p.name.removeprefix("step-"))
            for p in step_dir(root / "trial", stop).parent.glob("step-*")
            if int(p.name.removeprefix("step-")) < stop and (p / "_COMMIT").exists()
        )
        before = tensors(root / "trial", earlier[-1]) if earlier else {}
        if control:
            shutil.copytree(root / "trial", root / "control")
    resumes = []
    if first.rc == 75:
        resumes.append(Proc(train_cmd(model, root / "trial", *sets, nproc=nproc)))
        if control:
            resumes.append(
                Proc(
                    train_cmd(model, root / "control", *sets, nproc=nproc),
                    env=gpu_env(BATON_SKIP_RESTORE="rng"),
                )
            )
    done = [p.wait() for p in bg]
    after = [p.wait() for p in resumes]
    roots = {}
    if reference_from is not None:
        done = [reference_from.reference, reference_from.replay]
        roots = {role: reference_from.ckpt(role) for role in ("reference", "replay")}
    return Drill(
        root,
        total,
        stop,
        done[0],
        done[1],
        first,
        after[0] if after else None,
        after[1] if len(after) > 1 else None,
        at_stop,
        before,
        roots,
    )


def floor_and_diff(d: Drill, role: str = "trial") -> tuple[float, float, int, int]:
    """(floor, diff, differing, compared): the floor is reference vs replay, the diff reference vs `role`."""
    ref = d.final("reference")
    floor, _, _ = distance(ref, d.final("replay"))
    diff, differing, compared = distance(ref, d.final(role))
    return floor, diff, differing, compared
