#!/usr/bin/env python3
"""The GPU check: the pre-flight suite, then an equivalence drill on a Qwen2.5-0.5B-shaped model.

    python -m gpu.check [--out out/gpu-check] [--model DIR] [--ranks N] [--steps 100] [--evictions 2]
                        [--dtype bfloat16] [--budget S] [--skip-preflight] [--skip-drill]
                        [--mode deterministic|fast|both] [--fast-seq-len 2048 ...] [--solo-steps 30]
    python -m gpu.check build-model DIR [--dtype bfloat16]       the 0.5B-shaped model alone

Phases, each under its own timeout inside one overall budget (470 s for one mode, under 8 minutes; 720 s
for both):
1. pre-flight: `pytest tests/gpu` (placement, the trainer's process group and stop flag, deterministic
   kernels, the CUDA RNG through a checkpoint, bf16, FSDP2 SIGTERM and resume on one GPU; two NCCL ranks
   when there are two GPUs). Its measurements come back through $BATON_GPU_MEASURE.
2. model: the Qwen2.5-0.5B architecture, numbers from its public config.json (hidden 896, 24 layers, 14
   heads, 2 KV heads, intermediate 4864, vocab 151936, tied embeddings: 494,032,768 parameters), random
   weights from a fixed seed, saved with save_pretrained. Its tokenizer is a byte-level BPE trained on the
   shipped corpus (about 500 tokens): token ids stay below 512 while the model keeps all 151,936 embedding
   rows, so the LM head, the logits and the optimizer state have the real model's size. Nothing is
   downloaded. `--model DIR` uses a local Hugging Face folder (model and tokenizer) instead.
3. drill: `workflows/equivalence.py run` with a generated trainer config (OUT/drill-config.yaml): a
   reference, its replay (the reference twice: the nondeterminism floor), and a trial evicted N times,
   all three at once on the same GPU(s); then verify and compare (Tier 2 on CUDA).
4. fast mode (`--mode fast` or `both`, gpu/fast.py): sdpa attention, torch.compile per layer,
   `deterministic: false`, seq 2048: first the reference alone for `--solo-steps` (tokens/s and MFU
   against the chip's dense bf16 peak), then the same drill in that configuration, judged by Tier 2.

Prints and writes OUT/gpu-check.json and OUT/gpu-check.md (a snippet for docs/results.md): tokens per
second, checkpoint size, flush (save) ms, the time from SIGTERM to the committed checkpoint against a
15 s and a 120 s grace, the floor, and the equivalence verdict.

Exit codes: 0 every phase passed; 1 a phase failed or ran out of time; 2 no CUDA device, so nothing was
checked (a check that ran nothing must not read as a pass; `--allow-cpu` runs the plumbing on the CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainer.exits import EXIT_FAIL, EXIT_OK

REPO = Path(__file__).resolve().parent.parent


EXIT_NO_CUDA = 2  # this tool's own: nothing was checked, a GPU machine is needed
NO_CUDA = "no CUDA device: nothing to check"
CORPUS = REPO / "trainer" / "assets" / "tiny_corpus.txt"

from gpu.fast import FAST_DEFAULTS, fast_config, mfu, peak_flops  # noqa: E402
from gpu.model import QWEN25_05B, build_model, parameter_count, write_corpus  # noqa: E402
from gpu.results import (  # noqa: E402
    DRILL_GRACE_S,
    console,
    drill_evidence,
    drill_metrics,
    junit_counts,
    markdown,
    read_jsonl,
)

# Seconds for everything, by --mode: one mode with the pre-flight fits under 8 minutes (measured on one
# H200: pre-flight 184 s, deterministic drill 230 s); both modes do not fit one 10-minute device call.
DEFAULT_BUDGET_S = {"deterministic": 470, "fast": 470, "both": 720}
TIMEOUTS = {"preflight": 240, "model": 180, "test": 150}
BYTES = {"float32": 4, "bfloat16": 2}


# ---- the drill's config ------------------------------------------------------------------------------


def drill_config(
    model_dir: Path | str,
    corpus: Path | str,
    *,
    name: str = "gpu-qwen2.5-0.5b-shape",
    dtype: str = "bfloat16",
    seq_len: int = 512,
    batch_size: int = 4,
    grad_accum: int = 2,
    every_steps: int = 50,
    total_steps: int = 100,
    dropout: float = 0.1,
    seed: int = 0,
) -> dict[str, Any]:
    """A trainer config for the drill. The drill overrides checkpoint.uri, total_steps, seed, dropout and
    every_steps per role; keep_last 1 (and no keep-best) bounds the disk: three runs of ~3 GB checkpoints."""
    from trainer.config import CheckpointConfig

    ck: dict[str, Any] = {
        "uri": "file:///the-drill-sets-checkpoint.uri",
        "every_steps": every_steps,
        "keep_last": 1,
    }
    if "keep_best_metric" in {f.name for f in dataclasses.fields(CheckpointConfig)}:
        ck["keep_best_metric"] = ""
    return {
        "name": name,
        "seed": seed,
        "total_steps": total_steps,
        "deterministic": True,
        "log_every": 10,
        "model": {"path": str(model_dir), "dtype": dtype, "dropout": dropout},
        "data": {"uri": str(corpus), "seq_len": seq_len, "batch_size": batch_size, "grad_accum": grad_accum},
        "optim": {"lr": 1e-4, "warmup_steps": 10},
        "checkpoint": ck,
    }


def write_drill_config(path: Path, raw: dict[str, Any]) -> Path:
    import yaml

    from trainer.config import config_from_dict

    config_from_dict(raw)  # refuse here, with the key named, rather than in three pods at once
    path.write_text("# Written by gpu/check.py for the GPU drill.\n" + yaml.safe_dump(raw, sort_keys=False))
    return path


# ---- running a phase -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Phase:
    name: str
    rc: int | None = None
    seconds: float = 0.0
    timed_out: bool = False
    skipped: str = ""
    log: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.skipped and not self.timed_out and not self.error and self.rc == 0

    def summary(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "rc": self.rc,
            "seconds": round(self.seconds, 1),
            "timed_out": self.timed_out,
            "skipped": self.skipped or None,
            "error": self.error or None,
            "log": self.log or None,
        }


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_phase(
    phase: Phase,
    cmd: list[str],
    timeout: float,
    log_path: Path,
    env: dict[str, str] | None = None,
    echo: bool = True,
    on_timeout=None,
) -> Phase:
    """Run `cmd` in its own process group, its output to `log_path` (and echoed). At `timeout`: SIGTERM to
    the group, SIGKILL 30 s later, then `on_timeout()` (to reap what the phase started in other sessions)."""
    phase.log = str(log_path)
    t0 = time.monotonic()
    print(f"== {phase.name}: {shlex.join(cmd)}  (timeout {timeout:.0f} s)", flush=True)
    with open(log_path, "w") as log:
        p = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env=env,
            start_new_session=True,
            bufsize=1,
        )

        def pump() -> None:
            assert p.stdout is not None
            for line in p.stdout:
                log.write(line)
                log.flush()
                if echo:
                    sys.stdout.write(f"  [{phase.name}] {line}")
                    sys.stdout.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            phase.rc = p.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            phase.timed_out = True
            phase.error = f"timed out after {timeout:.0f} s"
            print(f"== {phase.name}: {phase.error}; stopping it", flush=True)
            _killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _killpg(p.pid, signal.SIGKILL)
            phase.rc = p.wait()
            _killpg(p.pid, signal.SIGKILL)  # anything left in the group
            if on_timeout:
                on_timeout()
        _killpg(p.pid, signal.SIGKILL)  # what the phase left behind (a test's child after a per-test timeout)
        reader.join(timeout=10)
    phase.seconds = time.monotonic() - t0
    if phase.rc not in (0, None) and not phase.error:
        phase.error = f"exited {phase.rc}"
    print(f"== {phase.name}: {'ok' if phase.ok else phase.error} in {phase.seconds:.0f} s", flush=True)
    return phase


def reap_pods(pods_dir: Path) -> None:
    """After a timed-out drill: SIGKILL the pod groups the local runner left Running (its registry)."""
    for rec in sorted(pods_dir.glob("*.json")):
        try:
            info = json.loads(rec.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if info.get("phase") == "Running" and isinstance(info.get("pgid"), int):
            _killpg(info["pgid"], signal.SIGKILL)


# ---- the check ------------------------------------------------------------------------------------------------

DEVICE_INFO = """
import json, torch, transformers
p = torch.cuda.get_device_properties(0)
print(json.dumps({"name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
                  "memory_gib": round(p.total_memory / 2**30, 1), "capability": f"{p.major}.{p.minor}",
                  "torch": torch.__version__, "cuda": torch.version.cuda, "nccl": str(torch.cuda.nccl.version()),
                  "transformers": transformers.__version__}))
