"""Start to first step, at three model sizes, against what a start cannot avoid (issue 28, item 1).

For each size, a checkpoint is committed at step K (built in this process, as bench.resume does), then,
interleaved, `reps` times each:
- restart: `python -m steps.train --nproc 1` (the pod's PID 1, the direct launcher) resuming from it;
  seconds from the spawn to its first step record, its `resume` record's phases, and its steady step
  time (the median gap between its step records K+3 .. K+6);
- imports: a fresh `python -c "import torch, transformers"`, spawn to exit;
- imports_paused: the same with Python's cyclic collector paused first, as `python -m trainer` pauses it
  for its own start (trainer/collector.py): the floor a start with that pause is held to as well;
- raw_read: every file of the committed step read once, in this process (the page cache is as warm as
  for the restart, which ran just before or after).
The floor is imports + raw_read + one steady step; the goal is restart <= 1.5x the floor.

Sizes (Qwen2, random weights from a fixed seed, built here; the tiny tokenizer's ids drive them all):
`17m` (hidden 256, 2 layers, vocab 32000, untied: ~18 M), `125m` (bench.models' big one) and `0.5b-shape`
(Qwen2.5-0.5B's hidden 896, MLP 4864, 14 heads and 2 KV heads, vocab 151936, tied, but 4 layers of its 24:
~196 M parameters, a 2.4 GB checkpoint with AdamW; 24 layers would need ~6 GB of checkpoint and three
copies of it in memory on a 23 GB machine).

    python -m bench.startup --result FILE [--reps 3] [--quick]
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import (
    PY,
    REPO,
    TINY_CORPUS,
    WORK,
    child_env,
    interleaved,
    log,
    median,
    section_args,
    timed_until,
    write_result,
)
from bench.models import BIG_ARCH, n_params, tiny_model
from bench.resume import baton_fabricate
from trainer.checkpoint import open_root
from trainer.storage import local_path

CONFIG = REPO / "trainer" / "configs" / "tiny.yaml"
K = 10
STEADY_FROM, STEADY_TO = K + 3, K + 6
SIZES: dict[str, dict[str, Any]] = {
    "17m": dict(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=32000,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    ),
    "125m": BIG_ARCH,
    "0.5b-shape": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=4,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
}
QUICK_SIZES = ("17m",)


def build_model(name: str, arch: dict[str, Any]) -> tuple[Path, int]:
    """The model folder (weights, config and the tiny tokenizer) and its parameter count."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    out = WORK / "models" / f"startup-{name}"
    tok = AutoTokenizer.from_pretrained(tiny_model())
    config = Qwen2Config(
        eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id, attention_dropout=0.0, **arch
    )
    with torch.random.fork_rng():
        torch.manual_seed(1234)
        model = Qwen2ForCausalLM(config)
    count = n_params(model)
    if not (out / "config.json").exists():
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.rename(out)
    return out, count


def sets(model: Path, ckpt: Path) -> list[str]:
    return [
        f"name=bench-startup-{model.name}",
        f"model.path={model}",
        f"data.uri={TINY_CORPUS}",
        f"total_steps={K + 1000}",
        f"checkpoint.uri=file://{ckpt}",
        "checkpoint.every_steps=0",
        "notice.enabled=false",
        "log_every=100000",
    ]


def fabricate(s: list[str], ckpt: Path) -> tuple[Path, int]:
    """Commit a checkpoint at step K (data position K batches in, as bench.resume does); its folder and
    its bytes."""
    baton_fabricate(s, K)
    url, manifest = open_root(f"file://{ckpt}").final()  # the package finds it: the bench knows no layout
    assert manifest["step"] == K, (url, manifest["step"])
    folder = Path(local_path(url) or url)
    return folder, sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def raw_read(folder: Path) -> float:
    t0 = time.perf_counter()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            with open(p, "rb", buffering=0) as f:
                while f.read(1 << 24):
                    pass
    return time.perf_counter() - t0


def bare_imports(paused: bool = False) -> float:
    code = (
        "from trainer import collector; collector.pause(); " if paused else ""
    ) + "import torch, transformers"
    t0 = time.monotonic()
    subprocess.run([PY, "-c", code], check=True, env=child_env(), cwd=REPO)
    return time.monotonic() - t0


def restart(cmd: list[str]) -> dict[str, Any]:
    secs, recs, _ = timed_until(
        cmd, lambda r: r.get("event") == "step" and r.get("step") == STEADY_TO, timeout=600
    )
    steps = {r["step"]: r["time"] for r in recs if r.get("event") == "step"}
    if secs is None or min(steps, default=None) != K + 1:
        raise RuntimeError(
            f"the restart did not resume at step {K + 1} and reach {STEADY_TO}: steps {sorted(steps)}"
        )
    gaps = [steps[s + 1] - steps[s] for s in range(STEADY_FROM, STEADY_TO)]
    first = secs - (steps[STEADY_TO] - steps[K + 1])  # spawn to the first step record
    phases = next((r.get("phases") for r in recs if r.get("event") == "resume"), None) or {}
    return {"first_step_s": first, "steady_step_s": median(gaps), "phases": phases}


def main() -> None:
    args = section_args(__doc__ or "")
    root = WORK / "startup"
    shutil.rmtree(root, ignore_errors=True)
    result: dict[str, Any] = {"k": K, "sizes": {}}
    for name in QUICK_SIZES if args.quick else SIZES:
        model, count = build_model(name, SIZES[name])
        ckpt = root / name
        s = sets(model, ckpt)
        folder, nbytes = fabricate(s, ckpt)
        log(f"startup {name}: {count / 1e6:.1f} M parameters, checkpoint at step {K}: {nbytes / 1e9:.2f} GB")
        cmd = [PY, "-m", "steps.train", "--nproc", "1", "--config", str(CONFIG)]
        for x in s:
            cmd += ["--set", x]
        runs: dict[str, list[Any]] = {"restart": [], "imports": [], "imports_paused": [], "raw_read": []}
        for rep, side in interleaved(args.reps, list(runs)):
            value = (
                restart(cmd)
                if side == "restart"
                else raw_read(folder)
                if side == "raw_read"
                else bare_imports(paused=side == "imports_paused")
            )
            runs[side].append(value)
            shown = value["first_step_s"] if side == "restart" else value
            log(f"startup {name} rep {rep + 1}/{args.reps} {side}: {shown:.2f} s")
        first = median([r["first_step_s"] for r in runs["restart"]])
        step = median([r["steady_step_s"] for r in runs["restart"]])
        imports, read = median(runs["imports"]), median(runs["raw_read"])
        paused = median(runs["imports_paused"])
        phased = [r["phases"] for r in runs["restart"] if r["phases"]]
        result["sizes"][name] = {
            "params": count,
            "checkpoint_bytes": nbytes,
            "first_step_s": first,
            "steady_step_s": step,
            "imports_s": imports,
            "raw_read_s": read,
            "floor_s": imports + read + step,
            "ratio": first / (imports + read + step),
            "imports_paused_s": paused,
            "ratio_paused": first / (paused + read + step),
            "phases": {k: median([p[k] for p in phased if k in p]) for k in (phased[0] if phased else {})},
            "runs": runs,
        }
        shutil.rmtree(ckpt, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    write_result(args.result, result)


if __name__ == "__main__":
    main()
