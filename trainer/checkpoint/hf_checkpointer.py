"""The HF callback's checkpoints: `HFCheckpointer`, the Hugging Face Trainer's implementation of
`Checkpoints` (interface.py: newest first, resume with fallback, the last committed step, retention
after a commit but a preemption's, the rule for failing periodic saves).

It holds an `HFStore` (hf_store.py: the `checkpoint-N/` folders under a root, committed with `_COMMIT`
last) and is all trainer/hf.py uses of it: the callback never calls the store itself. The Trainer
writes a checkpoint into its `output_dir`; `commit` mirrors it to the root (unless the root is that
folder) and writes `_COMMIT`; a resume fetches the newest one that verifies back into `output_dir`.
"""

from __future__ import annotations

import os
from typing import Any

from trainer import collectives
from trainer.checkpoint.hf_store import HFStore
from trainer.checkpoint.interface import Checkpoints, Emit, newest_intact
from trainer.checkpoint.layout import hf_step_name
from trainer.faults import StoreUnreachable, retry_reads
from trainer.records import log
from trainer.storage import StorageError


class HFCheckpointer(Checkpoints):
    """Committed `checkpoint-N/` folders under `uri`, written by a Trainer into `local_dir`
    (`args.output_dir`). `keep_last`: committed checkpoints kept under a root other than `local_dir`
    (in place, HF's own `save_total_limit` rotates)."""

    def __init__(self, uri: str, local_dir: str, keep_last: int = 3, max_failed_saves: int = 3) -> None:
        super().__init__(max_failed_saves)
        self.store = HFStore(uri, local_dir)
        self.keep_last = keep_last

    @property
    def in_place(self) -> bool:
        """Whether the root is `local_dir` itself (committed in place, nothing copied)."""
        return self.store.in_place

    @property
    def local_dir(self) -> str:
        return self.store.local_dir

    def folder(self, step: int) -> str:
        """The local folder of `step`, where the Trainer writes it and a resume fetches it."""
        return os.path.join(self.store.local_dir, hf_step_name(step))

    def claim_attempt(self) -> int:
        """The next attempt number (on the rank that asks: the caller shares it)."""
        return self.store.claim_attempt()

    def committed_steps(self) -> list[int]:
        return self.store.committed_steps()

    def url(self, step: int) -> str:
        return self.store.url(step)

    def manifest(self, step: int) -> dict[str, Any]:
        """The `_COMMIT` of `step`, checked against its schema."""
        return self.store.manifest(step)

    # -- save --
    def local_names(self, step: int) -> list[str]:
        return self.store.local_names(step)

    def upload(self, step: int, names: list[str]) -> dict[str, dict[str, Any]]:
        """Another node's files of `step`, hashed and copied to the root before rank 0 commits."""
        return self.store.upload(step, names)

    def commit(
        self,
        step: int,
        world_size: int,
        device: str = "cpu",
        other_nodes: dict[str, dict[str, Any]] | None = None,
    ) -> tuple[str, int]:
        """Rank 0: mirror `step`'s folder and write `_COMMIT` last. Returns (url, bytes). The caller then
        tells every rank (`committed`) and retention follows (`after_commit`)."""
        return self.store.commit(step, world_size, device=device, other_nodes=other_nodes)

    def retain(self, newest: int) -> list[int]:
        """Rank 0 keeps the newest `keep_last`; a failing store only delays it (the commit stands)."""
        if collectives.rank() != 0:
            return []
        try:
            return self.store.retain(self.keep_last)
        except StorageError as e:  # the commit stands; an old checkpoint stays a while longer
            log(f"warning: retention after checkpoint-{newest} failed: {e}")
            return []

    # -- resume --
    def fetch(self, step: int, read_retry_s: float) -> str:
        """`step` fetched into its local folder and checked against its manifest (CorruptCheckpoint when
        it does not match); a failing read is retried for `read_retry_s`, then StoreUnreachable: a read
        error is never taken for corruption, which would pass over a good checkpoint and replay its steps."""
        return retry_reads(lambda: self.store.fetch(step), read_retry_s, StorageError, log)

    def resume(self, emit: Emit, read_retry_s: float) -> int | None:
        """The step of the newest committed checkpoint that verifies, fetched into its local folder on
        rank 0 (`folder`), or None for a fresh start. Rank 0 chooses; every rank gets its answer, or the
        StoreUnreachable that ended the choice. Collective."""
        chosen: list[Any] = [None, None]  # the step, why the store could not be read
        if collectives.rank() == 0:
            try:
                found = newest_intact(
                    self.committed_steps(),
                    lambda step: self.fetch(step, read_retry_s),
                    lambda step, why: self.refused(step, why, emit),
                )
                chosen = [found[0] if found else None, None]
            except StoreUnreachable as e:
                chosen = [None, str(e)]
        step, unreachable = collectives.broadcast(chosen)
        if unreachable:
            raise StoreUnreachable(unreachable)
        if step is not None:
            self.resumed(step)
        return step
