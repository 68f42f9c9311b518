"""The one interface a trainer uses for its checkpoints, whatever their format: `Checkpoints`.

Two implementations: `Checkpointer` (checkpointer.py: baton's own DCP checkpoints, the training loop's)
and `HFCheckpointer` (hf_checkpointer.py: the Hugging Face Trainer's `checkpoint-N/` folders, the HF
callback's). The rules both trainers follow are written here once:

- committed steps come newest first (`committed_steps`);
- a resume takes the newest checkpoint that loads and falls back past every refused one
  (`newest_intact`: a CorruptCheckpoint is announced and passed over; a CheckpointRefused, a checkpoint
  of another run, and a store that keeps failing are raised);
- the last committed step and its url (`last_committed`, `last_url`), set by a resume and by every commit;
- retention follows a commit, except a preemption save's: every second of the grace is the save's, and
  the checkpoint before it must still exist should the store have altered the new one (`after_commit`);
- a periodic save that fails lets training go on, with a `checkpoint_failed` record, until
  `faults.max_failed_saves` have failed in a row: then SavesFailing, which the trainer turns into a
  `retry_later` record and exit 75 (`periodic_save_failed`). A failed final or preemption save ends the
  run at once (the trainer's StoreFailing, also 75).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, TypeVar

from trainer.checkpoint.layout import CorruptCheckpoint
from trainer.faults import SaveFailures, SavesFailing
from trainer.records import log

T = TypeVar("T")
Emit = Callable[..., None]
"""A trainer's record writer: `emit(event, step, **fields)` (it decides which ranks write)."""


def newest_intact(
    steps: list[int], load: Callable[[int], T], on_refused: Callable[[int, str], None]
) -> tuple[int, T] | None:
    """(step, what `load(step)` returned) for the first of `steps` (newest first) that loads; each one
    whose `load` raises CorruptCheckpoint is passed to `on_refused` and passed over. None when none loads.
    Any other exception (a foreign checkpoint, a failing store) is raised: it is no reason to fall back."""
    for step in steps:
        try:
            return step, load(step)
        except CorruptCheckpoint as e:
            on_refused(step, str(e))
    return None


class Checkpoints(ABC):
    """One run's committed checkpoints, as a trainer uses them (see the module docstring)."""

    def __init__(self, max_failed_saves: int) -> None:
        self.last_committed: int | None = None
        self.last_url: str | None = None
        self.save_failures = SaveFailures(max_failed_saves)

    @abstractmethod
    def committed_steps(self) -> list[int]:
        """The committed steps, newest first (the same answer on every rank)."""

    @abstractmethod
    def url(self, step: int) -> str:
        """Where the checkpoint of `step` lives."""

    @abstractmethod
    def retain(self, newest: int) -> list[int]:
        """Delete what the format's retention drops, now that `newest` is committed; the deleted steps.
        Called on every rank; the implementation deletes on one."""

    def refused(self, step: int, why: str, emit: Emit) -> None:
        """A checkpoint a resume passed over: one log line and a `checkpoint_refused` record."""
        log(f"checkpoint step {step} refused: {why}; falling back")
        emit("checkpoint_refused", step, path=self.url(step), reason=why)

    def resumed(self, step: int) -> None:
        """A resume restored `step`: it is the last committed one."""
        self.last_committed, self.last_url = step, self.url(step)

    def committed(self, step: int, url: str) -> None:
        """`step` is committed at `url` (every rank): the last committed step; the failures in a row end."""
        self.last_committed, self.last_url = step, url
        self.save_failures.committed()

    def after_commit(self, step: int, reason: str) -> None:
        """Retention, after the commit of `step` by a save of `reason`; none after a preemption save."""
        if reason == "preempt":
            return
        deleted = self.retain(step)
        if deleted:
            log(f"retention deleted steps {deleted}")

    def periodic_save_failed(self, step: int, error: str, emit: Emit) -> None:
        """A periodic save of `step` failed (after the store's own retries; the same on every rank): log
        it and write `checkpoint_failed`; training goes on unless `faults.max_failed_saves` have now
        failed in a row, when SavesFailing is raised (the last commit stands: a retry resumes from it)."""
        n, limit = self.save_failures.in_a_row + 1, self.save_failures.limit
        ends = self.save_failures.failed()
        log(
            f"periodic checkpoint of step {step} failed ({n} in a row, limit {limit}): {error}; "
            + (
                "ending the run (75)"
                if ends
                else f"training on; the last committed step is {self.last_committed}"
            )
        )
        emit(
            "checkpoint_failed",
            step,
            reason="periodic",
            error=error[:500],
            in_a_row=n,
            limit=limit,
            checkpoint=self.last_url,
        )
        if ends:
            raise SavesFailing(
                f"{n} periodic checkpoints failed in a row (faults.max_failed_saves "
                f"{limit}); the last committed step is {self.last_committed}"
            )

    @abstractmethod
    def resume(self, *args: Any, **kwargs: Any) -> Any:
        """Restore the newest intact checkpoint (through `newest_intact`), or None for a fresh start;
        `last_committed` is then its step. Collective."""
