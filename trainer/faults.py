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
  never waits on gloo's 30-minute default; a rank that finds its peer gone (a collective that timed out,
  a connection the peer closed) writes a `retry_later` record (reason `peer_lost`) and exits 75: every
  commit is collective and all-or-nothing, so nothing partial was committed, and a retry resumes from the
  last commit;
- a final or preemption save that fails (after the store's retries) in a run whose store worked at the
  start ends with 75 too (`store_failing`); a missing bucket, missing or refused credentials and a bad
  config fail at the start (listing, attempt claim), with 1.

Tests plant hung and disagreeing ranks from outside (trainer/hooks.py, tests/faultfs/seams.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from trainer.grace import grace_seconds
from trainer.validation import require as _require

PEER_LOST = "peer_lost"
"""The `retry_later` reason of a rank whose peer went away (a connection closed, a collective timed out): it
says the rank ended retry-safe, nothing of the peer, which may have died without saving."""

MIN_COLLECTIVE_TIMEOUT_S = 5.0
T = TypeVar("T")


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
    read_retry_s: float = 60.0
    """How long a resume retries a store that fails while a checkpoint is read (with backoff: 0.5 s,
    doubling, at most 10 s apart) before the run ends with 75 (`retry_later`, `store_unreachable`). A
    read error is never taken for corruption: the resume does not pass over a good checkpoint for it."""

    def __post_init__(self) -> None:
        _require(
            isinstance(self.max_failed_saves, int)
            and not isinstance(self.max_failed_saves, bool)
            and self.max_failed_saves >= 1,
            "faults.max_failed_saves",
            f"must be an integer >= 1, got {self.max_failed_saves!r}",
        )
        _require(self.read_retry_s >= 0, "faults.read_retry_s", f"must be >= 0, got {self.read_retry_s!r}")
        _require(
            self.collective_timeout_s == 0 or self.collective_timeout_s >= 1,
            "faults.collective_timeout_s",
            f"must be 0 (half the grace) or >= 1 second, got {self.collective_timeout_s!r}",
        )

    def collective_timeout(self, grace_s: float | None = None) -> timedelta:
        """The bound every collective gets: the configured one, or half the grace (at least 5 s)."""
        if self.collective_timeout_s:
            return timedelta(seconds=self.collective_timeout_s)
        if grace_s is None:
            grace_s = grace_seconds()  # BATON_GRACE, parsed in one place (a bad value is an error there)
        return timedelta(seconds=max(MIN_COLLECTIVE_TIMEOUT_S, grace_s / 2))


class StoreUnreachable(RuntimeError):
    """The store kept failing while a checkpoint was read, for `faults.read_retry_s`: end with 75."""


def retry_reads(
    fn: Callable[[], T],
    budget_s: float,
    retry_on: type[BaseException],
    say: Callable[[str], None],
    several_ranks: bool = False,
) -> T:
    """`fn()`, again with backoff while it raises `retry_on`, for at most `budget_s` seconds in all. With
    several ranks, an error that says a peer is gone is not retried (nothing would answer)."""
    t0, wait = time.monotonic(), 0.5
    while True:
        try:
            return fn()
        except retry_on as e:
            if several_ranks and is_peer_failure(e):
                raise
            spent = time.monotonic() - t0
            if spent + wait > budget_s:
                raise StoreUnreachable(
                    f"the store kept failing for {spent:.1f} s (faults.read_retry_s {budget_s:g}): {e}"
                ) from None
            say(f"reading the checkpoint failed ({e}); again in {wait:g} s")
            time.sleep(wait)
            wait = min(wait * 2, 10.0)


class StoreFailing(RuntimeError):
    """A final or preemption save failed after the store's retries, in a run whose store worked at the
    start: end with 75."""


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


# What gloo (and torch's wrappers around it) raise when a peer is dead or hung: a collective that timed out,
# or a connection the peer's end closed.
_PEER_LOST = re.compile(
    r"timed out|timeout|connection closed by peer|connection reset|broken pipe|"
    r"ECONNRESET|EPIPE|peer.*(closed|died|lost)",
    re.IGNORECASE,
)


def is_peer_failure(e: BaseException) -> bool:
    """Whether `e` says a peer rank is gone or hung: a collective's own error, or a save's StorageError
    that carries one (DCP's collectives inside a save). Ask only with several ranks."""
    name = type(e).__name__
    if name not in (
        "DistBackendError",
        "DistNetworkError",
        "RuntimeError",
        "StorageError",
        "CheckpointException",
    ):
        return False
    return bool(_PEER_LOST.search(str(e)))
