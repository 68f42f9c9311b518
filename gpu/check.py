#!/usr/bin/env python3
"""The GPU check: the pre-flight suite, then an equivalence drill on a Qwen2.5-0.5B-shaped model.

    python gpu/check.py [--out out/gpu-check] [--model DIR] [--ranks N] [--steps 100] [--evictions 2]
                        [--dtype bfloat16] [--budget 470] [--skip-preflight] [--skip-drill]
    python gpu/check.py build-model DIR [--dtype bfloat16]       the 0.5B-shaped model alone

Phases, each under its own timeout inside one overall budget (default 470 s, under 8 minutes):
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
import statistics
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: `python gpu/check.py`
    sys.path.insert(0, str(REPO))

EXIT_OK, EXIT_FAIL, EXIT_NO_CUDA = 0, 1, 2
NO_CUDA = "no CUDA device: nothing to check"
CORPUS = REPO / "trainer" / "assets" / "tiny_corpus.txt"

# Qwen/Qwen2.5-0.5B's config.json (Hugging Face Hub), the fields that shape the network.
QWEN25_05B: dict[str, Any] = dict(
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1000000.0,
    rms_norm_eps=1e-6, hidden_act="silu", use_sliding_window=False, sliding_window=32768, max_window_layers=24,
)
QWEN25_05B_PARAMETERS = 494_032_768  # tied: the LM head is the embedding
# `--tiny`: the same code path at a size a CPU runs in seconds (a dry run of the plumbing, not a measurement).
TINY_SHAPE: dict[str, Any] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=1024, max_position_embeddings=512,
                                  sliding_window=512, max_window_layers=2)
BUILD_SEED = 1234
DRILL_GRACE_S = 120  # what the drill's pods get; headroom is reported against each of GRACES
GRACES = (15, 120)
DEFAULT_BUDGET_S = 470
TIMEOUTS = {"preflight": 240, "model": 180}
BYTES = {"float32": 4, "bfloat16": 2}


# ---- the model ---------------------------------------------------------------------------------------

def qwen_config(eos_token_id: int = 0, tiny: bool = False, **overrides: Any):
    """A Qwen2Config of the Qwen2.5-0.5B shape (or `TINY_SHAPE`), with `overrides` on top."""
    from transformers import Qwen2Config

    arch = {**QWEN25_05B, **(TINY_SHAPE if tiny else {}), **overrides}
    return Qwen2Config(bos_token_id=eos_token_id, eos_token_id=eos_token_id, attention_dropout=0.0, **arch)


def parameter_count(config) -> int:
    """Parameters of the causal LM that `config` describes, counted on the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once


def train_tokenizer(docs: list[str]):
    """The tiny trainer's tokenizer recipe (trainer/tiny.py): byte-level BPE on `docs`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from trainer.tiny import EOS, VOCAB_SIZE

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[EOS],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


def build_model(out_dir: Path | str, docs: list[str], dtype: str = "bfloat16", tiny: bool = False,
                **overrides: Any) -> Path:
    """Build (once) the Qwen2.5-0.5B-shaped model with random weights and its tokenizer at `out_dir`."""
    import torch
    from transformers import Qwen2ForCausalLM

    out = Path(out_dir)
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.building-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tokenizer = train_tokenizer(docs)
        tokenizer.save_pretrained(tmp)
        config = qwen_config(eos_token_id=tokenizer.eos_token_id, tiny=tiny, **overrides)
        assert len(tokenizer) <= config.vocab_size, "the tokenizer has more ids than the embedding has rows"
        device = "cuda" if torch.cuda.is_available() else "cpu"  # initialising 0.5B on a GPU takes a second
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(BUILD_SEED)
            if device == "cuda":
                torch.cuda.manual_seed(BUILD_SEED)
            model = Qwen2ForCausalLM(config)
        model.to(getattr(torch, dtype)).save_pretrained(tmp)
        del model
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def write_corpus(path: Path, n_docs: int = 3000) -> Path:
    """The shipped synthetic corpus's generator, ten times longer: ~200 samples of 512 tokens."""
    from trainer.tiny import synthetic_corpus

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(synthetic_corpus(n_docs=n_docs)) + "\n")
    return path


# ---- the drill's config ------------------------------------------------------------------------------

