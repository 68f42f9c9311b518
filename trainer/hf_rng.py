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
  second from the checkpoint's RNG (HF's own `_load_rng_state`, called by baton before the collator),
  after the sampler has drawn its shuffle from the process's start state, as in the uninterrupted run;
  the Trainer's own restore that follows is skipped. At an epoch boundary nothing is pending and the
  Trainer's restore, which comes before any fetch there, is left as it is.
Limits: with DataLoader workers the collator runs in the workers, whose RNG restarts at every epoch
start and is not saved: a random collator or dataset is then not exact across a mid-epoch resume
(README; the drill reports a batch that differs right after a resume). A checkpoint without the snapshot
(written before this) resumes as HF does.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

PREFETCH_FILE = "baton_prefetch_rng_{rank}.pth"


def capture() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "cpu": torch.get_rng_state()}
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

    with safe_globals():
        return torch.load(path, weights_only=True)


class PrefetchRng:
    """Installed on a Trainer by `BatonCallback.run` (see the module docstring)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.before_newest: dict[str, Any] | None = None  # the RNG before the newest collator call
        self.phase = "off"  # off | waiting (a resume, nothing fetched) | pending_done | restored | done
        self.snapshot: dict[str, Any] | None = None
        self.checkpoint: str | None = None
        self._load_rng_state: Callable[[str | None], None] | None = None

    def install(self, trainer: Any, checkpoint: str | None) -> None:
        inner = trainer.data_collator
        if inner is None:  # the Trainer picks its default collator itself; wrap that one
            from transformers.data.data_collator import default_data_collator

            inner = default_data_collator
        trainer.data_collator = self._collate(inner)
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
        if self.phase == "waiting":  # an epoch boundary: the Trainer restores before any fetch, as it should
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
            return inner(items)
        return collate

    def save(self, folder: str) -> None:
        """Beside HF's RNG file, before the commit lists the folder's files."""
        if self.before_newest is not None and os.path.isdir(folder):
            torch.save(self.before_newest, os.path.join(folder, PREFETCH_FILE.format(rank=self.rank)))
