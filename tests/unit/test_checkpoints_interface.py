"""The one interface of checkpointing (trainer/checkpoint/interface.py): the rules the loop and the HF
callback share, checked once on a minimal implementation, and both real implementations are it."""

from __future__ import annotations

import pytest

from trainer.checkpoint import Checkpointer, Checkpoints, CorruptCheckpoint, HFCheckpointer
from trainer.checkpoint.interface import newest_intact
from trainer.faults import SavesFailing


class Fake(Checkpoints):
    def __init__(self, max_failed_saves: int = 2) -> None:
        super().__init__(max_failed_saves)
        self.retained: list[int] = []

    def committed_steps(self) -> list[int]:
        return [9, 6, 3]

    def url(self, step: int) -> str:
        return f"mem://{step}"

    def retain(self, newest: int) -> list[int]:
        self.retained.append(newest)
        return []

    def resume(self):  # pragma: no cover - not the rule under test
        return None


def test_both_trainers_implementations_are_the_interface():
    assert issubclass(Checkpointer, Checkpoints) and issubclass(HFCheckpointer, Checkpoints)


def test_newest_intact_falls_back_past_corrupt_ones_only():
    refused: list[tuple[int, str]] = []

    def load(step: int) -> str:
        if step > 3:
            raise CorruptCheckpoint(f"step {step} is torn")
        return f"loaded {step}"

    assert newest_intact([9, 6, 3], load, lambda s, why: refused.append((s, why))) == (3, "loaded 3")
    assert refused == [(9, "step 9 is torn"), (6, "step 6 is torn")]
    assert newest_intact([9, 6], load, lambda s, why: None) is None

    def failing(step: int) -> str:  # the control: another error is no reason to fall back
        raise OSError("the store is down")

    with pytest.raises(OSError):
        newest_intact([9, 6, 3], failing, lambda s, why: refused.append((s, why)))


def test_retention_follows_every_commit_but_a_preemptions():
    c = Fake()
    for step, reason in ((3, "periodic"), (6, "preempt"), (9, "final"), (12, "warning")):
        c.committed(step, c.url(step))
        c.after_commit(step, reason)
    assert c.retained == [3, 9, 12]
    assert (c.last_committed, c.last_url) == (12, "mem://12")


def test_failing_periodic_saves_go_on_then_end_and_a_commit_resets_the_count():
    c, records = Fake(max_failed_saves=2), []

    def emit(event: str, step: int, **fields) -> None:
        records.append((event, step, fields))

    c.committed(3, c.url(3))
    c.periodic_save_failed(4, "disk full", emit)  # 1 of 2: training goes on
    c.committed(5, c.url(5))  # a commit in between: the count starts again
    c.periodic_save_failed(6, "disk full", emit)
    with pytest.raises(SavesFailing, match="2 periodic checkpoints failed in a row"):
        c.periodic_save_failed(7, "disk full", emit)
    assert [(e, s, f["in_a_row"], f["checkpoint"]) for e, s, f in records] == [
        ("checkpoint_failed", 4, 1, "mem://3"),
        ("checkpoint_failed", 6, 1, "mem://5"),
        ("checkpoint_failed", 7, 2, "mem://5"),
    ]
