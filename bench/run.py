"""`make bench`: run every section as its own process, print the table, write docs/results.md.

    python -m bench.run [--reps 3] [--quick] [--only flush-local,resume,...] [--results docs/results.md]

Sections (each a fresh process, so that one's memory and process group never touch another's):
flush-local, flush-s3 (figures 1, 2, 6), resume (3), equivalence (4), overhead (5), memory-sync,
memory-async and memory-async-mmap (7), scaling (8), digest (9), startup and restart-ranks (10). Progress goes to stderr; the table goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bench import report
from bench.common import PY, REPO, WORK, child_env, log

SECTIONS: dict[str, list[str]] = {
    "flush-local": ["bench.flush", "--where", "local"],
    "flush-s3": ["bench.flush", "--where", "s3"],
    "resume": ["bench.resume"],
    "equivalence": ["bench.equivalence"],
    "overhead": ["bench.overhead", "--ws2"],
    "memory-sync": ["bench.memory", "--mode", "sync"],
    "memory-async": ["bench.memory", "--mode", "async"],
    "memory-async-mmap": ["bench.memory", "--mode", "async"],
    "scaling": ["bench.scaling"],
    "digest": ["bench.digest"],
    "startup": ["bench.startup"],
    "restart-ranks": ["bench.restart_ranks"],
}
# glibc with a fixed mmap threshold, so that freed staging buffers go back to the OS: what steps.train
# and the image give the workers (MALLOC_MMAP_THRESHOLD_); memory-async is the default allocator.
SECTION_ENV: dict[str, dict[str, str]] = {"memory-async-mmap": {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}}


def machine() -> dict[str, str]:
    mem_kb = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor(),
    )
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    return {
        "nproc": nproc,
        "ram": f"{mem_kb / 1024 / 1024:.1f} GiB",
        "cpu": cpu,
        "python": platform.python_version(),
        "torch": torch_build(),
        "transformers": version("transformers"),
        "accelerate": version("accelerate"),
        "moto": version("moto"),
        "s3fs": version("s3fs"),
        "kernel": platform.release(),
    }


def torch_build() -> str:
    """torch's version and build, without importing it: PyPI's default wheel is the CUDA build, whose
    version has no local part (`2.13.0`, where the CPU index's is `2.13.0+cpu`)."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("torch")
    text = (Path(spec.origin).parent / "version.py").read_text() if spec and spec.origin else ""
    cuda = re.search(r"^cuda\b[^=]*=\s*'([^']+)'", text, re.M)
    return f"{version('torch')} ({f'CUDA {cuda.group(1)} build, run on the CPU' if cuda else 'CPU build'})"


def setup_text(m: dict[str, str], meta: dict[str, Any], results: dict[str, dict[str, Any]]) -> str:
    big, small = results.get("flush-local", {}), results.get("flush-s3", {})
    big_p = f"{big['params'] / 1e6:.1f} M" if big else "about 125 M"
    small_p = (
        f"{small['params'] / 1e6:.1f} M-parameter stand-in (hidden 256, 2 layers, "
        f"{small['ckpt_bytes'] / 1e9:.2f} GB of state)"
        if small
        else "small stand-in"
    )
    return "\n".join(
        [
            f"Run of {meta['when']}, {meta['total_s'] / 60:.1f} min in all.",
            "",
            "```",
            meta["command"],
            "```",
            "",
            f"Machine: `nproc` = {m['nproc']} ({m['cpu']}), {m['ram']} RAM, Linux {m['kernel']}, "
            f"Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}, "
            f"accelerate {m['accelerate']}, s3fs {m['s3fs']}, moto {m['moto']}. CPU only; the machine is "
            f"shared with other jobs, so absolute times are noisy and only the ratios (both sides measured "
            f"in the same run, interleaved) are the figures.",
            "",
            f"Method: every timed side is repeated {meta['reps']} times ({2 * meta['reps']} for the "
            "seconds-long local-disk writes), interleaved with the side it is compared to (the order rotates "
            "each round), and the median is reported. Every process runs with "
            "`OMP_NUM_THREADS=1`: with two intra-op threads a busy neighbour on this 2-core machine made a "
            "step up to 10x slower. Models are built from a config with random weights (nothing is "
            "downloaded): the big one is a Qwen2 with hidden 768, 12 layers, 12 heads (4 KV heads), MLP "
            f"2048, vocab 32000 and an untied head, {big_p} parameters. The local S3 is moto's "
            "ThreadedMotoServer on 127.0.0.1 in a child process, started and stopped by the bench "
            f"(`BATON_S3_ENDPOINT`, dummy keys); its section uses a {small_p}, "
            "because moto holds objects in memory and slows down faster than linearly with object size "
            "(a single 1.5 GB upload took over a minute).",
        ]
    )


def run_section(
    name: str, args: argparse.Namespace, out_dir: Path
) -> tuple[dict[str, Any] | None, str | None]:
    result = out_dir / f"{name}.json"
    result.unlink(missing_ok=True)
    module, *extra = SECTIONS[name]
    cmd = [PY, "-m", module, "--result", str(result), "--reps", str(args.reps), *extra]
    if args.quick:
        cmd.append("--quick")
    t0 = time.monotonic()
    log(f"section {name}: {' '.join(cmd[1:])}")
    p = subprocess.run(
        cmd, cwd=REPO, env=child_env(**SECTION_ENV.get(name, {})), stdout=sys.stderr, stderr=sys.stderr
    )
    log(f"section {name}: exit {p.returncode} after {time.monotonic() - t0:.0f} s")
    if p.returncode != 0 or not result.exists():
        return None, f"exit {p.returncode} (its output is above in the log)"
    return json.loads(result.read_text()), None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small sizes, to check the bench itself")
    ap.add_argument("--only", default="", help=f"comma-separated sections of: {', '.join(SECTIONS)}")
    ap.add_argument(
        "--results",
        default=None,
        help="default: docs/results.md (out/bench/results-quick.md with --quick or --only)",
    )
    ap.add_argument(
        "--rerender",
        action="store_true",
        help="measure nothing: rewrite the results file from the last run's .baton/bench/results/all.json",
    )
    ap.add_argument(
        "--rerender-partial",
        action="store_true",
        help="measure nothing: rewrite the results file from the newest result of every section left in "
        ".baton/bench/results-partial by runs with --only (sections measured in separate runs)",
    )
    args = ap.parse_args(argv)
    if args.rerender:
        return rerender(Path(args.results) if args.results else REPO / "docs/results.md")
    if args.rerender_partial:
        return rerender_partial(Path(args.results) if args.results else REPO / "docs/results.md", args.reps)
    names = [s for s in args.only.split(",") if s] or list(SECTIONS)
    unknown = set(names) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}")
    partial = args.quick or bool(args.only)
    target = (
        Path(args.results)
        if args.results
        else REPO / ("out/bench/results-quick.md" if partial else "docs/results.md")
    )
    out_dir = WORK / ("results-partial" if partial else "results")  # --rerender reads a full run's
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    for name in names:
        res, err = run_section(name, args, out_dir)
        if res is not None:
            results[name] = res
        else:
            failed[name] = err or "failed"
    extra = " ".join(argv if argv is not None else sys.argv[1:])
    meta = {
        "total_s": time.monotonic() - t0,
        "when": time.strftime("%Y-%m-%d %H:%M %Z"),
        "reps": args.reps,
        "command": "make bench    # = .venv/bin/python -m bench.run" + (f" {extra}" if extra else ""),
        "machine": machine(),
        "failed": failed,
    }
    (out_dir / "all.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=1, sort_keys=True)
    )
    render(target, results, meta)
    return 1 if failed else 0