def drill_config(model_dir: Path | str, corpus: Path | str, *, name: str = "gpu-qwen2.5-0.5b-shape",
                 dtype: str = "bfloat16", seq_len: int = 512, batch_size: int = 4, grad_accum: int = 2,
                 every_steps: int = 50, total_steps: int = 100, dropout: float = 0.1, seed: int = 0) -> dict[str, Any]:
    """A trainer config for the drill. The drill overrides checkpoint.uri, total_steps, seed, dropout and
    every_steps per role; keep_last 1 (and no keep-best) bounds the disk: three runs of ~3 GB checkpoints."""
    from trainer.config import CheckpointConfig

    ck: dict[str, Any] = {"uri": "file:///the-drill-sets-checkpoint.uri", "every_steps": every_steps, "keep_last": 1}
    if "keep_best_metric" in {f.name for f in dataclasses.fields(CheckpointConfig)}:
        ck["keep_best_metric"] = ""
    return {
        "name": name, "seed": seed, "total_steps": total_steps, "deterministic": True, "log_every": 10,
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
        return {"ok": self.ok, "rc": self.rc, "seconds": round(self.seconds, 1), "timed_out": self.timed_out,
                "skipped": self.skipped or None, "error": self.error or None, "log": self.log or None}


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_phase(phase: Phase, cmd: list[str], timeout: float, log_path: Path, env: dict[str, str] | None = None,
              echo: bool = True, on_timeout=None) -> Phase:
    """Run `cmd` in its own process group, its output to `log_path` (and echoed). At `timeout`: SIGTERM to
    the group, SIGKILL 30 s later, then `on_timeout()` (to reap what the phase started in other sessions)."""
    phase.log = str(log_path)
    t0 = time.monotonic()
    print(f"== {phase.name}: {shlex.join(cmd)}  (timeout {timeout:.0f} s)", flush=True)
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                             env=env, start_new_session=True, bufsize=1)

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


# ---- reading the results -----------------------------------------------------------------------------------

def junit_counts(path: Path) -> dict[str, int]:
    """tests / passed / failed / errors / skipped from pytest's --junitxml."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    c = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    return {"tests": c["tests"], "passed": c["tests"] - c["failures"] - c["errors"] - c["skipped"],
            "failed": c["failures"], "errors": c["errors"], "skipped": c["skipped"]}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip().startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return out


def drill_evidence(drill_out: Path) -> dict[str, list[dict[str, Any]]]:
    """Every role's records, from the evidence the drill copied into its local bucket."""
    roles: dict[str, list[dict[str, Any]]] = {}
    for folder in sorted(drill_out.glob("bucket/*/*/evidence/*")):
        recs = []
        for f in sorted(folder.glob("*.jsonl")):
            recs += read_jsonl(f)
        roles.setdefault(folder.name, []).extend(recs)
    return roles


