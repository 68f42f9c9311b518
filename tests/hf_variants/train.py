"""An HF Trainer script written the way a user writes one, with baton's callback, and the ways people
get resume wrong: the certifier's negative controls (tests/workflow/test_certifier.py).

    python tests/hf_variants/train.py --config examples/hf_trainer/config.yaml [--set key=value ...]

`HF_VARIANT` picks the script:
    correct              BatonCallback, baton.run(trainer), a deterministic collator
    random_collator      correct, and the collator masks labels with draws from the global torch RNG
                         (exact once baton.run takes over HF's RNG restore: docs/own-trainer.md,
                         "HF's RNG on a mid-epoch resume")
    private_rng          the collator draws from a generator of its own, seeded at start, never saved
    unseeded_shuffle     the dataset is reshuffled at every start with an unseeded RNG
    reseed_after_resume  the script re-seeds the RNG at the first step of every process start
    train_not_run        the callback is attached, but trainer.train() is called instead of baton.run
    no_callback          a stock script: no callback, trainer.train() from the newest checkpoint-N
    group_by_length      correct, with train_sampling_strategy="group_by_length" (HF's LengthGroupedSampler
                         draws each epoch's shuffle from the global RNG)
    private_sampler      a sampler of its own shuffles with a torch.Generator seeded once (no set_epoch):
                         baton refuses it at the start, by name
    consume_at_start     random_collator, and a callback draws from the global RNG at each process's first
                         step (an RNG bug that shows first in the batches the collator draws for)
    callback_counter     a callback's in-memory counter (a curriculum: the first 3 updates of each process
                         take half the gradient), state outside the checkpoint
    unseeded_init        the model is built from its config before any seeding (another initial model at
                         every start), with callback_counter's resume bug beside it
`HF_SAMPLES=<n>`: train on the first n packed samples only, so that an epoch is short and a resume lands
in a later epoch.
`HF_NOISE=<scale>,<seed>`: a callback of the test's own perturbs every gradient by a seeded relative
amount before the optimizer step, so that two runs differ as nondeterministic kernels make them (Tier 2
needs a floor above 0). Noise is not a product feature.
"""

from __future__ import annotations

import os
import random
import sys

VARIANT = os.environ.get("HF_VARIANT", "correct")
VARIANTS = (
    "correct",
    "random_collator",
    "private_rng",
    "unseeded_shuffle",
    "reseed_after_resume",
    "train_not_run",
    "no_callback",
    "group_by_length",
    "private_sampler",
    "consume_at_start",
    "callback_counter",
    "unseeded_init",
)


