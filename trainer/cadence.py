"""The checkpoint cadence beside `checkpoint.every_steps`: a wall-clock interval, or Young/Daly's
sqrt(2 * C * MTBF) from the measured save cost C and an MTBF estimated from this run's own preemptions,
shrunk towards a prior (`estimate_mtbf_s`). The loop feeds it each save's cost and asks `due()` at a step
boundary (config section `cadence`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from trainer.validation import require as _require


@dataclass
class CadenceConfig:
    mode: str = "steps"
    """'steps': only checkpoint.every_steps. 'wall': also every `every_s` seconds. 'auto': also every
    sqrt(2 * save cost * MTBF) seconds (Young/Daly), clamped to [min_interval_s, max_interval_s]."""
    every_s: float = 600.0
    """'wall': the interval. 'auto': the interval until a save cost has been measured."""
    mtbf_prior_s: float = 6 * 3600.0
    """'auto': the prior mean time between preemptions, before this run has any history."""
    mtbf_prior_weight: float = 1.0
    """'auto': how many preemptions the prior counts as (0: trust only this run's history)."""
    min_interval_s: float = 60.0
    """'auto': the shortest interval, whatever the estimate."""
    max_interval_s: float = 3600.0
    """'auto': the longest interval, whatever the estimate (an MTBF without evidence is infinite)."""

    def __post_init__(self) -> None:
        _require(
            self.mode in ("steps", "wall", "auto"),
            "cadence.mode",
            f"must be 'steps', 'wall' or 'auto', got {self.mode!r}",
        )
        _require(self.every_s > 0, "cadence.every_s", f"must be > 0, got {self.every_s}")
        _require(self.mtbf_prior_s > 0, "cadence.mtbf_prior_s", f"must be > 0, got {self.mtbf_prior_s}")
        _require(
            self.mtbf_prior_weight >= 0,
            "cadence.mtbf_prior_weight",
            f"must be >= 0, got {self.mtbf_prior_weight}",
        )
        _require(self.min_interval_s > 0, "cadence.min_interval_s", f"must be > 0, got {self.min_interval_s}")
        _require(
            self.max_interval_s >= self.min_interval_s,
            "cadence.max_interval_s",
            f"must be >= cadence.min_interval_s ({self.min_interval_s}), got {self.max_interval_s}",
        )


def young_daly_interval_s(save_cost_s: float, mtbf_s: float) -> float:
    """Young's optimum checkpoint interval sqrt(2 * C * MTBF), the first-order term of Daly's."""
    if save_cost_s < 0 or not mtbf_s > 0:
        raise ValueError(f"need save_cost_s >= 0 and mtbf_s > 0, got {save_cost_s}, {mtbf_s}")
    return math.sqrt(2.0 * save_cost_s * mtbf_s)


class Attempt(NamedTuple):
    start: float
    """Unix seconds the attempt started."""
    preempted: bool
    """Whether it ended in a preemption (False for the running attempt, or one that crashed or finished)."""
    duration_s: float
    """Seconds it ran (for the running attempt: so far)."""


def estimate_mtbf_s(
    history: Sequence[tuple[float, bool, float]], prior_mtbf_s: float, prior_weight: float
) -> float:
    """MTBF = (prior_mtbf_s * prior_weight + total runtime) / (prior_weight + preemptions).

    The prior counts as `prior_weight` pseudo-preemptions spread over `prior_weight * prior_mtbf_s` seconds
    (the posterior mean of a Gamma prior on an exponential's rate, inverted). Attempts that were not
    preempted add runtime and no failure. No evidence and no prior weight: infinite."""
    preemptions = sum(1 for _, preempted, _ in history if preempted)
    runtime = sum(max(0.0, duration) for _, _, duration in history)
    denominator = prior_weight + preemptions
    if denominator <= 0:
        return math.inf
    return (prior_mtbf_s * prior_weight + runtime) / denominator


@dataclass(frozen=True)
class CadenceChange:
    """What `Cadence.update` reports, for the caller to log."""

    mode: str
    interval_s: float | None
    previous_s: float | None
    save_cost_s: float | None
    mtbf_s: float


class Cadence:
    """The wall-clock checkpoint schedule, beside the step schedule: `due(now, last_save_at)`. Under
    several ranks, decide on one rank and broadcast: clocks and measured costs differ per rank."""

    def __init__(self, cfg: CadenceConfig, rel_tol: float = 0.1) -> None:
        self.cfg, self.rel_tol = cfg, rel_tol
        self.save_cost_s: float | None = None
        self.mtbf_s = estimate_mtbf_s([], cfg.mtbf_prior_s, cfg.mtbf_prior_weight)
        self.interval_s = self._interval()
        self._reported: CadenceChange | None = None

    def _interval(self) -> float | None:
        if self.cfg.mode == "steps":
            return None
        if self.cfg.mode == "wall" or self.save_cost_s is None:
            return self.cfg.every_s
        optimum = young_daly_interval_s(self.save_cost_s, self.mtbf_s)
        return min(max(optimum, self.cfg.min_interval_s), self.cfg.max_interval_s)

    def _moved(self, a: float | None, b: float | None) -> bool:
        return (a is None) != (b is None) or (
            a is not None and b is not None and not math.isclose(a, b, rel_tol=self.rel_tol)
        )

    def update(
        self, save_cost_s: float | None = None, history: Sequence[tuple[float, bool, float]] | None = None
    ) -> CadenceChange | None:
        """Take a measured save cost and/or this run's attempt history; the change to log when the
        interval or an input moved by more than `rel_tol` since the last report (the first call reports)."""
        if save_cost_s is not None:
            self.save_cost_s = max(0.0, save_cost_s)
        if history is not None:
            self.mtbf_s = estimate_mtbf_s(history, self.cfg.mtbf_prior_s, self.cfg.mtbf_prior_weight)
        self.interval_s = self._interval()
        last = self._reported
        if last is not None and not (
            self._moved(self.interval_s, last.interval_s)
            or self._moved(self.save_cost_s, last.save_cost_s)
            or self._moved(self.mtbf_s, last.mtbf_s)
        ):
            return None
        self._reported = CadenceChange(
            self.cfg.mode, self.interval_s, last.interval_s if last else None, self.save_cost_s, self.mtbf_s
        )
        return self._reported

    def due(self, now: float, last_save_at: float) -> bool:
        """Whether a wall-clock save is due; `last_save_at` is the last save (or the attempt's start), on
        the same clock as `now`."""
        return self.interval_s is not None and now - last_save_at >= self.interval_s
