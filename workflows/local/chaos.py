"""Chaos for the local runner: delete N pods of a workflow, chosen at random among its tasks, at random
moments, under a seed (``run -p chaos=N``, ``-p chaos_seed=S``).

Each deletion is drawn up front from the seed: a task, uniformly among the tasks given, and a moment:

- for a task whose pods write step records (the training steps), either a step (the pod is deleted as soon
  as it has reported that step: mid-training, a checkpoint step or not) or, one time in four, at its start:
  half of those at a delay after the pod's start drawn in [0, ``startup_s``] (before its SIGTERM handler
  exists, while it imports), half as soon as the pod reports that it restores a checkpoint (its ``restore``
  record, written just before the load; a pod with nothing to restore takes it at its first step instead);
- for any other task, a delay after the pod's start drawn in [0, ``delay_s``].

A deletion that finds no pod of its task running waits for the next one; a task whose next attempt would be
its last retry is never chosen (the drill's verdict is about losing nothing, not about exhausting a retry
limit that is configuration). A deletion whose task finished first is moved to another unfinished task,
with a new moment, drawn from the same random stream; one that no task can take any more is recorded
``missed``. So is a deletion sent to a pod that then ended Succeeded (its exit 0 came before the SIGTERM
took): it deleted nothing, and moves on the same way. A pod is deleted the way ``kubectl delete pod`` does it (SIGTERM, SIGKILL after its grace): the
runner's ``delete`` (steps/lib/local_pods.py). The planned evictions of the trial (``steps.evict``) are not
chaos and are never counted here.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

STARTUP_FRACTION = 0.25  # share of training-step deletions that land at a pod's start, not at a step


@dataclass
class Deletion:
    """One planned deletion, and what became of it."""

    index: int
    task: str
    trigger: str  # "step": at the first step record >= value; "after_s": value seconds after the pod started;
    # "restore": when the pod reports its restore record (or its first step, if it had nothing to restore)
    value: float
    moved_from: list[str] = field(default_factory=list)  # tasks that finished before it landed
    # Filled when it lands: the pod, its attempt, when (seconds since the workflow started), its step.
    pod: str | None = None
    attempt: int | None = None
    at_s: float | None = None
    at_step: int | None = None
    outcome: str = "planned"  # planned -> deleted | missed
    ended: dict[str, Any] = field(default_factory=dict)  # the attempt's status, exit code and message


class Chaos:
    """The deletions of one run; the runner asks ``due`` for each running pod at every poll."""

    def __init__(
        self,
        n: int,
        seed: int,
        tasks: list[str],
        step_tasks: set[str] | frozenset[str] = frozenset(),
        total_steps: int | None = None,
        startup_s: float = 4.0,
        delay_s: float = 2.0,
        long_tasks: dict[str, float] | None = None,
    ) -> None:
        if n < 0:
            raise ValueError(f"chaos must be >= 0, got {n}")
        if n and not tasks:
            raise ValueError("chaos: no task to delete pods of")
        self.seed, self.tasks, self.step_tasks = seed, list(tasks), set(step_tasks)
        self.total_steps, self.startup_s, self.delay_s = total_steps, startup_s, delay_s
        self.long_tasks = dict(long_tasks or {})  # task -> its own delay bound (a task that runs for long)
        self.rng = random.Random(seed)
        self.deletions = [self._draw(i, self.rng.choice(self.tasks)) for i in range(n)]

    def _draw(self, index: int, task: str) -> Deletion:
        r = (
            self.rng.random()
            if task in self.step_tasks and self.total_steps and self.total_steps > 1
            else None
        )
        if r is not None and r >= STARTUP_FRACTION:
            return Deletion(index, task, "step", self.rng.randint(1, self.total_steps - 1))
        bound = self.startup_s if task in self.step_tasks else self.long_tasks.get(task, self.delay_s)
        delay = round(self.rng.uniform(0.0, bound), 3)  # drawn either way: one plan per seed
        if r is not None and r < STARTUP_FRACTION / 2:
            return Deletion(index, task, "restore", 0.0)
        return Deletion(index, task, "after_s", delay)

    def armed(self, task: str) -> Deletion | None:
        """The first deletion still waiting for a pod of ``task``."""
        return next((d for d in self.deletions if d.outcome == "planned" and d.task == task), None)

    def due(self, task: str, age_s: float, step: int | None, restoring: bool = False) -> Deletion | None:
        """The deletion to carry out now on ``task``'s running pod (``age_s`` old, at ``step``, ``restoring``
        a checkpoint), if any."""
        d = self.armed(task)
        if d is None:
            return None
        if d.trigger == "step":
            return d if step is not None and step >= d.value else None
        if d.trigger == "restore":
            return d if restoring or step is not None else None
        return d if age_s >= d.value else None

    def landed(self, d: Deletion, pod: str, attempt: int, at_s: float, step: int | None) -> None:
        d.pod, d.attempt, d.at_s, d.at_step, d.outcome = pod, attempt, round(at_s, 3), step, "deleted"

    def ended(self, pod: str, status: str, exit_code: int, message: str) -> None:
        for d in self.deletions:
            if d.pod != pod:
                continue
            if status == "Succeeded":  # the pod finished before the deletion took: it deleted nothing
                d.moved_from.append(d.task)
                d.pod = d.attempt = d.at_s = d.at_step = None
                d.outcome = "planned"  # its task is done: the runner's `unavailable` moves it on next
                continue
            d.ended = {"status": status, "exit_code": exit_code, "message": message}

    def unavailable(self, task: str, open_tasks: list[str]) -> None:
        """``task`` can take no more deletions (it finished, or its next attempt is its last retry): move
        what waited for it to one of ``open_tasks``, or record it missed."""
        for d in self.deletions:
            if d.outcome != "planned" or d.task != task:
                continue
            choices = [t for t in open_tasks if t != task]
            if not choices:
                d.outcome = "missed"
                continue
            new = self._draw(d.index, self.rng.choice(sorted(choices)))
            d.moved_from.append(task)
            d.task, d.trigger, d.value = new.task, new.trigger, new.value

    def record(self) -> dict[str, Any]:
        """What report.json holds under ``chaos``."""
        return {
            "seed": self.seed,
            "planned": len(self.deletions),
            "deleted": sum(d.outcome == "deleted" for d in self.deletions),
            "deletions": [asdict(d) for d in self.deletions],
        }
