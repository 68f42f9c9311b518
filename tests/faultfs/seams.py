"""The test seams, reaching the trainer from outside through trainer/hooks.py (installed by this
folder's sitecustomize.py when one of these is set; each is read once, when the process starts):

    BATON_PAUSE_AFTER_STEP=K[,K:m,...]   hold the loop after step K's record (or m micro-batches into step K+1)
                                         until a signal or a preemption warning arrives (at most 120 s), so a
                                         test lands SIGTERM on an exact point; the ranks leave together
    BATON_TEST_HANG_AFTER_STEP=RANK:STEP hang that rank for good after that step (it ignores SIGTERM too, as
                                         a rank stuck in a kernel or a deadlock does)
    BATON_TEST_DISAGREE_AFTER_STEP=RANK:STEP  that rank decides alone to stop after that step while its peers
                                         train on, as a broken collective stop would
    BATON_NOISE=<scale>,<seed>           perturb every gradient by a seeded relative amount (noise.py): a
                                         stand-in for nondeterministic kernels, so Tier 2 can be tested on a CPU

Test-only; never on the image's path.
"""

from __future__ import annotations

import os
import sys
import time

from trainer import hooks

VARIABLES = (
    "BATON_PAUSE_AFTER_STEP",
    "BATON_TEST_HANG_AFTER_STEP",
    "BATON_TEST_DISAGREE_AFTER_STEP",
    "BATON_NOISE",
)
PAUSE_LIMIT_S = 120


def _rank_step(raw: str) -> tuple[int, int] | None:
    if not raw:
        return None
    rank, _, step = raw.partition(":")
    return int(rank), int(step)


class Seams(hooks.Hooks):
    def __init__(self, env: dict[str, str]) -> None:
        raw = env.get("BATON_PAUSE_AFTER_STEP", "")
        self.pauses = {
            (int(k), int(m or 0))
            for k, _, m in (x.strip().partition(":") for x in raw.split(",") if x.strip())
        }
        self.hang = _rank_step(env.get("BATON_TEST_HANG_AFTER_STEP", ""))
        self.disagree = _rank_step(env.get("BATON_TEST_DISAGREE_AFTER_STEP", ""))
        self.noise = None
        if env.get("BATON_NOISE"):
            from noise import GradNoise

            self.noise = GradNoise.parse(env["BATON_NOISE"])
            # One line per process, so that a drill's logs say which noise each role and attempt drew.
            print(f"faultfs: BATON_NOISE seed {self.noise.seed} in pid {os.getpid()}", file=sys.stderr)

    def at_point(self, p: hooks.Point) -> bool:
        if (p.step, p.micro) not in self.pauses:
            return False
        import torch
        import torch.distributed as dist

        from trainer.records import log

        p.preempt.invalidate()
        log(f"paused after step {p.step}" + (f", {p.micro} micro-batch(es) into the next" if p.micro else ""))
        deadline = time.monotonic() + PAUSE_LIMIT_S
        while True:
            pending = bool(p.warning_pending and p.warning_pending())
            flags = torch.tensor(
                [int(p.preempt.local), int(pending), int(time.monotonic() > deadline)],
                dtype=torch.int32,
                device=p.device,
            )
            if p.world > 1:
                dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            if flags.any():
                return True
            time.sleep(0.01)

    def after_update(self, rank: int, step: int) -> None:
        if self.hang == (rank, step):  # the SIGTERM handler only sets a flag, which nothing here looks at
            while True:
                time.sleep(3600)

    def stops_alone(self, rank: int, step: int) -> bool:
        return self.disagree == (rank, step)

    def after_backward(self, model, step: int, micro: int, rank: int) -> None:
        if self.noise is not None:
            self.noise.perturb(model, step, micro, rank)


def install_from(env: dict[str, str]) -> None:
    if any(env.get(v) for v in VARIABLES):
        hooks.install(Seams(env))


if __name__ != "__main__":
    install_from(dict(os.environ))
