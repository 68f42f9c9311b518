"""Save, commit, listing and restore as a job spans more processes and nodes: the measurements behind
docs/scale.md.

    python -m bench.scale [--out FILE.json] [--steps 6] [--reps 2]

Each layout (nodes x ranks per node: 1x1, 1x2, 2x1, 1x4, 2x2; gloo on loopback; the bench's 17.6 M
"quick" Qwen2, float32 AdamW, 0.21 GB of state) trains `--steps` steps through `steps.train`, with a
periodic save halfway and the final save (several nodes: one `steps.train` per node, torchrun's static
rendezvous on 127.0.0.1), then starts once more from the final checkpoint (a restart that loads it and
has nothing left to train). From the records: each save's time and bytes and the restart's phases;
from the store: the files of a committed step. Repeated `--reps` times per layout, medians reported.
On this 2-core machine 4 processes share 2 cores: times at 4 processes measure contention as much as
the design; the counts (files, bytes per rank, requests) are exact.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import PY, REPO, TINY_CORPUS, WORK, child_env, log, median, parse_line
from bench.models import big_model
from trainer.checkpoint import open_root
from trainer.storage import local_path

LAYOUTS = ((1, 1), (1, 2), (2, 1), (1, 4), (2, 2))
TINY_YAML = REPO / "trainer" / "configs" / "tiny.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group(
    nodes: int, ranks: int, root: Path, model: Path, steps: int
) -> tuple[list[int], list[dict], float]:
    """One start of the job: every node's steps.train at once. (exit codes, node 0's records, seconds)."""
    sets = [
        f"model.path={model}",
        f"data.uri={TINY_CORPUS}",
        f"checkpoint.uri={root}",
        f"total_steps={steps}",
        f"checkpoint.every_steps={max(1, steps // 2)}",
        "checkpoint.keep_last=3",
        "data.seq_len=64",
        "data.batch_size=1",
        "notice.enabled=false",
        "name=bench-scale",
        "log_every=1000",
    ]
    port = _free_port()
    procs = []
    t0 = time.monotonic()
    for node in range(nodes):
        cmd = [PY, "-m", "steps.train", "--nproc", str(ranks), "--config", str(TINY_YAML)]
        if nodes > 1:
            cmd += [
                "--nnodes",
                str(nodes),
                "--node-rank",
                str(node),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
            ]
        for s in sets:
            cmd += ["--set", s]
        procs.append(
            subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=child_env(BATON_GRACE="60"),
                cwd=REPO,
            )
        )
    outs = [p.communicate(timeout=900) for p in procs]
    seconds = time.monotonic() - t0
    codes = [p.returncode for p in procs]
    if any(codes):
        log(f"{nodes}x{ranks}: exit codes {codes}\n{outs[0][1][-2000:]}")
    return codes, [r for r in map(parse_line, outs[0][0].splitlines()) if r is not None], seconds


def _step_files(root: Path, step: int) -> list[Path]:
    """The files of the root's newest committed checkpoint, which must be `step`'s (the package finds it:
    the bench does not know the layout)."""
    url, manifest = open_root(str(root)).final()
    assert manifest["step"] == step, (url, manifest["step"], step)
    folder = Path(local_path(url) or url)
    return sorted(p for p in folder.iterdir() if p.is_file())


def measure(nodes: int, ranks: int, model: Path, steps: int, rep: int) -> dict[str, Any]:
    root = WORK / "scale" / f"{nodes}x{ranks}-{rep}"
    if root.exists():
        import shutil

        shutil.rmtree(root)
    codes, recs, train_s = _group(nodes, ranks, root, model, steps)
    saves = [r for r in recs if r["event"] == "checkpoint"]
    codes2, recs2, restart_s = _group(nodes, ranks, root, model, steps)
    (resume,) = [r for r in recs2 if r["event"] == "resume"] or [{}]
    files = _step_files(root, steps)
    data = [p for p in files if p.suffix == ".distcp"]
    return {
        "exit": codes + codes2,
        "world": nodes * ranks,
        "train_s": round(train_s, 2),
        "restart_s": round(restart_s, 2),
        "save_ms": {r["reason"]: r["save_ms"] for r in saves},
        "bytes": saves[-1]["bytes"] if saves else None,
        "files": len(files),
        "data_files": len(data),
        "largest_file": max((p.stat().st_size for p in data), default=0),
        "phases": {
            k: v
            for k, v in (resume.get("phases") or {}).items()
            if k in ("init_s", "listing_s", "manifest_s", "load_verify_s", "restore_s")
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", help="write the figures here as JSON (default: stdout)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args(argv)
    model = big_model(quick=True)
    t0 = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {}
    for rep in range(args.reps):
        for nodes, ranks in LAYOUTS:
            m = measure(nodes, ranks, model, args.steps, rep)
            runs.setdefault(f"{nodes}x{ranks}", []).append(m)
            log(
                f"scale {nodes}x{ranks} rep {rep + 1}/{args.reps}: saves {m['save_ms']} ms, {m['bytes']} bytes in "
                f"{m['files']} files, restart phases {m['phases']}"
            )
    out: dict[str, Any] = {
        "steps": args.steps,
        "reps": args.reps,
        "seconds": round(time.monotonic() - t0, 1),
        "layouts": {},
    }
    for name, ms in runs.items():
        first = ms[0]
        out["layouts"][name] = {
            "world": first["world"],
            "exit": sorted({c for m in ms for c in m["exit"]}),
            "bytes": first["bytes"],
            "files": first["files"],
            "data_files": first["data_files"],
            "largest_file": first["largest_file"],
            "save_ms": {k: median([m["save_ms"].get(k, float("nan")) for m in ms]) for k in first["save_ms"]},
            "phases": {k: median([m["phases"].get(k, float("nan")) for m in ms]) for k in first["phases"]},
            "restart_s": median([m["restart_s"] for m in ms]),
        }
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
