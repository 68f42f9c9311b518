"""The grace this process budgets against between SIGTERM and SIGKILL, without importing torch (the pod's
PID 1, steps.train, reads it before it starts the ranks)."""

from __future__ import annotations

import os

DEFAULT_GRACE_S = 30.0


def grace_seconds() -> float:
    """`BATON_GRACE`: the seconds this process budgets against between SIGTERM and SIGKILL."""
    raw = os.environ.get("BATON_GRACE", "")
    try:
        return float(raw) if raw else DEFAULT_GRACE_S
    except ValueError:
        raise ValueError(f"BATON_GRACE must be a number of seconds, got {raw!r}") from None
