"""The peer: Hugging Face `transformers.Trainer` on the same model folder and the same packed samples as
baton (`trainer.data.pack` over the same corpus and tokenizer), in one CPU process.

JSON lines on stdout, each with `event` and `time`: `start` (before the heavy imports), `train_begin`,
`step` (every optimizer step, with `step`), `save` (after a checkpoint is on disk), `done`.

    python -m bench.hf_peer --model DIR --corpus FILE --out DIR --max-steps N [--save-steps S]
        [--resume CHECKPOINT] [--pause-after-save K] [--stop-after-save K] [--dropout P] ...

`--pause-after-save K` holds the process after checkpoint K is written until a signal kills it (the
Trainer has no SIGTERM handler of its own: the process dies at once), so an interruption lands on an
exact step. `--stop-after-save K` ends training cleanly after checkpoint K.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")
    sys.stdout.flush()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.hf_peer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--model", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True, help="output_dir: checkpoint-<step> folders go here")
    ap.add_argument("--max-steps", type=int, required=True)
    ap.add_argument("--save-steps", type=int, default=0, help="0: no checkpoints")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", default=None, help="a checkpoint folder to resume from")
    ap.add_argument("--pause-after-save", type=int, default=None)
    ap.add_argument("--stop-after-save", type=int, default=None)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    emit("start")
    a = parse(argv)
    from pathlib import Path

    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        default_data_collator,
    )
    from transformers.utils import logging as hf_logging

    from trainer.data import pack, read_documents

    hf_logging.set_verbosity_error()
    tok = AutoTokenizer.from_pretrained(a.model)
    samples = pack(read_documents(a.corpus), tok, a.seq_len)

    class Packed(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return samples.shape[0]

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": samples[i], "labels": samples[i]}

    class Events(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            emit("train_begin", step=state.global_step)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            emit("step", step=state.global_step)

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            emit("save", step=state.global_step, path=str(Path(a.out) / f"checkpoint-{state.global_step}"))
            if state.global_step == a.stop_after_save:
                control.should_training_stop = True
            if state.global_step == a.pause_after_save:
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:  # a signal (SIGTERM: default action) ends the process
                    time.sleep(0.05)

    args = TrainingArguments(
        output_dir=a.out,
        max_steps=a.max_steps,
        per_device_train_batch_size=a.batch_size,
        gradient_accumulation_steps=a.grad_accum,
        learning_rate=a.lr,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": 0.1},
        warmup_steps=a.warmup,
        weight_decay=0.01,
        adam_beta1=0.9,
        adam_beta2=0.95,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        save_strategy="steps" if a.save_steps else "no",
        save_steps=a.save_steps or 500,
        logging_strategy="no",
        report_to="none",
        seed=a.seed,
        full_determinism=True,
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    model = AutoModelForCausalLM.from_pretrained(
        a.model, attn_implementation="eager", attention_dropout=a.dropout
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Packed(),
        data_collator=default_data_collator,
        callbacks=[Events()],
    )
    trainer.train(resume_from_checkpoint=a.resume)
    emit("done", step=trainer.state.global_step)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