def _stats(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    return {"n": len(xs), "median": round(statistics.median(xs), 1), "min": round(min(xs), 1), "max": round(max(xs), 1)}


def drill_metrics(report: dict[str, Any], evidence: dict[str, list[dict[str, Any]]], grace_s: float = DRILL_GRACE_S,
                  graces: tuple[int, ...] = GRACES, warmup_steps: int = 3) -> dict[str, Any]:
    """The numbers worth reporting, from the drill's report.json and the records of every role."""
    out: dict[str, Any] = {}
    tps: dict[str, Any] = {}
    for role, recs in sorted(evidence.items()):
        by_attempt: dict[int, list[dict[str, Any]]] = {}
        for r in recs:
            if r.get("event") == "step" and "tokens_per_s" in r:
                by_attempt.setdefault(r.get("attempt", 0), []).append(r)
        steady = [r["tokens_per_s"] for rs in by_attempt.values()
                  for r in sorted(rs, key=lambda r: r["step"])[warmup_steps:]]
        tps[role] = _stats(steady)
    out["tokens_per_s"] = tps
    checkpoints = [r for recs in evidence.values() for r in recs if r.get("event") == "checkpoint"]
    sizes = [r["bytes"] for r in checkpoints if isinstance(r.get("bytes"), int)]
    out["checkpoint_bytes"] = max(sizes) if sizes else None
    out["checkpoint_gb"] = round(max(sizes) / 1e9, 3) if sizes else None
    by_reason: dict[str, list[float]] = {}
    for r in checkpoints:
        by_reason.setdefault(r.get("reason", "?"), []).append(float(r.get("save_ms", 0.0)))
    out["flush_ms"] = {"all": _stats([x for xs in by_reason.values() for x in xs]),
                       **{reason: _stats(xs) for reason, xs in sorted(by_reason.items())}}
    trial = evidence.get("trial", [])
    preempts = [r for r in trial if r.get("event") == "preempt"] or list(report.get("preempt", []))
    rows = []
    for p in sorted(preempts, key=lambda r: (r.get("attempt", 0), r.get("step", 0))):
        to_commit = grace_s - float(p["grace_left_s"]) if p.get("grace_left_s") is not None else None
        rows.append({"step": p.get("step"), "attempt": p.get("attempt"), "outcome": p.get("outcome"),
                     "save_ms": p.get("save_ms"), "sigterm_to_commit_s": None if to_commit is None else round(to_commit, 2),
                     **{f"headroom_{g}s": None if to_commit is None else round(g - to_commit, 2) for g in graces}})
    out["preemptions"] = rows
    out["headroom_s"] = {str(g): min((r[f"headroom_{g}s"] for r in rows if r[f"headroom_{g}s"] is not None),
                                     default=None) for g in graces}
    resumes = {r.get("attempt"): r for r in trial if r.get("event") == "resume" and not r.get("fresh")}
    restarts = []
    for p in preempts:
        nxt = resumes.get((p.get("attempt") or 0) + 1)
        if nxt and "time" in nxt and "time" in p:
            restarts.append(round(nxt["time"] - p["time"], 2))
    out["restart_s"] = restarts
    for k in ("tier", "equivalent", "passed", "floor", "max_abs_diff", "tensors", "equal_tensors", "floor_differing",
              "verify_passed", "verify_problems"):
        out[k] = report.get(k)
    out["steps"] = report.get("steps")
    return out


# ---- the report ---------------------------------------------------------------------------------------------

def _fmt(x: Any, unit: str = "") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.3g}{unit}" if abs(x) < 1e-2 and x != 0 else f"{x:,.1f}{unit}"
    if isinstance(x, int) and not isinstance(x, bool):
        return f"{x:,}{unit}"
    return f"{x}{unit}"


