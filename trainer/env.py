"""baton's environment variables: each one's name, kind, default and range, and the one strict rule that
reads them (torch-free: the pod's PID 1, steps.train, reads them before it starts the ranks).

A flag is 1, true, yes or on, or 0, false, no, off or unset (any case); a number goes through
trainer/bounded.py (a plain decimal of bounded length, finite, inside its range). Any other spelling is
refused with an EnvError naming the variable: a negative control asked for in a spelling that went unread
would quietly run as a normal trial, and pass; a grace of `nan` or 1e300 would fail far from its cause.

Every entry point calls `check()` first, so that a bad value is one line and exit 1 before anything runs.
"""

from __future__ import annotations

import os
import sys

from trainer.bounded import Bound, OutOfRange, parse
from trainer.exits import EXIT_FAIL

TRUE = ("1", "true", "yes", "on")
FALSE = ("", "0", "false", "no", "off")

MAX_GRACE_S = 86400.0
"""The longest grace baton budgets for (a day): far past any cloud's, and well inside what a timer takes."""

NUMBERS: dict[str, tuple[float, Bound]] = {
    "BATON_GRACE": (30.0, Bound(0, MAX_GRACE_S)),
    "BATON_EVIDENCE_FLUSH_S": (2.0, Bound(0, 3600)),
    "BATON_S3_MAX_ATTEMPTS": (5, Bound(1, 100, integer=True)),
    "BATON_GCS_MAX_ATTEMPTS": (6, Bound(1, 100, integer=True)),
}
"""Numeric variables: name -> (default when unset or empty, range)."""

FLAGS = ("BATON_DISABLE_SIGTERM_HANDLER", "BATON_SWAP_RANK_STATE", "BATON_GCS_HNS")
"""Flag variables (unset: off)."""


class EnvError(ValueError):
    """An environment variable in a spelling baton does not read. The message names the variable."""


def text(name: str, default: str = "") -> str:
    """The variable's value, stripped; `default` when unset or empty."""
    return os.environ.get(name, "").strip() or default


def flag(name: str) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw in TRUE:
        return True
    if raw in FALSE:
        return False
    raise EnvError(
        f"{name} must be one of {', '.join(TRUE)} or {', '.join(f for f in FALSE if f)} (or unset), "
        f"got {os.environ.get(name)!r}"
    )


def number(name: str) -> float | int:
    """The numeric variable `name` (one of NUMBERS): its default when unset or empty, else the value
    inside its range, or an EnvError naming it and the range."""
    default, bound = NUMBERS[name]
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse(raw, name, bound)
    except OutOfRange as e:
        raise EnvError(str(e)) from None


def check() -> None:
    """Read every numeric and flag variable once: the first bad one raises an EnvError naming it."""
    for name in NUMBERS:
        number(name)
    for name in FLAGS:
        flag(name)


def check_or_exit() -> None:
    """`check()` at an entry point's start: a bad variable is one line `error: ...` and exit 1 (no retry
    helps), never a traceback."""
    try:
        check()
    except EnvError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_FAIL)
