"""Resume cost: seconds from a restart's spawn to its first optimizer step, at a small step K and at a K
more than 10^4 batches into an epoch, for baton and for the Hugging Face Trainer.

Same model (tiny Qwen2), same packed samples (a synthetic corpus of ~24 k samples of 16 tokens, batch
1: one epoch is ~24 k batches), same optimizer. Checkpoints at step K are made without training K
steps, the same way for both K (so the only difference between the restarts is the position):
- baton: the trainer is built in this process, its loader is advanced by K batches, and
  `Store.save` commits that state at step K (progress, loader position, RNG, model, optimizer);
- HF: one real step and a checkpoint (`checkpoint-1`), copied to `checkpoint-K` with `global_step`
  set to K in trainer_state.json; `resume_from_checkpoint` then skips K batches of the epoch.
Each restart is a fresh process, killed after its first step; sides and K interleaved, `reps` each.
The launch: baton's restart at the small K once more through the pod's PID 1, `steps.train --nproc 1`,
with `--launcher direct` (the default for one rank) and `--launcher torchrun`: torchrun's own cost.

    python -m bench.resume --result FILE [--reps 3] [--quick]
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from bench.common import (
    PY,
    REPO,
    WORK,
    hf_peer_cmd,
    interleaved,
    log,
    median,
    run_records,
    section_args,
    timed_until,
    write_result,
)
from bench.models import resume_corpus, tiny_model
from trainer.checkpoint import hf_step_name

SEQ = 16
CONFIG = REPO / "trainer" / "configs" / "tiny.yaml"


def baton_sets(model: Path, corpus: Path, ckpt: Path, total: int) -> list[str]:
    return [
        "name=bench-resume",
        f"model.path={model}",
        f"data.uri={corpus}",
        f"data.seq_len={SEQ}",
        "data.batch_size=1",
        "data.grad_accum=1",
        f"total_steps={total}",
        f"checkpoint.uri=file://{ckpt}",
        "checkpoint.every_steps=0",
        "notice.enabled=false",
        "log_every=100000",
    ]


def baton_fabricate(sets: list[str], k: int) -> None:
    """Commit a checkpoint at step k whose data position is k batches into epoch 0."""
    from bench.state import close, manifest_of
    from trainer.config import load_config
    from trainer.loop import Trainer
    from trainer.preemption import Preemption

    t = Trainer(load_config(CONFIG, sets), Preemption())
    try:
        t.build()
        for _ in range(k):
            t.data.next_batch()
        t.step = k
        t.ckpt.store.save(k, t.ckpt.state(t.boundary(), t.parts), manifest_of(t), t.attempt)
    finally:
        close(t)


def hf_cmd(model: Path, corpus: Path, out: Path, total: int, *extra: str) -> list[str]:
    return hf_peer_cmd(
        model, corpus, out, total, "--seq-len", str(SEQ), "--batch-size", "1", "--grad-accum", "1", *extra
    )


def hf_fabricate(model: Path, corpus: Path, out: Path, total: int, ks: list[int]) -> None:
    rc, _ = run_records(hf_cmd(model, corpus, out, total, "--save-steps", "1", "--stop-after-save", "1"))
    if rc != 0:
        raise RuntimeError(f"HF peer failed to write checkpoint-1 (exit {rc})")
    for k in ks:
        dst = out / hf_step_name(k)
        shutil.copytree(out / "checkpoint-1", dst)
        state_file = dst / "trainer_state.json"
        state = json.loads(state_file.read_text())
        state["global_step"] = k
        state_file.write_text(json.dumps(state))


def main() -> None:
    args = section_args(__doc__ or "")
    root = WORK / "resume"
    shutil.rmtree(root, ignore_errors=True)
    model = tiny_model()
    corpus = resume_corpus(1500 if args.quick else 11000)
    ks = [10, 2000] if args.quick else [10, 20000]
    total = ks[-1] + 1000
    from trainer.data import pack, read_documents
    from trainer.model import load_tokenizer

    n_batches = len(pack(read_documents(str(corpus)), load_tokenizer(model), SEQ))
    log(f"resume corpus: {n_batches} batches of 1 x {SEQ} tokens per epoch; K = {ks}")
    for k in ks:
        baton_fabricate(baton_sets(model, corpus, root / f"baton-{k}", total), k)
    hf_fabricate(model, corpus, root / "hf", total, ks)
    log("checkpoints at each K are in place")

    def cmd(side: str, k: int) -> list[str]:
        if side.startswith("baton"):
            launch = ["-m", "trainer"]
            if side != "baton":  # baton-direct, baton-torchrun: through steps.train
                launch = ["-m", "steps.train", "--nproc", "1", "--launcher", side.removeprefix("baton-")]
            c = [PY, *launch, "--config", str(CONFIG)]
            for s in baton_sets(model, corpus, root / f"baton-{k}", total):
                c += ["--set", s]
            return c
        return hf_cmd(model, corpus, root / "hf", total, "--resume", str(root / "hf" / hf_step_name(k)))

    names = [f"{side}@{k}" for side in ("baton", "hf") for k in ks]
    names += [f"baton-{launcher}@{ks[0]}" for launcher in ("direct", "torchrun")]
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for rep, name in interleaved(args.reps, names):
        side, k = name.split("@")
        # Over the same checkpoint again: the restart that reaches its first step is killed before it saves.
        secs, recs, _ = timed_until(cmd(side, int(k)), lambda r: r.get("event") == "step")
        first = next((r["step"] for r in recs if r.get("event") == "step"), None)
        if first != int(k) + 1:
            raise RuntimeError(f"{name}: the first step after the restart was {first}, expected {int(k) + 1}")
        # The last phase: from the restore being done (baton's `resume` record; HF's train_begin, after
        # the checkpoint load and before the batch skip) to the first step.
        mark = next((r["time"] for r in recs if r.get("event") in ("resume", "train_begin")), None)
        step_t = next(r["time"] for r in recs if r.get("event") == "step")
        phases = next((r.get("phases") for r in recs if r.get("event") == "resume"), None)
        runs[name].append({"s": secs, "tail_s": None if mark is None else step_t - mark, "phases": phases})
        log(
            f"resume rep {rep + 1}/{args.reps} {name}: first step (step {first}) {secs:.2f} s after the spawn"
        )
    result: dict[str, Any] = {"ks": ks, "batches_per_epoch": n_batches, "runs": runs}
    for name, rs in runs.items():
        result[f"{name}_s"] = median([r["s"] for r in rs])
        tails = [r["tail_s"] for r in rs if r["tail_s"] is not None]
        result[f"{name}_tail_s"] = median(tails) if tails else None
        phased = [r["phases"] for r in rs if r.get("phases")]
        if phased:  # baton's restart, phase by phase (the `resume` record), medians
            result[f"{name}_phases"] = {k: median([p[k] for p in phased if k in p]) for k in phased[0]}
    shutil.rmtree(root, ignore_errors=True)
    write_result(args.result, result)


if __name__ == "__main__":
    main()
