"""Shared by the tests: run the real trainer as a real process, signal it, read its records."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
TINY_YAML = REPO / "trainer" / "configs" / "tiny.yaml"
CORPUS = REPO / "trainer" / "assets" / "tiny_corpus.txt"
FAULTFS = REPO / "tests" / "faultfs"


def trainer_cmd(
    model_dir: Path | str, ckpt: Path | str, *sets: str, config: Path | str = TINY_YAML
) -> list[str]:
    cmd = [
        PY,
        "-m",
        "trainer",
        "--config",
        str(config),
        "--set",
        f"model.path={model_dir}",
        "--set",
        f"checkpoint.uri={ckpt}",
        "--set",
        f"data.uri={CORPUS}",
    ]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    # Prepended, not replaced: packages installed with `pip --target` (gpu/device.sh) stay importable.
    # tests/faultfs: its sitecustomize installs the trainer's test seams (BATON_PAUSE_AFTER_STEP, ...) and
    # the faulty:// store, from outside the trainer.
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), str(FAULTFS), env.get("PYTHONPATH")])),
    )
    env.update(extra)
    return env


def records(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def run(
    cmd: list[str], env: dict[str, str] | None = None, timeout: float = 300
) -> tuple[int, list[dict], str]:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env or base_env(), cwd=REPO, timeout=timeout)
    return p.returncode, records(p.stdout), p.stderr


def run_and_sigterm(
    cmd: list[str],
    at_step: int,
    env: dict[str, str] | None = None,
    target=None,
    timeout: float = 300,
    delay_s: float = 0.0,
    group: bool = False,
) -> tuple[int, list[dict], str]:
    """Run with BATON_PAUSE_AFTER_STEP=at_step; when the step record for `at_step` shows, send a real
    SIGTERM (to the process, to `target(proc)`'s pid, or with `group` to the process group the process
    leads, as Argo's emissary and the local runner signal a pod), and collect everything."""
    env = dict(env or base_env())
    env.setdefault("BATON_PAUSE_AFTER_STEP", str(at_step))
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
        start_new_session=group,
    )
    out_lines = []
    deadline = time.monotonic() + timeout
    sent = False
    assert p.stdout is not None
    for line in p.stdout:
        out_lines.append(line)
        if not sent and line.startswith("{"):
            rec = json.loads(line)
            if rec["event"] == "step" and rec["step"] == at_step:
                time.sleep(delay_s)  # lets a pause set after the record (BATON_PAUSE_AFTER_STEP=K:m) begin
                if group:
                    os.killpg(p.pid, signal.SIGTERM)
                else:
                    os.kill(target(p) if target else p.pid, signal.SIGTERM)
                sent = True
        if time.monotonic() > deadline:
            p.kill()
            break
    rc = p.wait(timeout=max(1, deadline - time.monotonic()))
    err = p.stderr.read() if p.stderr else ""
    return rc, records("".join(out_lines)), err


def step_dir(ckpt: Path | str, step: int) -> Path:
    hits = glob.glob(f"{ckpt}/runs/*/step-{step:08d}")
    assert len(hits) == 1, f"expected one step-{step:08d} under {ckpt}, found {hits}"
    return Path(hits[0])


def tensors(ckpt: Path | str, step: int) -> dict[str, torch.Tensor]:
    from trainer.checkpoint import load_flat

    return load_flat(f"file://{step_dir(ckpt, step)}")


def model_and_optim(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in t.items() if k.startswith(("model.", "optim."))}


def equal_count(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[int, int]:
    assert a.keys() == b.keys(), f"different keys: {sorted(a.keys() ^ b.keys())[:5]}"
    return sum(torch.equal(a[k], b[k]) for k in a), len(a)


def children(pid: int) -> list[int]:
    """The pids of `pid`'s child processes, read from /proc (none once it is gone)."""
    try:
        return [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def workers_of(pid: int, cmd_contains: bytes | None = None) -> dict[int, int]:
    """rank -> pid of the torchrun workers below `pid` (each runs in a session of its own), read from
    /proc; with `cmd_contains`, only workers whose command line holds it."""
    found, todo = {}, [pid]
    while todo:
        p = todo.pop()
        for k in children(p):
            todo.append(k)
            try:
                env = dict(
                    e.split("=", 1) for e in Path(f"/proc/{k}/environ").read_text().split("\0") if "=" in e
                )
                cmdline = Path(f"/proc/{k}/cmdline").read_bytes()
            except OSError:
                continue
            if (
                "TORCHELASTIC_RUN_ID" in env
                and "RANK" in env
                and (cmd_contains is None or cmd_contains in cmdline)
            ):
                found[int(env["RANK"])] = k
    return found


def judged(roots: dict[str, Path | str], recs: dict[str, list[dict]], total: int, tier: int) -> dict:
    """steps.compare's judgment of a reference, replay and trial (checkpoint roots and their records),
    as the drill's compare step makes it, without evictions (a test's own SIGTERM stopped the trial)."""
    from steps.compare import compare
    from steps.lib.verdict import assemble
    from steps.verify import verify

    urls = {role: str(root) if "://" in str(root) else f"file://{root}" for role, root in roots.items()}
    result = compare(urls["reference"], urls["replay"], urls["trial"], total, str(tier))
    return assemble(result, verify(recs["trial"], total), {}, recs, total)


def with_workers(src: Path, dest: Path, workers: int = 2) -> Path:
    """A copy of config `src` (baton's schema) whose data loader has `workers` worker processes."""
    import yaml

    cfg = yaml.safe_load(src.read_text())
    cfg.setdefault("data", {})["num_workers"] = workers
    dest.write_text(yaml.safe_dump(cfg))
    return dest