"""


def device_info(timeout: float = 120) -> dict[str, Any]:
    """Asked in a child process, so that this one never holds a CUDA context while the drill runs."""
    p = subprocess.run([sys.executable, "-c", DEVICE_INFO], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"CUDA is reported but unusable: {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    )
    env.update(
        PYTHONUNBUFFERED="1", CUBLAS_WORKSPACE_CONFIG=env.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8"), **extra
    )
    return env


class MemorySampler:
    """The GPU memory in use (nvidia-smi, every 2 s) while a phase runs: the peak over all processes."""

    def __init__(self) -> None:
        self.peak_mib: int | None = None
        self._stop = threading.Event()
        self._smi = shutil.which("nvidia-smi")

    def __enter__(self) -> MemorySampler:
        if self._smi:
            threading.Thread(target=self._run, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(2.0):
            try:
                out = subprocess.run(
                    [self._smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                ).stdout
                used = sum(int(x) for x in out.split() if x.strip().isdigit())
                self.peak_mib = max(self.peak_mib or 0, used)
            except (OSError, subprocess.SubprocessError, ValueError):
                return


def check(args: argparse.Namespace, argv: list[str]) -> int:
    import torch

    started = time.monotonic()
    deadline = started + args.budget
    out = Path(args.out).resolve()
    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        print(NO_CUDA)
        print(f"(exit {EXIT_NO_CUDA}: nothing was checked; run this on a GPU machine, see gpu/README.md)")
        return EXIT_NO_CUDA
    if out.exists() and any(out.iterdir()):
        if not (out / "gpu-check.json").exists():
            raise SystemExit(
                f"error: {out} holds something else than an earlier check's results; choose another --out"
            )
        shutil.rmtree(out)  # an earlier check's results: replaced
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "command": "python -m gpu.check" + (" " + shlex.join(argv) if argv else ""),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "passed": False,
        "ranks": args.ranks,
        "budget_s": args.budget,
        "phases": {},
    }
    phases: dict[str, Phase] = {}

    def left() -> float:
        return deadline - time.monotonic()

    def save() -> None:
        result["phases"] = {k: v.summary() for k, v in phases.items()}
        result["seconds"] = round(time.monotonic() - started, 1)
        (out / "gpu-check.json").write_text(json.dumps(result, indent=1, sort_keys=True, default=str))
        (out / "gpu-check.md").write_text(markdown(result))

    try:
        result["device"] = (
            device_info()
            if cuda
            else {"name": "CPU (--allow-cpu: plumbing only)", "count": 0, "torch": torch.__version__}
        )
    except (RuntimeError, subprocess.SubprocessError, json.JSONDecodeError) as e:
        phases["device"] = Phase("device", error=str(e))
        save()
        print(f"error: {e}")
        return EXIT_FAIL
    dev = result["device"]
    print(
        f"GPU check on {dev.get('name')} x {dev.get('count')}, torch {dev.get('torch')}, CUDA {dev.get('cuda')}; "
        f"budget {args.budget:.0f} s; results in {out}",
        flush=True,
    )
    if args.ranks > max(1, int(dev.get("count") or 0)) and cuda:
        raise SystemExit(
            f"error: --ranks {args.ranks} needs {args.ranks} GPUs, this machine has {dev.get('count')}"
        )

    # 2. the model, built on the CPU while the pre-flight has the GPU
    mp = Phase("model")
    corpus = write_corpus(out / "corpus.txt", n_docs=300 if args.tiny else 3000)
    builder = None
    if args.model:
        model_dir = Path(args.model).resolve()
        source = f"--model {model_dir}"
        if not (model_dir / "config.json").exists():
            mp.error = f"--model {model_dir}: not a Hugging Face model folder (no config.json)"
        mp.rc = 0 if not mp.error else 1
    else:
        shape = "tiny" if args.tiny else "qwen2.5-0.5b-shape"
        model_dir = (Path(args.model_cache) / f"{shape}-{args.dtype}").resolve()
        source = (
            "Qwen2.5-0.5B shape, random weights" if not args.tiny else "tiny shape (--tiny), random weights"
        )
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "build-model",
            str(model_dir),
            "--dtype",
            args.dtype,
        ]
        if args.tiny:
            cmd.append("--tiny")
        builder = threading.Thread(
            target=run_phase,
            args=(mp, cmd, min(TIMEOUTS["model"], left() - 30), out / "model.log"),
            kwargs={"env": child_env()},
        )
        builder.start()

    # 1. pre-flight
    pf = phases["preflight"] = Phase("preflight")
    phases["model"] = mp
    if args.skip_preflight:
        pf.skipped = "--skip-preflight"
    else:
        measure = out / "preflight-measure.jsonl"
        junit = out / "preflight.xml"
        # -v: a line per test as it ends, so a phase cut off at its timeout still says how far it got;
        # a per-test timeout (pytest-timeout, where installed) keeps one hung test from taking the phase.
        per_test = (
            [f"--timeout={TIMEOUTS['test']}"] if _has("pytest_timeout") else []
        )  # its entry point loads it
        run_phase(
            pf,
            [
                sys.executable,
                "-m",
                "pytest",
                "-v",
                "-ra",
                "-p",
                "no:cacheprovider",
                *per_test,
                "tests/gpu",
                f"--junitxml={junit}",
            ],
            min(TIMEOUTS["preflight"], max(30.0, left() - 60)),
            out / "preflight.log",
            env=child_env(BATON_GPU_MEASURE=str(measure)),
            echo=args.verbose,
        )
        if junit.exists():
            result["preflight"] = {**junit_counts(junit), "measurements": read_jsonl(measure)}
        if pf.rc == 5:  # pytest: no tests collected
            pf.error = "pytest collected no tests"
        elif cuda and pf.ok and result.get("preflight", {}).get("passed", 0) == 0:
            pf.error = "the pre-flight passed no test on this GPU machine (all skipped?)"
    save()
    if builder is not None:
        builder.join()
    if mp.ok:
        try:
            from transformers import AutoConfig, AutoTokenizer

            config = AutoConfig.from_pretrained(model_dir)
            result["model"] = {
                "source": source,
                "path": str(model_dir),
                "dtype": args.dtype,
                "parameters": parameter_count(config),
                "vocab_size": config.vocab_size,
                "tokenizer_size": len(AutoTokenizer.from_pretrained(model_dir)),
                "shape": {k: getattr(config, k, None) for k in QWEN25_05B if k != "rope_theta"},
            }
        except Exception as e:  # a folder that does not load is this phase's failure, said plainly
            mp.error = f"the model folder does not load: {type(e).__name__}: {e}"
    save()

    # 3. the drills: deterministic (Tier 1), then fast (a solo throughput run, then a Tier 2 drill)
    for mode in modes(args.mode):
        for kind in ("solo", "drill") if mode == "fast" else ("drill",):
            name = kind if mode == "deterministic" else f"{kind}-fast"
            dp = phases[name] = Phase(name)
            if args.skip_drill:
                dp.skipped = "--skip-drill"
            elif not mp.ok:
                dp.skipped = "no model"
            elif left() < 90:
                dp.skipped = f"only {left():.0f} s left in the budget of {args.budget:.0f} s"
            else:
                try:
                    run = run_solo if kind == "solo" else run_drill
                    run(args, dp, result, out, model_dir, corpus, left, mode)
                except Exception as e:  # a config the trainer refuses, an unreadable report: said plainly
                    dp.error = dp.error or f"{type(e).__name__}: {e}"
            save()

    result["passed"] = all(
        p.ok or (p.skipped and name.split("-")[0] in args.skipped_ok) for name, p in phases.items()
    )
    save()
    print()
    print(console(result))
    print(
        f"check {'PASSED' if result['passed'] else 'FAILED'} in {time.monotonic() - started:.0f} s; "
        f"{out / 'gpu-check.json'}, {out / 'gpu-check.md'}"
    )
    return EXIT_OK if result["passed"] else EXIT_FAIL


def modes(mode: str) -> tuple[str, ...]:
    return ("deterministic", "fast") if mode == "both" else (mode,)


def geometry(args: argparse.Namespace, mode: str) -> dict[str, int]:
    """seq_len, batch_size, grad_accum, steps, evictions, every_steps of a mode's runs."""
    if mode == "fast":
        g = {k: getattr(args, f"fast_{k}") for k in FAST_DEFAULTS}
    else:
        g = {k: getattr(args, k) for k in FAST_DEFAULTS}
    if args.tiny:
        g["seq_len"] = 128
    return g


