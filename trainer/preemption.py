"""Preemption: SIGTERM sets a flag; the stop decision is collective.

The handler only records the signal. The loop asks `should_stop()` before every micro-batch, and
that answer is all-reduced (MAX) over the ranks, so one rank seeing SIGTERM stops every rank at the
same point instead of leaving its peers waiting in a collective that it never enters.

Before the first micro-batch of a step the answer usually comes from the step boundary's one fused
collective (`decided`, carried with the loss and the warning and cadence flags): it stands only while
nothing slow (a save, a commit, a test pause) has happened since; `invalidate` makes the next
`should_stop` ask again.
"""

from __future__ import annotations

import signal
import time

import torch
import torch.distributed as dist

from trainer import env
from trainer.grace import grace_seconds


def sigterm_handler_disabled() -> bool:
    """`BATON_DISABLE_SIGTERM_HANDLER`: the drill's negative control, a flag (trainer/env.py: any other
    spelling is refused, since a control that went unread would quietly run as a normal trial, and pass)."""
    return env.flag("BATON_DISABLE_SIGTERM_HANDLER")


class Preemption:
    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.received_at: float | None = None
        self.grace = grace_seconds()
        self.device = torch.device("cpu")
        self._installed = False
        self._decided: bool | None = None
        # What this process was doing (set by the trainer: start, restore, step, save), and what it was
        # doing when the signal came: the `preempt` record's `during`.
        self.phase = "start"
        self.during: str | None = None

    def install(self) -> None:
        if sigterm_handler_disabled():
            return  # the drill's negative control: a trainer that dies on SIGTERM
        signal.signal(signal.SIGTERM, self._on_signal)
        self._installed = True

    def _on_signal(self, signum: int, _frame) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
            self.received_at = time.monotonic()
            self.during = self.phase

    @property
    def local(self) -> bool:
        return self.signal_name is not None

    def decided(self, any_signalled: bool) -> None:
        """The ranks' OR of `local`, taken by a collective the caller made (the step boundary's)."""
        self._decided = any_signalled
        if any_signalled and self.signal_name is None:
            self.signal_name = "peer"
            self.received_at = time.monotonic()

    def invalidate(self) -> None:
        """Something slow happened since `decided`: the next should_stop() asks the ranks again.
        Called by every rank at the same point."""
        self._decided = None

    def should_stop(self) -> bool:
        """True on every rank if any rank has been signalled. A collective when world > 1, unless a
        `decided` answer stands (used once)."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return self.local
        if self._decided is not None:
            answer, self._decided = self._decided, None
            return answer
        flag = torch.tensor([1 if self.local else 0], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and self.signal_name is None:
            self.signal_name = "peer"
            self.received_at = time.monotonic()
        return bool(flag.item())

    def grace_left(self) -> float:
        if self.received_at is None:
            return self.grace
        return self.grace - (time.monotonic() - self.received_at)