def markdown(result: dict[str, Any]) -> str:
    dev = result.get("device") or {}
    pre = result.get("preflight") or {}
    model = result.get("model") or {}
    d = result.get("drill") or {}
    ph = result.get("phases", {})
    verdict = "PASSED" if result.get("passed") else "FAILED"
    lines = [f"### GPU check: {dev.get('name', '?')} x {dev.get('count', '?')} ({result.get('date', '?')}): {verdict}",
             "",
             f"`{result.get('command', 'python gpu/check.py')}` in {_fmt(result.get('seconds'))} s; torch "
             f"{dev.get('torch', '?')}, CUDA {dev.get('cuda', '?')}, NCCL {dev.get('nccl', '?')}, "
             f"{d.get('ranks', result.get('ranks', 1))} rank(s).",
             "",
             "| what | value |", "|---|---|"]
    if pre:
        lines.append(f"| pre-flight (`pytest tests/gpu`) | {pre.get('passed', 0)} passed, {pre.get('failed', 0)} failed, "
                     f"{pre.get('errors', 0)} errors, {pre.get('skipped', 0)} skipped "
                     f"({_fmt(ph.get('preflight', {}).get('seconds'))} s) |")
        for m in pre.get("measurements", []):
            if m.get("name", "").startswith("resume_"):
                lines.append(f"| pre-flight {m['name']} (tiny Qwen2) | floor {_fmt(m.get('floor'))}, trial "
                             f"{_fmt(m.get('max_abs_diff'))}, bit-identical {m.get('bit_identical')} |")
    if model:
        lines.append(f"| model | {model.get('source')}: {_fmt(model.get('parameters'))} parameters, "
                     f"{model.get('dtype')}, vocab {_fmt(model.get('vocab_size'))} (tokenizer {model.get('tokenizer_size')}) |")
    if d:
        ref = (d.get("tokens_per_s") or {}).get("reference") or {}
        flush = (d.get("flush_ms") or {}).get("all") or {}
        lines += [
            f"| drill | {d.get('total_steps')} steps, {d.get('evictions')} evictions, seq {d.get('seq_len')}, "
            f"{d.get('tokens_per_step')} tokens/step |",
            f"| tokens/s (reference, median; 3 runs share the GPU) | {_fmt(ref.get('median'))} |",
            f"| checkpoint size | {_fmt(d.get('checkpoint_gb'))} GB |",
            f"| flush (save_ms, all saves) | median {_fmt(flush.get('median'))} ms, max {_fmt(flush.get('max'))} ms "
            f"({flush.get('n', 0)} saves) |",
        ]
        for p in d.get("preemptions", []):
            lines.append(f"| eviction at step {p['step']} ({p['outcome']}) | SIGTERM to commit {_fmt(p['sigterm_to_commit_s'])} s: "
                         + ", ".join(f"headroom {_fmt(p[f'headroom_{g}s'])} s of {g} s" for g in GRACES) + " |")
        if d.get("restart_s"):
            lines.append(f"| restart (preempt record to resumed) | {', '.join(_fmt(x) for x in d['restart_s'])} s |")
        lines += [
            f"| floor (reference vs replay, max abs diff) | {_fmt(d.get('floor'))} ({d.get('floor_differing')} tensors differ) |",
            f"| trial vs reference | {_fmt(d.get('max_abs_diff'))}; {d.get('equal_tensors')}/{d.get('tensors')} tensors equal |",
            f"| equivalence (tier {d.get('tier')}) | {'within the floor' if d.get('equivalent') else 'NOT within the floor'}; "
            f"drill {'PASSED' if d.get('passed') else 'FAILED'} |",
        ]
    for name, p in ph.items():
        if not p.get("ok"):
            lines.append(f"| phase {name} | {p.get('skipped') or p.get('error') or 'failed'} |")
    return "\n".join(lines) + "\n"


def console(result: dict[str, Any]) -> str:
    return markdown(result).replace("| what | value |\n|---|---|\n", "").replace("`", "")


# ---- the check ------------------------------------------------------------------------------------------------

DEVICE_INFO = """
import json, torch
p = torch.cuda.get_device_properties(0)
print(json.dumps({"name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
                  "memory_gib": round(p.total_memory / 2**30, 1), "capability": f"{p.major}.{p.minor}",
                  "torch": torch.__version__, "cuda": torch.version.cuda, "nccl": str(torch.cuda.nccl.version())}))
"""


