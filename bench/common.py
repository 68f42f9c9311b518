"""Shared by the benchmark modules: paths, progress on stderr, medians, child processes, result files."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from trainer.exits import EXIT_OK, EXIT_PREEMPTED

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / ".baton" / "bench"
PY = sys.executable
TINY_CORPUS = REPO / "trainer" / "assets" / "tiny_corpus.txt"


def log(msg: str) -> None:
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def interleaved(reps: int, names: Sequence[str]) -> Iterator[tuple[int, str]]:
    """(rep, name) for `reps` rounds; each round runs every side once, the order rotated per round so
    that no side always goes first (a warm page cache or a busy neighbour favours one position)."""
    for r in range(reps):
        k = r % len(names)
        for name in [*names[k:], *names[:k]]:
            yield r, name


def child_env(**extra: str) -> dict[str, str]:
    """The environment of every process the bench starts: no stray BATON_* hooks, the repo importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    env["PYTHONPATH"] = str(REPO)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # One intra-op thread everywhere: on this shared 2-core machine, two OpenMP threads per process
    # made a step up to 10x slower whenever a neighbour took a core (spin-waiting barriers).
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.update(extra)
    return env


def parse_line(line: str) -> dict | None:
    """A JSON record (an object with an `event`), or None for any other line (HF prints dict reprs)."""
    if not line.startswith("{"):
        return None
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        return None
    return rec if isinstance(rec, dict) and "event" in rec else None


def hf_peer_cmd(model: Path, corpus: Path, out: Path, max_steps: int, *extra: str) -> list[str]:
    """`python -m bench.hf_peer`: the Hugging Face Trainer on the same model and corpus."""
    return [
        PY,
        "-m",
        "bench.hf_peer",
        "--model",
        str(model),
        "--corpus",
        str(corpus),
        "--out",
        str(out),
        "--max-steps",
        str(max_steps),
        *extra,
    ]


def timed_until(
    cmd: list[str],
    until: Callable[[dict], bool],
    env: dict[str, str] | None = None,
    timeout: float = 300,
    on_record: Callable[[dict, subprocess.Popen], None] | None = None,
) -> tuple[float | None, list[dict], int]:
    """Start `cmd`; the seconds from the spawn until the first JSON line on stdout for which `until`
    holds; then SIGKILL the process. Returns (seconds or None, the records seen, exit code)."""
    t0 = time.monotonic()
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env or child_env(),
        cwd=REPO,
        start_new_session=True,
    )
    recs: list[dict] = []
    hit: float | None = None
    assert p.stdout is not None
    try:
        for line in p.stdout:
            rec = parse_line(line)
            if rec is None:
                continue
            recs.append(rec)
            if on_record:
                on_record(rec, p)
            if until(rec):
                hit = time.monotonic() - t0
                break
            if time.monotonic() - t0 > timeout:
                break
    finally:
        if p.poll() is None:
            kill_tree(p.pid)
        rc = p.wait()
    return hit, recs, rc


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_tree(pid: int) -> None:
    """SIGKILL `pid`'s process group and every descendant: torchrun starts each worker in a session of
    its own, which a process-group kill does not reach."""
    found, todo = [], [pid]
    while todo:
        q = todo.pop()
        try:
            kids = [int(k) for k in Path(f"/proc/{q}/task/{q}/children").read_text().split()]
        except OSError:
            kids = []
        found += kids
        todo += kids
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    for k in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(k, signal.SIGKILL)


def run_records(
    cmd: list[str], env: dict[str, str] | None = None, timeout: float = 600
) -> tuple[int, list[dict]]:
    """Run to the end; (exit code, the JSON lines of stdout). stderr is dropped unless it fails."""
    p = subprocess.run(cmd, capture_output=True, text=True, env=env or child_env(), cwd=REPO, timeout=timeout)
    if p.returncode not in (EXIT_OK, EXIT_PREEMPTED):
        log(f"command failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return p.returncode, [r for r in map(parse_line, p.stdout.splitlines()) if r is not None]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def section_args(
    description: str,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """Every section module runs as `python -m bench.<section> --result FILE [--reps N] [--quick]`."""
    ap = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--result", required=True, help="write the section's figures here as JSON")
    ap.add_argument("--reps", type=int, default=3, help="repeats of each side, interleaved")
    ap.add_argument("--quick", action="store_true", help="smaller sizes: checks the bench itself runs")
    if extra:
        extra(ap)
    return ap.parse_args()


def write_result(path: str, result: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(result, indent=1, sort_keys=True))