def mode_config(
    args: argparse.Namespace, out: Path, model_dir: Path, corpus: Path, mode: str
) -> tuple[Path, dict]:
    g = geometry(args, mode)
    raw = drill_config(
        model_dir,
        corpus,
        name="gpu-" + ("tiny" if args.tiny else Path(model_dir).name.replace("_", "-")),
        dtype=args.dtype,
        seq_len=g["seq_len"],
        batch_size=g["batch_size"],
        grad_accum=g["grad_accum"],
        every_steps=g["every_steps"],
        total_steps=g["steps"],
    )
    if mode == "fast":
        raw = fast_config(raw)
    suffix = "" if mode == "deterministic" else f"-{mode}"
    return write_drill_config(out / f"drill-config{suffix}.yaml", raw), g


def run_solo(
    args: argparse.Namespace,
    dp: Phase,
    result: dict[str, Any],
    out: Path,
    model_dir: Path,
    corpus: Path,
    left,
    mode: str,
) -> None:
    """The fast configuration's reference alone on the GPU, no checkpoints: tokens/s and MFU."""
    cfg_path, g = mode_config(args, out, model_dir, corpus, mode)
    solo = out / f"solo-{mode}"
    shutil.rmtree(solo, ignore_errors=True)
    steps = args.solo_steps
    cmd = [
        sys.executable,
        "-m",
        "steps.train",
        "--nproc",
        str(args.ranks),
        "--config",
        str(cfg_path),
        "--set",
        f"checkpoint.uri=file://{solo}/ckpt",
        "--set",
        f"total_steps={steps}",
        "--set",
        "checkpoint.every_steps=0",
        "--set",
        "model.dropout=0.1",
    ]
    run_phase(dp, cmd, min(left() - 60, 240), out / f"solo-{mode}.log", env=child_env(), echo=args.verbose)
    recs = [r for r in read_jsonl(out / f"solo-{mode}.log") if r.get("event") == "step"]
    steady = sorted(r["tokens_per_s"] for r in recs if r.get("step", 0) > args.warmup_steps)
    tps = steady[len(steady) // 2] if steady else None
    m = result.get("model") or {}
    shape = m.get("shape") or {}
    peak = peak_flops(str((result.get("device") or {}).get("name", "")))
    result[f"solo_{mode}"] = {
        "steps": steps,
        "seq_len": g["seq_len"],
        "tokens_per_step": g["seq_len"] * g["batch_size"] * g["grad_accum"] * args.ranks,
        "tokens_per_s": tps,
        "peak_flops": peak,
        "mfu": mfu(
            tps,
            int(m.get("parameters") or 0),
            int(shape.get("num_hidden_layers") or 0),
            int(shape.get("hidden_size") or 0),
            g["seq_len"],
            peak and peak * args.ranks,
        ),
    }
    if dp.ok and tps is None:
        dp.error = f"no step records after the first {args.warmup_steps} steps"


def run_drill(
    args: argparse.Namespace,
    dp: Phase,
    result: dict[str, Any],
    out: Path,
    model_dir: Path,
    corpus: Path,
    left,
    mode: str = "deterministic",
) -> None:
    """Write the drill's config, check the disk, run the drill, read its report and evidence."""
    cfg_path, g = mode_config(args, out, model_dir, corpus, mode)
    seq = g["seq_len"]
    suffix = "" if mode == "deterministic" else f"-{mode}"
    params = result["model"]["parameters"]
    ckpt_bytes = params * BYTES[args.dtype] * 3  # weights and the two Adam moments
    need = ckpt_bytes * 7  # three runs, up to two checkpoints each while a new one commits, and slack
    free = shutil.disk_usage(out).free
    d: dict[str, Any] = {
        "mode": mode,
        "total_steps": g["steps"],
        "evictions": g["evictions"],
        "ranks": args.ranks,
        "seq_len": seq,
        "tokens_per_step": seq * g["batch_size"] * g["grad_accum"] * args.ranks,
        "config": str(cfg_path),
        "grace_s": DRILL_GRACE_S,
        "disk_free_gb": round(free / 1e9, 1),
    }
    result["drill" + suffix.replace("-", "_")] = d
    if free < need:
        dp.error = (
            f"not enough disk under {out}: {free / 1e9:.1f} GB free, the drill needs about {need / 1e9:.1f} GB "
            f"(three runs of {ckpt_bytes / 1e9:.1f} GB checkpoints)"
        )
        return
    drill_out = out / f"drill{suffix}"
    cmd = [
        sys.executable,
        str(REPO / "workflows" / "equivalence.py"),
        "run",
        "--out",
        str(drill_out),
        "--force",
        "-p",
        f"config={cfg_path}",
        "-p",
        f"total_steps={g['steps']}",
        "-p",
        f"evictions={g['evictions']}",
        "-p",
        f"grace={DRILL_GRACE_S}",
        "-p",
        f"every_steps={g['every_steps']}",
        "-p",
        "dropout=0.1",
        "-p",
        f"ranks={args.ranks}",
        "-p",
        "seed=0",
    ]
    with MemorySampler() as mem:
        run_phase(
            dp,
            cmd,
            left() - 15,
            out / f"drill{suffix}.log",
            env=child_env(),
            on_timeout=lambda: reap_pods(drill_out / "argo" / "pods"),
        )
    d["gpu_memory_peak_mib"] = mem.peak_mib
    from steps.lib.contract import LOSS_PNG, REPORT_JSON, REPORT_MD, ROLES, local_drills, role_root

    report_path = drill_out / REPORT_JSON
    if report_path.exists():
        report = json.loads(report_path.read_text())
        d.update(drill_metrics(report, drill_evidence(drill_out), warmup_steps=args.warmup_steps))
        for f in (REPORT_MD, LOSS_PNG):
            if (drill_out / f).exists():
                shutil.copy(drill_out / f, out / f"drill{suffix}-{f}")
    elif not dp.error:
        dp.error = "the drill wrote no report.json"
    if d.get("passed") is False and not dp.error:
        dp.error = f"the drill failed (see drill{suffix}-report.md)"
    if not args.keep_checkpoints:  # GBs each; the evidence, the verdict and the logs stay
        for drill in local_drills(drill_out / "bucket"):
            for role in ROLES:
                shutil.rmtree(role_root(str(drill), role), ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["build-model"]:
        bp = argparse.ArgumentParser(prog="python -m gpu.check build-model")
        bp.add_argument("out_dir")
        bp.add_argument("--dtype", choices=sorted(BYTES), default="bfloat16")
        bp.add_argument("--tiny", action="store_true", help="the tiny shape (a dry run), not Qwen2.5-0.5B")
        bp.add_argument(
            "--corpus", default=str(CORPUS), help="tokenizer training text (default: the shipped corpus)"
        )
        a = bp.parse_args(argv[1:])
        from trainer.data import read_documents

        t0 = time.monotonic()
        path = build_model(a.out_dir, read_documents(a.corpus), dtype=a.dtype, tiny=a.tiny)
        print(f"model at {path} ({time.monotonic() - t0:.0f} s)")
        return 0
    ap = argparse.ArgumentParser(
        prog="python -m gpu.check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--out", default=str(REPO / "out" / "gpu-check"), help="results folder (default out/gpu-check)"
    )
    ap.add_argument("--model", help="a local Hugging Face model folder instead of the built 0.5B-shaped one")
    ap.add_argument(
        "--model-cache", default=str(REPO / ".baton" / "models"), help="where the built model is kept"
    )
    ap.add_argument(
        "--dtype",
        choices=sorted(BYTES),
        default="bfloat16",
        help="model.dtype of the drill (default bfloat16, the published checkpoint's dtype)",
    )
    ap.add_argument(
        "--ranks", type=int, default=1, help="ranks per run (torchrun --nproc-per-node); 2 on 2 GPUs"
    )
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--evictions", type=int, default=2)
    ap.add_argument("--every-steps", type=int, default=50, help="periodic checkpoint interval")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument(
        "--mode",
        choices=("deterministic", "fast", "both"),
        default="both",
        help="deterministic: eager attention, deterministic kernels, Tier 1; fast: sdpa, torch.compile, "
        "deterministic false, Tier 2 (gpu/fast.py), after a solo run that measures MFU; both (default)",
    )
    for k, v in FAST_DEFAULTS.items():
        ap.add_argument(
            f"--fast-{k.replace('_', '-')}", type=int, default=v, help=f"fast mode's {k} (default {v})"
        )
    ap.add_argument("--solo-steps", type=int, default=30, help="steps of the fast mode's solo throughput run")
    ap.add_argument(
        "--warmup-steps",
        type=int,
        default=3,
        help="steps of each attempt left out of tokens/s (compilation happens there)",
    )
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for everything (default 470 for one mode, 720 for both)",
    )
    ap.add_argument("--skip-preflight", action="store_true")
    ap.add_argument("--skip-drill", action="store_true")
    ap.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep the drill's checkpoints (GBs) under OUT/drill/bucket; by default they go after the check",
    )
    ap.add_argument("--verbose", action="store_true", help="echo the pre-flight's output as it runs")
    ap.add_argument(
        "--allow-cpu", action="store_true", help="run without CUDA (with --tiny: a dry run of the plumbing)"
    )
    ap.add_argument(
        "--tiny", action="store_true", help="a tiny model instead of the 0.5B shape (plumbing only)"
    )
    args = ap.parse_args(argv)
    if args.ranks < 1 or args.steps < 1 or args.evictions < 0:
        ap.error("--ranks and --steps must be >= 1, --evictions >= 0")
    if args.budget is None:
        args.budget = DEFAULT_BUDGET_S[args.mode]
    args.skipped_ok = {
        n for n, flag in (("preflight", args.skip_preflight), ("drill", args.skip_drill)) if flag
    }
    return check(args, argv)


if __name__ == "__main__":
    sys.exit(main())
