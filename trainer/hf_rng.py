"""HF's RNG on a mid-epoch resume, made exact for a collator that draws random numbers (augmentation,
masking) from the global RNG: `baton.run` takes over the Trainer's RNG restore.

What transformers 5.24 does (read from its source, `Trainer._inner_training_loop` and accelerate's
`DataLoaderShard.__iter__`), and why it is not exact:
- the data loader iterates one batch ahead: the collator builds the next batch before the current one
  is yielded, so when step N is saved, the first batch of step N+1 has already been collated, from the
  RNG as it was before step N trained;
- on a resume mid-epoch the Trainer fetches step N+1's batches first and restores the RNG after
  (`get_batch_samples` before `_load_rng_state`, so that the sampler's shuffle is drawn from the same
  state as at the epoch's start: huggingface/transformers issue #39215; PR #46628 was closed). Every
  collator draw of that first fetch comes from the wrong state, and the RNG restored after it is then
  used for dropout that, in the uninterrupted run, came after those draws.

What this module does instead (one data loader process, `dataloader_num_workers=0`):
- it snapshots the global RNG (python, numpy, torch CPU, every CUDA device) before every collator call,
  and each save writes the snapshot taken before the newest call (the batch that is collated but not yet
  trained on) beside HF's own RNG file: `baton_prefetch_rng_<rank>.pth`;
- on a mid-epoch resume the first collator call (that pending batch) runs from that snapshot, and the
  second from the checkpoint's RNG (HF's own `_load_rng_state`, called by baton before the collator);
  the Trainer's own restore that follows is skipped. At an epoch boundary nothing is pending and the
  Trainer's restore, which comes before any fetch there, is left as it is.
- the sampler draws its shuffle from the global RNG when each epoch's iterator is made (`RandomSampler`
  without a generator, HF's `LengthGroupedSampler` for `group_by_length`), after `on_epoch_begin`.
  EpochRng snapshots the global RNG at each `on_epoch_begin` and each save writes it
  (`baton_epoch_rng_<rank>.pth`, with its epoch); a mid-epoch resume gives it back at the resumed
  epoch's `on_epoch_begin`, so the sampler draws the uninterrupted run's shuffle (without it, the
  process's start state: right in epoch 0 only);
- each collator call's RNG is digested as well: the step record's `batch_rng_sha` (the RNG before the
  step's batches were drawn), which tells an RNG that was not restored from a data order that was not.
- a sampler with a generator of its own (torch's, numpy's or python's) and no `set_epoch` draws from a
  state no checkpoint holds: it is refused at the start (UnsupportedSampler), by name.
Limits: with DataLoader workers the collator runs in the workers, whose RNG restarts at every epoch
start and is not saved: a random collator or dataset is then not exact across a mid-epoch resume
(docs/own-trainer.md, "HF's RNG on a mid-epoch resume"; the drill reports a batch that differs right
after a resume). A checkpoint without the snapshot (written before this) resumes as HF does.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

PREFETCH_FILE = "baton_prefetch_rng_{rank}.pth"
EPOCH_FILE = "baton_epoch_rng_{rank}.pth"


def capture() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load(path: str) -> dict[str, Any] | None:
    """A snapshot file, loaded as HF loads its own RNG file (weights_only, numpy's arrays allowed)."""
    if not os.path.isfile(path):
        return None
    from transformers.trainer_pt_utils import safe_globals

    from trainer.checkpoint import file_problem

    why = file_problem(path)
    if why is not None:  # the fetch refused such a file already (hf_store._loads_safely): never inflated here
        raise ValueError(f"{os.path.basename(path)} cannot be loaded safely: {why}")

    with safe_globals():
        return torch.load(path, weights_only=True)


def digest() -> int:
    """The live global RNG, digested as the step record's rng_sha is (trainer/trajectory.py)."""
    from trainer.trajectory import rng_digest

    return rng_digest()


class PrefetchRng:
    """Installed on a Trainer by `BatonCallback.run` (see the module docstring)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.collated: list[int] = []  # the RNG digest before each collator call not yet handed to a step
        self.batch_rng: list[int] = []  # those of the batches of the step being fetched
        self.before_newest: dict[str, Any] | None = None  # the RNG before the newest collator call
        self.phase = "off"  # off | waiting (a resume, nothing fetched) | pending_done | restored | done
        self.snapshot: dict[str, Any] | None = None
        self.checkpoint: str | None = None
        self._load_rng_state: Callable[[str | None], None] | None = None
        self.measured = True  # batch_rng_sha is recorded: every collator call of the training loop is seen
        self.inner: Callable[[Any], Any] | None = None
        self.wrapped: Callable[[Any], Any] | None = None

    def install(self, trainer: Any, checkpoint: str | None) -> None:
        inner = trainer.data_collator
        if inner is None:  # the Trainer picks its default collator itself; wrap that one
            from transformers.data.data_collator import default_data_collator

            inner = default_data_collator
        self.inner = inner
        trainer.data_collator = self.wrapped = self._collate(inner)
        fetch = trainer.get_batch_samples

        def get_batch_samples(epoch_iterator: Any, num_batches: int, device: Any) -> Any:
            batches, items = fetch(epoch_iterator, num_batches, device)
            # The loader collates one batch ahead: the oldest digests are this step's batches'.
            self.batch_rng, self.collated = self.collated[: len(batches)], self.collated[len(batches) :]
            return batches, items

        trainer.get_batch_samples = get_batch_samples
        if checkpoint is None:
            return
        self.checkpoint, self.phase = checkpoint, "waiting"
        self.snapshot = load(os.path.join(checkpoint, PREFETCH_FILE.format(rank=self.rank)))
        self._load_rng_state = trainer._load_rng_state
        trainer._load_rng_state = self._hf_restore

    def _hf_restore(self, checkpoint: str | None) -> None:
        if self.phase == "restored":  # baton restored it already, before the first new batch
            self.phase = "done"
            return
        # "waiting": an epoch boundary, where the Trainer restores before any fetch, as it should.
        # "pending_done": the resumed step was its epoch's last and had one batch, the pending one, so nothing
        # was collated ahead and the Trainer's restore comes next, as it should. Either way baton is done:
        # left at "pending_done", the next epoch's first batch would restore the checkpoint's RNG again.
        self.phase = "done"
        assert self._load_rng_state is not None
        self._load_rng_state(checkpoint)

    def _collate(self, inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def collate(items: Any) -> Any:
            if self.phase == "waiting":  # the batch that was collated, but not trained on, before the save
                if self.snapshot is not None:
                    restore(self.snapshot)
                self.phase = "pending_done"
            elif self.phase == "pending_done":  # the first batch collated after the save: the saved RNG
                assert self._load_rng_state is not None
                self._load_rng_state(self.checkpoint)
                self.phase = "restored"
            self.before_newest = capture()
            self.collated.append(digest())
            return inner(items)

        return collate

    def follow(self, loader: Any) -> str | None:
        """The DataLoader the Trainer iterates, seen at on_train_begin (before its first iterator). A script's own
        loader (its own collate_fn, not the Trainer's data_collator) gets its collate_fn wrapped the same way. A
        loader with workers collates in them, out of this process's reach: the collator is unwrapped there and
        batch_rng_sha is not measured (None would be a constant, from which a wrong cause would be read). Returns
        a warning for the log, or None."""
        from trainer.data import set_loader_attribute

        fn = loader.collate_fn
        holder = (
            loader
            if fn is self.wrapped
            else fn
            if getattr(fn, "data_collator", None) is self.wrapped
            else None
        )
        workers = getattr(loader, "num_workers", 0)
        if workers:
            self.measured = False
            if holder is loader:
                set_loader_attribute(loader, "collate_fn", self.inner)
            elif holder is not None:
                holder.data_collator = self.inner
            return (
                f"the training DataLoader has {workers} worker processes: its collate_fn runs there, where baton "
                "cannot keep the RNG of the batch collated ahead; batch_rng_sha is not recorded, and a random "
                "collate_fn or dataset must draw from a generator seeded by the sample (docs/own-trainer.md)"
            )
        if holder is None:  # a collate_fn of the script's own loader
            set_loader_attribute(loader, "collate_fn", self._collate(fn))
        return None

    def take_batch_rng(self) -> int:
        """One digest of the RNG before each of the step's batches was collated (0: none was)."""
        from trainer.trajectory import combine

        return int(combine(self.batch_rng), 16) - 2**63 if self.batch_rng else 0

    def save(self, folder: str) -> None:
        """Beside HF's RNG file, before the commit lists the folder's files."""
        if self.before_newest is not None and os.path.isdir(folder):
            torch.save(self.before_newest, os.path.join(folder, PREFETCH_FILE.format(rank=self.rank)))


class EpochRng:
    """The global RNG at each epoch's start, which the epoch's sampler draws its shuffle from (see the
    module docstring). `begin` at every `on_epoch_begin`; `save` beside HF's RNG file."""

    def __init__(self, rank: int, checkpoint: str | None) -> None:
        self.rank = rank
        self.current: dict[str, Any] | None = None  # {"epoch": int, "state": capture()}
        saved = load(os.path.join(checkpoint, EPOCH_FILE.format(rank=rank))) if checkpoint else None
        # Loaded safely (weights_only) and checked against its manifest, but of a shape that is the writer's
        # word: one that is not this module's is left unused, as a checkpoint without the file is.
        ok = (
            isinstance(saved, dict)
            and isinstance(saved.get("epoch"), int)
            and isinstance(saved.get("state"), dict)
            and {"python", "numpy", "cpu"} <= set(saved["state"])
        )
        if saved is not None and not ok:
            from trainer.records import log

            log(
                f"warning: {EPOCH_FILE.format(rank=rank)} in {checkpoint} is not an epoch RNG snapshot: not used"
            )
        self.saved = saved if ok else None
        self.first = True
        self.resumed = checkpoint is not None
        self._recapture = (
            False  # a resume at an epoch boundary: the epoch's state is the one the Trainer restores
        )

    def install(self, trainer: Any) -> None:
        """On a resume: take the epoch's state again right after the Trainer restores the checkpoint's RNG. At
        an epoch boundary the Trainer calls `on_epoch_begin` first and restores after it, before the epoch's
        sampler draws (transformers 5.24, `_run_epoch`): without this the snapshot would hold the process's
        start state, and a later resume in the middle of that epoch would give the sampler the wrong one."""
        inner = trainer._load_rng_state

        def load_rng_state(checkpoint: str | None) -> None:
            inner(checkpoint)
            if self._recapture and self.current is not None:
                self._recapture = False
                self.current = {"epoch": self.current["epoch"], "state": capture()}

        trainer._load_rng_state = load_rng_state

    def begin(self, epoch_position: float) -> None:
        """`epoch_position`: the Trainer's state.epoch at on_epoch_begin (fractional on a mid-epoch resume)."""
        epoch = int(math.floor(epoch_position))
        mid_epoch = epoch_position != epoch
        if self.first and mid_epoch and self.saved is not None and self.saved["epoch"] == epoch:
            try:
                restore(self.saved["state"])  # the resumed epoch: its sampler draws what it drew before
            except (TypeError, ValueError, RuntimeError) as e:  # a state of the wrong types: as if absent
                from trainer.records import log

                log(f"warning: the epoch RNG snapshot cannot be restored ({str(e)[:200]}): not used")
        self._recapture = self.first and self.resumed and not mid_epoch
        self.first = False
        self.current = {"epoch": epoch, "state": capture()}

    def save(self, folder: str) -> None:
        if self.current is not None and os.path.isdir(folder):
            torch.save(self.current, os.path.join(folder, EPOCH_FILE.format(rank=self.rank)))


class UnsupportedSampler(ValueError):
    """A training sampler whose shuffle a checkpoint cannot hold: refused before the first step."""


def _own_generator(obj: Any) -> str | None:
    """The name of an attribute of `obj` that is a generator of its own (torch's, numpy's or python's)."""
    for name, value in vars(obj).items() if hasattr(obj, "__dict__") else ():
        if isinstance(value, (torch.Generator, np.random.Generator, np.random.RandomState, random.Random)):
            return name
    return None


def refuse_private_samplers(dataloader: Any) -> None:
    """Raise UnsupportedSampler for a sampler (or batch sampler) with a generator of its own (torch's,
    numpy's or python's) and no `set_epoch`: its state after N epochs is in no checkpoint, so a resume in a
    later epoch draws another data order. Samplers that draw from the global RNG (EpochRng keeps it) or
    that are re-seeded per epoch (`set_epoch`; accelerate turns every torch RandomSampler into its
    SeedableRandomSampler) are exact."""
    seen: set[int] = set()
    todo = [getattr(dataloader, "sampler", None), getattr(dataloader, "batch_sampler", None)]
    while todo:
        obj = todo.pop()
        if obj is None or id(obj) in seen or len(seen) > 16:
            continue
        seen.add(id(obj))
        attribute = _own_generator(obj)
        if attribute is not None and not hasattr(obj, "set_epoch"):
            name = type(obj).__name__
            raise UnsupportedSampler(
                f"the training sampler {name} draws its shuffle from a generator of its own ({name}.{attribute}), "
                f"whose state no checkpoint holds (a resume in a later epoch would draw another data order); give "
                f"{name} a set_epoch(epoch) that re-seeds it from the seed and the epoch, or let it draw from the "
                "global RNG, which baton restores"
            )
        todo += [getattr(obj, "sampler", None), getattr(obj, "batch_sampler", None)]