def device_info(timeout: float = 120) -> dict[str, Any]:
    """Asked in a child process, so that this one never holds a CUDA context while the drill runs."""
    p = subprocess.run([sys.executable, "-c", DEVICE_INFO], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"CUDA is reported but unusable: {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    env.update(PYTHONUNBUFFERED="1", CUBLAS_WORKSPACE_CONFIG=env.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8"), **extra)
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
                out = subprocess.run([self._smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout
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
            raise SystemExit(f"error: {out} holds something else than an earlier check's results; choose another --out")
        shutil.rmtree(out)  # an earlier check's results: replaced
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "command": "python gpu/check.py" + (" " + shlex.join(argv) if argv else ""),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "passed": False, "ranks": args.ranks,
        "budget_s": args.budget, "phases": {},
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
        result["device"] = device_info() if cuda else {"name": "CPU (--allow-cpu: plumbing only)", "count": 0,
                                                        "torch": torch.__version__}
    except (RuntimeError, subprocess.SubprocessError, json.JSONDecodeError) as e:
        phases["device"] = Phase("device", error=str(e))
        save()
        print(f"error: {e}")
        return EXIT_FAIL
    dev = result["device"]
    print(f"GPU check on {dev.get('name')} x {dev.get('count')}, torch {dev.get('torch')}, CUDA {dev.get('cuda')}; "
          f"budget {args.budget:.0f} s; results in {out}", flush=True)
    if args.ranks > max(1, int(dev.get("count") or 0)) and cuda:
        raise SystemExit(f"error: --ranks {args.ranks} needs {args.ranks} GPUs, this machine has {dev.get('count')}")

    # 1. pre-flight
    pf = phases["preflight"] = Phase("preflight")
    if args.skip_preflight:
        pf.skipped = "--skip-preflight"
    else:
        measure = out / "preflight-measure.jsonl"
        junit = out / "preflight.xml"
        run_phase(pf, [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "tests/gpu",
                       f"--junitxml={junit}"], min(TIMEOUTS["preflight"], max(30.0, left() - 60)),
                  out / "preflight.log", env=child_env(BATON_GPU_MEASURE=str(measure)), echo=args.verbose)
        if junit.exists():
            result["preflight"] = {**junit_counts(junit), "measurements": read_jsonl(measure)}
        if pf.rc == 5:  # pytest: no tests collected
            pf.error = "pytest collected no tests"
        elif cuda and pf.ok and result.get("preflight", {}).get("passed", 0) == 0:
            pf.error = "the pre-flight passed no test on this GPU machine (all skipped?)"
    save()

    # 2. the model
    mp = phases["model"] = Phase("model")
    corpus = write_corpus(out / "corpus.txt", n_docs=300 if args.tiny else 3000)
    if args.model:
        model_dir = Path(args.model).resolve()
        source = f"--model {model_dir}"
        if not (model_dir / "config.json").exists():
            mp.error = f"--model {model_dir}: not a Hugging Face model folder (no config.json)"
        mp.rc = 0 if not mp.error else 1
    else:
        shape = "tiny" if args.tiny else "qwen2.5-0.5b-shape"
        model_dir = (Path(args.model_cache) / f"{shape}-{args.dtype}").resolve()
        source = "Qwen2.5-0.5B shape, random weights" if not args.tiny else "tiny shape (--tiny), random weights"
        cmd = [sys.executable, str(Path(__file__).resolve()), "build-model", str(model_dir), "--dtype", args.dtype]
        if args.tiny:
            cmd.append("--tiny")
        if left() < 60:
            mp.skipped = "no time left in the budget"
        else:
            run_phase(mp, cmd, min(TIMEOUTS["model"], left() - 30), out / "model.log", env=child_env())
    if mp.ok:
        try:
            from transformers import AutoConfig, AutoTokenizer

            config = AutoConfig.from_pretrained(model_dir)
            result["model"] = {"source": source, "path": str(model_dir), "dtype": args.dtype,
                               "parameters": parameter_count(config), "vocab_size": config.vocab_size,
                               "tokenizer_size": len(AutoTokenizer.from_pretrained(model_dir)),
                               "shape": {k: getattr(config, k, None) for k in QWEN25_05B if k != "rope_theta"}}
        except Exception as e:  # a folder that does not load is this phase's failure, said plainly
            mp.error = f"the model folder does not load: {type(e).__name__}: {e}"
    save()

    # 3. the drill
    dp = phases["drill"] = Phase("drill")
    if args.skip_drill:
        dp.skipped = "--skip-drill"
    elif not mp.ok:
        dp.skipped = "no model"
    elif left() < 90:
        dp.skipped = f"only {left():.0f} s left in the budget of {args.budget:.0f} s"
    else:
        seq = 128 if args.tiny else args.seq_len
        raw = drill_config(model_dir, corpus, name="gpu-" + ("tiny" if args.tiny else Path(model_dir).name.replace("_", "-")),
                           dtype=args.dtype, seq_len=seq, batch_size=args.batch_size, grad_accum=args.grad_accum,
                           every_steps=args.every_steps, total_steps=args.steps)
        cfg_path = write_drill_config(out / "drill-config.yaml", raw)
        params = result["model"]["parameters"]
        need = params * BYTES[args.dtype] * 3 * 7  # weights + two Adam moments; three runs, ~2 checkpoints each
        free = shutil.disk_usage(out).free
        d: dict[str, Any] = {"total_steps": args.steps, "evictions": args.evictions, "ranks": args.ranks,
                             "seq_len": seq, "tokens_per_step": seq * args.batch_size * args.grad_accum * args.ranks,
                             "config": str(cfg_path), "grace_s": DRILL_GRACE_S, "disk_free_gb": round(free / 1e9, 1)}
        result["drill"] = d
        if free < need:
            dp.error = (f"not enough disk under {out}: {free / 1e9:.1f} GB free, the drill needs about "
                        f"{need / 1e9:.1f} GB (three runs of {params * BYTES[args.dtype] * 3 / 1e9:.1f} GB checkpoints)")
        else:
            drill_out = out / "drill"
            cmd = [sys.executable, str(REPO / "workflows" / "equivalence.py"), "run", "--out", str(drill_out), "--force",
                   "-p", f"config={cfg_path}", "-p", f"total_steps={args.steps}", "-p", f"evictions={args.evictions}",
                   "-p", f"grace={DRILL_GRACE_S}", "-p", f"every_steps={args.every_steps}", "-p", "dropout=0.1",
                   "-p", f"ranks={args.ranks}", "-p", "seed=0"]
            with MemorySampler() as mem:
                run_phase(dp, cmd, left() - 15, out / "drill.log", env=child_env(),
                          on_timeout=lambda: reap_pods(drill_out / "argo" / "pods"))
            d["gpu_memory_peak_mib"] = mem.peak_mib
            report_path = drill_out / "report.json"
            if report_path.exists():
                report = json.loads(report_path.read_text())
                d.update(drill_metrics(report, drill_evidence(drill_out)))
                for f in ("report.md", "loss.png"):
                    if (drill_out / f).exists():
                        shutil.copy(drill_out / f, out / f"drill-{f}")
            elif not dp.error:
                dp.error = "the drill wrote no report.json"
            if d.get("passed") is False and not dp.error:
                dp.error = "the drill failed (see drill-report.md)"

    result["passed"] = all(p.ok or (p.skipped and name in args.skipped_ok) for name, p in phases.items())
    save()
    print()
    print(console(result))
    print(f"check {'PASSED' if result['passed'] else 'FAILED'} in {time.monotonic() - started:.0f} s; "
          f"{out / 'gpu-check.json'}, {out / 'gpu-check.md'}")
    return EXIT_OK if result["passed"] else EXIT_FAIL


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["build-model"]:
        bp = argparse.ArgumentParser(prog="python gpu/check.py build-model")
        bp.add_argument("out_dir")
        bp.add_argument("--dtype", choices=sorted(BYTES), default="bfloat16")
        bp.add_argument("--tiny", action="store_true", help="the tiny shape (a dry run), not Qwen2.5-0.5B")
        bp.add_argument("--corpus", default=str(CORPUS), help="tokenizer training text (default: the shipped corpus)")
        a = bp.parse_args(argv[1:])
        from trainer.data import read_documents

        t0 = time.monotonic()
        path = build_model(a.out_dir, read_documents(a.corpus), dtype=a.dtype, tiny=a.tiny)
        print(f"model at {path} ({time.monotonic() - t0:.0f} s)")
        return 0
    ap = argparse.ArgumentParser(prog="python gpu/check.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "out" / "gpu-check"), help="results folder (default out/gpu-check)")
    ap.add_argument("--model", help="a local Hugging Face model folder instead of the built 0.5B-shaped one")
    ap.add_argument("--model-cache", default=str(REPO / ".baton" / "models"), help="where the built model is kept")
    ap.add_argument("--dtype", choices=sorted(BYTES), default="bfloat16",
                    help="model.dtype of the drill (default bfloat16, the published checkpoint's dtype)")
    ap.add_argument("--ranks", type=int, default=1, help="ranks per run (torchrun --nproc-per-node); 2 on 2 GPUs")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--evictions", type=int, default=2)
    ap.add_argument("--every-steps", type=int, default=50, help="periodic checkpoint interval")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds for everything (default 470)")
    ap.add_argument("--skip-preflight", action="store_true")
    ap.add_argument("--skip-drill", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="echo the pre-flight's output as it runs")
    ap.add_argument("--allow-cpu", action="store_true", help="run without CUDA (with --tiny: a dry run of the plumbing)")
    ap.add_argument("--tiny", action="store_true", help="a tiny model instead of the 0.5B shape (plumbing only)")
    args = ap.parse_args(argv)
    if args.ranks < 1 or args.steps < 1 or args.evictions < 0:
        ap.error("--ranks and --steps must be >= 1, --evictions >= 0")
    args.skipped_ok = {n for n, flag in (("preflight", args.skip_preflight), ("drill", args.skip_drill)) if flag}
    return check(args, argv)


if __name__ == "__main__":
    sys.exit(main())