def render(target: Path, results: dict[str, dict[str, Any]], meta: dict[str, Any]) -> None:
    figs = report.figures(results)
    setup = setup_text(meta["machine"], meta, results)
    report.write(target, report.generated(figs, setup, meta["failed"]))
    print(report.table(figs))
    print(
        f"\ntotal {meta['total_s'] / 60:.1f} min; {len(meta['failed'])} section(s) failed; written to "
        f"{os.path.relpath(target, REPO)}"
    )


def rerender(target: Path) -> int:
    saved = json.loads((WORK / "results" / "all.json").read_text())
    render(target, saved["results"], saved["meta"])
    return 0


def rerender_partial(target: Path, reps: int) -> int:
    """The results file from the sections' own result files, each from the last `--only` run that
    measured it: for a machine too busy for one long run. The setup says when each section ran."""
    part = WORK / "results-partial"
    results, when = {}, {}
    for name in SECTIONS:
        f = part / f"{name}.json"
        if f.exists():
            results[name] = json.loads(f.read_text())
            when[name] = time.strftime("%H:%M", time.gmtime(f.stat().st_mtime))
    first = min(f.stat().st_mtime for f in part.glob("*.json") if f.stem in SECTIONS)
    meta = {
        "total_s": time.time() - first,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(first))
        + ", section by section (each finished at: "
        + ", ".join(f"{n} {t}" for n, t in when.items())
        + " UTC)",
        "reps": reps,
        "command": ".venv/bin/python -m bench.run --only SECTION[,SECTION...]   # each section, then:\n"
        ".venv/bin/python -m bench.run --rerender-partial",
        "machine": machine(),
        "failed": {n: "not measured in this run" for n in SECTIONS if n not in results},
    }
    render(target, results, meta)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