def main() -> int:
    if VARIANT not in VARIANTS:
        print(f"error: HF_VARIANT must be one of {', '.join(VARIANTS)}, got {VARIANT!r}", file=sys.stderr)
        return 1
    from baton.hf import BatonCallback, baton_args

    cfg = baton_args()
    baton = None
    if VARIANT != "no_callback":  # the callback first: it installs the SIGTERM handler before the slow set-up
        baton = BatonCallback(
            checkpoint_uri=cfg.checkpoint.uri,
            run_id=cfg.run_id,
            keep_last=cfg.checkpoint.keep_last,
            faults=cfg.faults,
        )

    import torch
    from torch.utils.data import Dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        PrinterCallback,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )
    from transformers.trainer_utils import get_last_checkpoint

    from trainer.data import pack, read_documents
    from trainer.model import ensure_model

    model_dir = ensure_model(cfg).path  # a folder, or a bucket's weights copied once to this machine
    samples = pack(read_documents(cfg.data.uri), AutoTokenizer.from_pretrained(model_dir), cfg.data.seq_len)
    order = list(range(samples.shape[0]))[: int(os.environ.get("HF_SAMPLES", "0")) or None]
    if VARIANT == "unseeded_shuffle":
        random.Random().shuffle(order)  # system entropy: another order at every start

    class Packed(Dataset):
        def __len__(self) -> int:
            return len(order)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            ids = samples[order[i]]
            return {"input_ids": ids, "labels": ids.clone()}

    private = torch.Generator().manual_seed(cfg.seed)

    def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        batch = {k: torch.stack([it[k] for it in items]) for k in items[0]}
        if VARIANT in (
            "random_collator",
            "private_rng",
            "consume_at_start",
        ):  # augmentation: a random 15% of labels ignored
            draws = torch.rand(batch["labels"].shape, generator=private if VARIANT == "private_rng" else None)
            batch["labels"] = batch["labels"].masked_fill(draws < 0.15, -100)
        return batch

    class ReseedAtFirstStep(TrainerCallback):
        def __init__(self) -> None:
            self.done = False

        def on_step_begin(self, args, state, control, **kwargs):
            if not self.done:
                self.done = True
                torch.manual_seed(cfg.seed + 1)
                random.seed(cfg.seed + 1)

    class ConsumeAtFirstStep(TrainerCallback):
        def __init__(self) -> None:
            self.done = False

        def on_step_begin(self, args, state, control, **kwargs):
            if not self.done:  # e.g. a warm-up draw of a random augmentation's parameters
                self.done = True
                torch.rand(1)

    class Curriculum(TrainerCallback):
        def __init__(self) -> None:
            self.updates = 0  # in memory only: every process start begins the curriculum again

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            if self.updates < 3:
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad.mul_(0.5)
            self.updates += 1

    class GradNoise(TrainerCallback):
        def __init__(self, scale: float, seed: int) -> None:
            self.scale, self.seed = scale, seed

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + state.global_step)
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad.mul_(1 + self.scale * torch.randn(p.grad.shape, generator=gen))

    output_dir = (
        cfg.checkpoint.uri.removeprefix("file://")
        if VARIANT == "no_callback"
        else os.environ["HF_VARIANT_OUTPUT_DIR"]
    )
    if VARIANT == "unseeded_init":  # from_config draws the weights from whatever state the RNG is in
        from transformers import AutoConfig

        torch.manual_seed(int.from_bytes(os.urandom(8), "little") % 2**63)  # as if nothing had seeded it
        model = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(
                model_dir, attn_implementation="eager", attention_dropout=cfg.model.dropout
            )
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, attn_implementation="eager", attention_dropout=cfg.model.dropout
        )
    targs = TrainingArguments(
        output_dir=output_dir,
        max_steps=cfg.total_steps,
        seed=cfg.seed,
        full_determinism=cfg.deterministic,
        per_device_train_batch_size=cfg.data.batch_size,
        gradient_accumulation_steps=cfg.data.grad_accum,
        learning_rate=cfg.optim.lr,
        warmup_steps=cfg.optim.warmup_steps,
        lr_scheduler_type="cosine",
        save_strategy="steps",
        save_steps=cfg.checkpoint.every_steps,
        save_total_limit=3,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        dataloader_num_workers=0,
        **({"train_sampling_strategy": "group_by_length"} if VARIANT == "group_by_length" else {}),
    )
    callbacks: list = [baton] if baton else []
    if VARIANT == "reseed_after_resume":
        callbacks.append(ReseedAtFirstStep())
    if VARIANT == "consume_at_start":
        callbacks.append(ConsumeAtFirstStep())
    if VARIANT in ("callback_counter", "unseeded_init"):
        callbacks.append(Curriculum())
    if os.environ.get("HF_NOISE"):
        scale, seed = os.environ["HF_NOISE"].split(",")
        callbacks.append(GradNoise(float(scale), int(seed)))

    class ShuffledSampler(torch.utils.data.Sampler):
        """A sampler of one's own, shuffling with a generator seeded once (accelerate re-seeds a torch
        RandomSampler per epoch, whatever its generator: this one it leaves alone)."""

        def __init__(self, n: int) -> None:
            self.n, self.rng = n, torch.Generator().manual_seed(cfg.seed)

        def __iter__(self):
            return iter(torch.randperm(self.n, generator=self.rng).tolist())

        def __len__(self) -> int:
            return self.n

    class PrivateSamplerTrainer(Trainer):
        def _get_train_sampler(self, train_dataset=None):
            return ShuffledSampler(len(train_dataset or self.train_dataset))

    trainer_class = PrivateSamplerTrainer if VARIANT == "private_sampler" else Trainer
    trainer = trainer_class(
        model=model, args=targs, train_dataset=Packed(), data_collator=collate, callbacks=callbacks
    )
    trainer.remove_callback(PrinterCallback)
    if baton is None:
        last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
        trainer.train(resume_from_checkpoint=last)
        return 0
    if VARIANT == "train_not_run":
        trainer.train()
        return 0
    return baton.run(trainer)


if __name__ == "__main__":
    sys.exit(main())
