"""baton's environment variables, read by one strict rule (torch-free: the pod's PID 1, steps.train, reads
them before it starts the ranks).

A flag is 1, true, yes or on, or 0, false, no, off or unset (any case); a number is a finite decimal. Any
other spelling is refused with an EnvError naming the variable: a negative control asked for in a spelling
that went unread would quietly run as a normal trial, and pass.
"""

from __future__ import annotations

import math
import os

TRUE = ("1", "true", "yes", "on")
FALSE = ("", "0", "false", "no", "off")


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
    raise EnvError(f"{name} must be one of {', '.join(TRUE)} or {', '.join(f for f in FALSE if f)} (or unset), "
                   f"got {os.environ.get(name)!r}")


def number(name: str, default: float, minimum: float | None = None) -> float:
    """A finite number, at least `minimum` where given; `default` when unset or empty."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (minimum is not None and value < minimum):
        bound = f" >= {minimum:g}" if minimum is not None else ""
        raise EnvError(f"{name} must be a finite number{bound}, got {raw!r}")
    return value


def integer(name: str, default: int, minimum: int | None = None) -> int:
    """A whole number, at least `minimum` where given; `default` when unset or empty."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    kind = "a positive integer" if minimum == 1 else "an integer" + (f" >= {minimum}" if minimum is not None else "")
    try:
        value = int(raw)
    except ValueError:
        raise EnvError(f"{name} must be {kind}, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise EnvError(f"{name} must be {kind}, got {raw!r}")
    return value
