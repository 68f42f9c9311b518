"""The third new user's HF script: what real fine-tuning scripts have and the first two lacked. An EMA of the
weights kept by a TrainerCallback and saved into each checkpoint-N; a DataLoader of its own (a Trainer
subclass's get_train_dataloader) with worker processes and a worker_init_fn; augmentation in the workers,
drawn from a generator seeded by (seed, epoch, sample), told its epoch through the dataset's set_epoch; a
cosine schedule with warm-up, gradient clipping, label smoothing, gradient accumulation. Its correct form and
the ways it goes wrong are the certifier's third round (tests/workflow/test_certifier_own_loader.py).

    python tests/hf_variants/own_loader.py --config examples/hf_trainer/config.yaml [--set key=value ...]

`OWN_VARIANT`:
    correct               as above, the EMA callback given before baton's
    ema_after             correct, the EMA callback given after baton's (baton commits last whatever the order)
    ema_late              the EMA writes its file at the next step's start, into the checkpoint committed
                          before: after the commit, in no manifest
    ema_not_restored      the EMA is not loaded at a resume: its shadow restarts from the weights
    counter_not_restored  the EMA's shadow is loaded, its update counter (which sets the decay) restarts at 0
    numpy_global          the augmentation draws from numpy's global RNG in the workers
    main_collate          no workers; the collate_fn of the script's own loader draws from numpy's global RNG
                          (exact only if baton handles the batch collated ahead with any collate_fn)
    stream                correct, over an endless IterableDataset (each worker its share of the samples)
    workers_die           correct, and the worker_init_fn puts SIGTERM back to its default action and unblocks it
`OWN_WORKERS` (default 2): the loader's worker processes. `OWN_SAMPLES=<n>`: the first n packed samples.
`HF_NOISE`, `HF_VARIANT_OUTPUT_DIR`: as tests/hf_variants/train.py.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys

VARIANT = os.environ.get("OWN_VARIANT", "correct")
VARIANTS = (
    "correct",
    "ema_after",
    "ema_late",
    "ema_not_restored",
    "counter_not_restored",
    "numpy_global",
    "main_collate",
    "stream",
    "workers_die",
)
EMA_FILE = "ema.pt"


def main() -> int:
    if VARIANT not in VARIANTS:
        print(f"error: OWN_VARIANT must be one of {', '.join(VARIANTS)}, got {VARIANT!r}", file=sys.stderr)
        return 1
    from baton.hf import BatonCallback, baton_args

    cfg = baton_args()
    baton = BatonCallback(
        checkpoint_uri=cfg.checkpoint.uri,
        run_id=cfg.run_id,
        keep_last=cfg.checkpoint.keep_last,
        faults=cfg.faults,
    )

    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset, IterableDataset
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        PrinterCallback,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from trainer.data import pack, read_documents
    from trainer.model import ensure_model

    model_dir = ensure_model(cfg).path
    samples = pack(read_documents(cfg.data.uri), AutoTokenizer.from_pretrained(model_dir), cfg.data.seq_len)
    samples = samples[: int(os.environ.get("OWN_SAMPLES", "0")) or None]
    workers = 0 if VARIANT == "main_collate" else int(os.environ.get("OWN_WORKERS", "2"))

    def augment(ids: torch.Tensor, epoch: int, index: int) -> dict[str, torch.Tensor]:
        """A random 10% of the labels ignored: from numpy's global RNG (the bug), else from a generator of
        the sample's own, seeded by (seed, epoch, index), the same wherever and whenever it is drawn."""
        if VARIANT == "numpy_global":
            draws = np.random.random(ids.shape)
        else:
            draws = np.random.default_rng([cfg.seed, epoch, index]).random(ids.shape)
        labels = ids.clone()
        labels[torch.from_numpy(draws < 0.1)] = -100
        return {"input_ids": ids, "labels": labels}

    class Augmented(Dataset):
        def __init__(self) -> None:
            self.epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __len__(self) -> int:
            return samples.shape[0]

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            if VARIANT == "main_collate":
                return {"input_ids": samples[i], "labels": samples[i].clone()}
            return augment(samples[i], self.epoch, i)

    class Stream(IterableDataset):
        """Endless: sample k of the stream is packed sample k mod n; each worker yields its share."""

        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            first, step = (info.id, info.num_workers) if info else (0, 1)
            for k in itertools.count(first, step):
                yield augment(samples[k % samples.shape[0]], 0, k)

    def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        batch = {k: torch.stack([it[k] for it in items]) for k in items[0]}
        if (
            VARIANT == "main_collate"
        ):  # augmentation in the collate_fn, from numpy's global RNG, in this process
            batch["labels"] = batch["labels"].masked_fill(
                torch.from_numpy(np.random.random(batch["labels"].shape) < 0.1), -100
            )
        return batch

    def worker_init(worker_id: int) -> None:
        np.random.seed((torch.initial_seed() + worker_id) % 2**32)  # the usual recipe
        if VARIANT == "workers_die":  # SIGTERM's default action back, and unblocked: what baton set is undone
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    class OwnLoaderTrainer(Trainer):
        def get_train_dataloader(self) -> DataLoader:
            dataset = Stream() if VARIANT == "stream" else Augmented()
            loader = DataLoader(
                dataset,
                batch_size=self.args.per_device_train_batch_size,
                shuffle=VARIANT != "stream",
                num_workers=workers,
                worker_init_fn=worker_init if workers else None,
                collate_fn=collate,
            )
            return self.accelerator.prepare(loader)

    class EMA(TrainerCallback):
        """Exponential moving average of the weights, its decay warmed up by the update count (as timm's)."""

        def __init__(self, decay: float = 0.9) -> None:
            self.decay, self.shadow, self.updates, self.late = decay, None, 0, None

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            path = os.path.join(folder, EMA_FILE)
            if state.global_step and os.path.isfile(path) and VARIANT != "ema_not_restored":
                saved = torch.load(path, weights_only=True)
                self.shadow = saved["shadow"]
                self.updates = 0 if VARIANT == "counter_not_restored" else saved["updates"]
            else:
                self.shadow = {n: p.detach().clone() for n, p in model.named_parameters()}

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self.updates += 1
            d = min(self.decay, (1 + self.updates) / (10 + self.updates))
            with torch.no_grad():
                for n, p in model.named_parameters():
                    self.shadow[n].mul_(d).add_(p.detach(), alpha=1 - d)

        def _write(self, folder: str) -> None:
            torch.save({"shadow": self.shadow, "updates": self.updates}, os.path.join(folder, EMA_FILE))

        def on_save(self, args, state, control, **kwargs):
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            if not state.is_world_process_zero:
                return
            if VARIANT == "ema_late":
                self.late = (
                    folder,
                    {"shadow": {k: v.clone() for k, v in self.shadow.items()}, "updates": self.updates},
                )
            else:
                self._write(folder)

        def on_step_begin(self, args, state, control, **kwargs):
            if self.late is not None:  # one step late: into the checkpoint baton committed before
                folder, snapshot = self.late
                self.late = None
                torch.save(snapshot, os.path.join(folder, EMA_FILE))

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation="eager", attention_dropout=cfg.model.dropout
    )
    targs = TrainingArguments(
        output_dir=os.environ["HF_VARIANT_OUTPUT_DIR"],
        max_steps=cfg.total_steps,
        seed=cfg.seed,
        full_determinism=cfg.deterministic,
        per_device_train_batch_size=cfg.data.batch_size,
        gradient_accumulation_steps=cfg.data.grad_accum,
        learning_rate=cfg.optim.lr,
        warmup_steps=3,
        lr_scheduler_type="cosine",
        max_grad_norm=0.5,
        label_smoothing_factor=0.1,
        save_strategy="steps",
        save_steps=cfg.checkpoint.every_steps,
        save_total_limit=3,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
    )
    ema = EMA()
    callbacks = [baton, ema] if VARIANT == "ema_after" else [ema, baton]
    if os.environ.get("HF_NOISE"):
        scale, seed = os.environ["HF_NOISE"].split(",")

        class GradNoise(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
                gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + state.global_step)
                with torch.no_grad():
                    for p in model.parameters():
                        if p.grad is not None:
                            p.grad.mul_(1 + float(scale) * torch.randn(p.grad.shape, generator=gen))

        callbacks.append(GradNoise())
    trainer = OwnLoaderTrainer(model=model, args=targs, train_dataset=Augmented(), callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)
    return baton.run(trainer)


if __name__ == "__main__":
    sys.exit(main())
