"""The named points where a training loop lets a test act on it from outside, and nothing else.

The loop (trainer/loop.py) and the HF callback (trainer/hf.py) call `hooks()` at these points; the
hooks installed by default do nothing, so the loop reads no environment and runs no test code. A test
installs its own from outside the trainer, the way tests/faultfs plants storage faults: its
`sitecustomize.py` (on the test's PYTHONPATH) calls `install(...)` with hooks that pause at a step, hang
a rank, make a rank stop alone, or perturb the gradients (tests/faultfs/seams.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Point:
    """Where the loop is: after step `step`'s record (`micro` 0), or `micro` micro-batches into the next."""

    step: int
    micro: int
    rank: int
    world: int
    preempt: Any
    """trainer.preemption.Preemption: `local` is this rank's flag; `invalidate()` makes the next stop check ask again."""
    warning_pending: Any = None
    """A callable: whether a preemption warning is waiting (baton's loop), or None."""
    device: Any = None
    """Where the ranks' collective flags live (the stop flag's device)."""


class Hooks:
    """What the loop calls; every method does nothing here."""

    def at_point(self, point: Point) -> bool:
        """A step boundary or a micro-batch boundary. Returns True if it held the loop there (the caller then
        decides the stop again: a signal may have come meanwhile)."""
        return False

    def after_update(self, rank: int, step: int) -> None:
        """The optimizer has stepped and `step` is the new step count."""

    def stops_alone(self, rank: int, step: int) -> bool:
        """Whether this rank decides by itself to stop after `step`, whatever its peers say (never, for real)."""
        return False

    def after_backward(self, model: Any, step: int, micro: int, rank: int) -> None:
        """The gradients of micro-batch `micro` of step `step + 1` exist."""


_installed: Hooks = Hooks()


def hooks() -> Hooks:
    return _installed


def install(h: Hooks) -> None:
    """Called from outside the trainer (a test's sitecustomize), before the loop starts."""
    global _installed
    _installed = h
