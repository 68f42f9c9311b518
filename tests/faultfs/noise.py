"""A test seam that makes a run nondeterministic on purpose, the way fast GPU kernels are (seams.py
installs it; nothing in trainer/ knows it).

    BATON_NOISE=<scale>            e.g. 1e-6: every process draws its own seed (what a drill needs)
    BATON_NOISE=<scale>,<seed>     e.g. 1e-6,7: a seed the test chose

After every backward pass each gradient element g becomes g * (1 + scale * z), z ~ N(0, 1), drawn from a
generator of its own seeded by (seed, step, micro-batch, rank): a relative rounding difference such as a
reduction in another order leaves. Two runs with different seeds then differ by a floor that grows as
they train, as two runs of a nondeterministic kernel do; a run with the same seed does not (a resumed
attempt redraws the same perturbations), so the resume itself adds nothing. Without a seed, each process
draws one from the OS: in a drill the reference, its replay and each attempt of the trial then differ as
they would on a GPU (a resumed trial's perturbations are drawn afresh, as a kernel's would be), so the
floor is above 0. One seed for every role, what `<scale>,<seed>` set in a drill's environment gives, makes
the floor and the distance 0: Tier 2 would then measure nothing. It never draws from the
training RNG. Never set it for real work: it exists so that the Tier 2 judgment (`steps/lib/judge.py`) can
be tested on a CPU, against a correct resume and against the negative controls under the same noise.
"""

from __future__ import annotations

import os

import torch


class GradNoise:
    def __init__(self, scale: float, seed: int) -> None:
        self.scale, self.seed = scale, seed

    @classmethod
    def parse(cls, raw: str) -> GradNoise:
        try:
            scale_text, _, seed_text = raw.partition(",")
            scale = float(scale_text)
            seed = (
                int(seed_text) if seed_text else int.from_bytes(os.urandom(3), "little")
            )  # keeps perturb's seed in int64
        except ValueError:
            raise ValueError(
                f"BATON_NOISE: expected '<scale>' or '<scale>,<seed>' such as '1e-6' or '1e-6,7', got {raw!r}"
            ) from None
        if not 0 < scale < 1 or seed < 0:
            raise ValueError(f"BATON_NOISE: scale must be in (0, 1) and seed >= 0, got {raw!r}")
        return cls(scale, seed)

    @torch.no_grad()
    def perturb(self, model: torch.nn.Module, step: int, micro: int, rank: int) -> None:
        gen = torch.Generator(device="cpu").manual_seed(
            ((self.seed * 1_000_003 + step) * 1_009 + micro) * 131 + rank
        )
        for p in model.parameters():
            if p.grad is None:
                continue
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad  # DTensor: this rank's shard
            z = torch.randn(g.shape, generator=gen, dtype=torch.float32).to(device=g.device, dtype=g.dtype)
            g.mul_(1 + self.scale * z)
