"""What every figure is: a row of the table (and rows under it) and a sentence on what it means."""

from __future__ import annotations

from dataclasses import dataclass, field

GRACES = (15.0, 120.0)
"""Seconds of grace a preemption save must fit: GKE Spot's 15 s, and 120 s (node pools that raise it)."""


@dataclass
class Figure:
    n: str
    what: str
    baton: str
    other: str
    ratio: str
    text: str
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)


def fmt_gb(b: float) -> str:
    return f"{round(b / 1e9, 2) + 0.0:.2f} GB"  # + 0.0: no "-0.00"


def fmt_s(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f} s"


def fmt_x(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"
