"""The grace this process budgets against between SIGTERM and SIGKILL, without importing torch (the pod's
PID 1, steps.train, reads it before it starts the ranks)."""

from __future__ import annotations

from trainer import env


def grace_seconds() -> float:
    """`BATON_GRACE`: the seconds this process budgets against between SIGTERM and SIGKILL (its default and
    range: trainer/env.py)."""
    return float(env.number("BATON_GRACE"))
