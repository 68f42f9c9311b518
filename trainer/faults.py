"""Faults that a retry can mend, and the bounds on waiting for them (config section `faults`).

The exit-code rule (README, "Exit codes"): 75 means the job can be retried and loses nothing that is
committed; 1 means a retry cannot help (a bad config, a missing bucket or credentials, a refused or
foreign checkpoint, a fenced-out writer, a bug). This module holds what turns a fault into one or the
other:

- a periodic save that fails after the store's own retries does not end the run: the last committed
  checkpoint stands, training goes on, the next interval tries again, and a `checkpoint_failed` record
  says so. Only `faults.max_failed_saves` failures in a row end the run, with a `retry_later` record
  and 75 (the store may come back; a retry resumes from the last commit);
- every collective waits at most `faults.collective_timeout_s` for a peer (a dead or hung rank), so a pod
  never waits on gloo's 30-minute default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

from trainer.validation import require as _require

MIN_COLLECTIVE_TIMEOUT_S = 5.0


@dataclass
class FaultsConfig:
    max_failed_saves: int = 3
    """Periodic saves failing in a row (each after the store's own retries) that end the run with 75;
    training goes on after each one before that. 1: the first failure ends the run."""
    collective_timeout_s: float = 0.0
    """How long any collective waits for a peer (the process group's timeout: every all-reduce,
    barrier, broadcast and DCP's own collectives). 0: half of the grace (BATON_GRACE), at least 5 s, so
    that a dead or hung rank ends the pod well inside its grace. It must exceed the longest time one rank
    can spend alone between two collectives, such as writing its share of a checkpoint."""

    def __post_init__(self) -> None:
        _require(isinstance(self.max_failed_saves, int) and not isinstance(self.max_failed_saves, bool)
                 and self.max_failed_saves >= 1, "faults.max_failed_saves",
                 f"must be an integer >= 1, got {self.max_failed_saves!r}")
        _require(self.collective_timeout_s == 0 or self.collective_timeout_s >= 1, "faults.collective_timeout_s",
                 f"must be 0 (half the grace) or >= 1 second, got {self.collective_timeout_s!r}")

    def collective_timeout(self, grace_s: float | None = None) -> timedelta:
        """The bound every collective gets: the configured one, or half the grace (at least 5 s)."""
        if self.collective_timeout_s:
            return timedelta(seconds=self.collective_timeout_s)
        if grace_s is None:
            try:
                grace_s = float(os.environ.get("BATON_GRACE", "30"))
            except ValueError:
                grace_s = 30.0
        return timedelta(seconds=max(MIN_COLLECTIVE_TIMEOUT_S, grace_s / 2))


class SavesFailing(RuntimeError):
    """`faults.max_failed_saves` periodic saves failed in a row: end the run with 75."""


class SaveFailures:
    """Counts the periodic saves that failed in a row; a committed save resets it."""

    def __init__(self, limit: int) -> None:
        self.limit, self.in_a_row = limit, 0

    def committed(self) -> None:
        self.in_a_row = 0

    def failed(self) -> bool:
        """Count one failure; True when the run must end (`limit` in a row)."""
        self.in_a_row += 1
        return self.in_a_row >= self.limit


_collective_timeout: timedelta | None = None


def set_collective_timeout(timeout: timedelta) -> None:
    """Called where the process group is made: groups created later (the async save's) use it too."""
    global _collective_timeout
    _collective_timeout = timeout


def collective_timeout() -> timedelta | None:
    """The bound set for this process's collectives (None: torch's default)."""
    return _collective_timeout
