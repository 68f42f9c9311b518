"""A plain Hugging Face `Trainer` script, made preemption-safe by baton's callback (three lines, marked).

    python examples/hf_trainer/train.py --config examples/hf_trainer/config.yaml [--set key=value ...]
    python -m steps.train --nproc N --trainer hf --config examples/hf_trainer/config.yaml [--set ...]

The shipped tiny Qwen2 (built locally, nothing downloaded) on the shipped corpus, `full_determinism`,
attention dropout from `model.dropout`. The keys are baton's config keys (trainer/config.py), so the
drill's `--set seed=... total_steps=... model.dropout=... checkpoint.uri=... checkpoint.every_steps=...`
mean the same here; keys the Trainer has no use for are ignored.

Checkpoints: HF writes `checkpoint-N/` into a local `output_dir` (`$BATON_HF_OUTPUT_DIR`, else a
folder under the temp dir for this launch: a pod's local disk); the callback mirrors each committed
one to `checkpoint.uri` (file://, s3://, gs://) with `_COMMIT` last, and fetches the newest back on
start.

`BATON_DISABLE_SIGTERM_HANDLER=1` runs the same script without the callback, as a stock HF script
would: `output_dir` is `checkpoint.uri` itself (a local path or file://; HF writes nowhere else), it
resumes with `get_last_checkpoint`, and SIGTERM kills it. A `StepRecords` callback only makes its steps
visible to `verify`. This is the drill's negative control for HF.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="YAML config in baton's schema")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from trainer.preemption import sigterm_handler_disabled

    try:
        stock = sigterm_handler_disabled()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    baton = None
    if not stock:
        from trainer.hf import BatonCallback  # baton (1/3)

    args = parse_args(argv)
    from trainer.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not stock:
        baton = BatonCallback(
            checkpoint_uri=cfg.checkpoint.uri,
            run_id=cfg.run_id,  # baton (2/3)
            keep_last=cfg.checkpoint.keep_last,
            faults=cfg.faults,
        )

    import torch
    from torch.utils.data import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, Trainer, TrainingArguments
    from transformers.trainer_utils import get_last_checkpoint

    from trainer.data import pack, read_documents
    from trainer.model import ensure_model

    model_dir = ensure_model(cfg).path  # a folder, or a bucket's weights copied once to this machine
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    samples = pack(read_documents(cfg.data.uri, cfg.data.text_field), tokenizer, cfg.data.seq_len)

    class Packed(Dataset):
        def __len__(self) -> int:
            return samples.shape[0]

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": samples[i], "labels": samples[i]}

    if stock:
        uri = cfg.checkpoint.uri
        if "://" in uri and not uri.startswith("file://"):
            print(
                f"error: config key 'checkpoint.uri': a stock HF Trainer writes only to a local folder, "
                f"got {uri!r}",
                file=sys.stderr,
            )
            return 1
        output_dir = uri.removeprefix("file://")
    else:
        launch = os.environ.get("TORCHELASTIC_RUN_ID") or str(os.getpid())  # shared by a launch's ranks
        output_dir = os.environ.get("BATON_HF_OUTPUT_DIR") or os.path.join(
            tempfile.gettempdir(), f"baton-hf-{launch}"
        )
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation="eager", attention_dropout=cfg.model.dropout
    )
    cpu = not torch.cuda.is_available()
    targs = TrainingArguments(
        output_dir=output_dir,
        max_steps=cfg.total_steps,
        seed=cfg.seed,
        full_determinism=cfg.deterministic,
        per_device_train_batch_size=cfg.data.batch_size,
        gradient_accumulation_steps=cfg.data.grad_accum,
        learning_rate=cfg.optim.lr,
        adam_beta1=cfg.optim.betas[0],
        adam_beta2=cfg.optim.betas[1],
        adam_epsilon=cfg.optim.eps,
        weight_decay=cfg.optim.weight_decay,
        max_grad_norm=cfg.optim.grad_clip,
        warmup_steps=cfg.optim.warmup_steps,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": cfg.optim.min_lr_ratio},
        save_strategy="steps" if cfg.checkpoint.every_steps else "no",
        save_steps=cfg.checkpoint.every_steps or 500,
        save_total_limit=2,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        use_cpu=cpu,
        ddp_backend="gloo" if cpu and int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        ddp_find_unused_parameters=False,
        dataloader_num_workers=cfg.data.num_workers,
        # A dead or hung rank ends the pod inside its grace, not after HF's default of 30 minutes.
        ddp_timeout=math.ceil(cfg.faults.collective_timeout().total_seconds()),
    )
    if stock:
        from trainer.hf import StepRecords

        callbacks = [StepRecords(run_id=cfg.run_id)]
    else:
        callbacks = [baton]
    trainer = Trainer(model=model, args=targs, train_dataset=Packed(), callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)  # it prints Python dicts on stdout, where the records go
    if stock:
        last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
        trainer.train(resume_from_checkpoint=last)
        return 0
    code = baton.run(trainer)  # baton (3/3): instead of trainer.train(); 0 done, 75 preempted, 1 failed
    if not os.environ.get("BATON_HF_OUTPUT_DIR") and os.environ.get("LOCAL_RANK", "0") == "0":
        shutil.rmtree(output_dir, ignore_errors=True)  # the pod's scratch copy; the bucket holds what counts
    return code


if __name__ == "__main__":
    sys.exit(main())
