"""Every RNG a rank draws from, captured as tensors and restored exactly.

Tensors only, so a checkpoint never needs pickled objects: python's Mersenne Twister and numpy's
are encoded as int64 tensors (floats by their bit pattern), torch's states are already tensors.
"""

from __future__ import annotations

import hashlib
import random
import struct

import numpy as np
import torch


def _f2i(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _i2f(i: int) -> float:
    return struct.unpack("<d", struct.pack("<q", i))[0]


def capture() -> dict[str, torch.Tensor]:
    version, mt, gauss = random.getstate()
    py = [version, *mt, int(gauss is not None), _f2i(gauss or 0.0)]
    name, keys, pos, has_gauss, cached = np.random.get_state()
    assert name == "MT19937"
    npy = [*keys.tolist(), pos, has_gauss, _f2i(cached)]
    state = {
        "python": torch.tensor(py, dtype=torch.int64),
        "numpy": torch.tensor(npy, dtype=torch.int64),
        "torch": torch.get_rng_state().clone(),
    }
    if torch.cuda.is_available():
        # This rank's own device only: a restart that sees another number of GPUs must still load.
        state["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device()).clone()
    return state


def restore(state: dict[str, torch.Tensor]) -> None:
    py = state["python"].tolist()
    gauss = _i2f(py[-1]) if py[-2] else None
    random.setstate((py[0], tuple(py[1:-2]), gauss))
    npy = state["numpy"].tolist()
    keys = np.array(npy[:-3], dtype=np.uint32)
    np.random.set_state(("MT19937", keys, npy[-3], npy[-2], _i2f(npy[-1])))
    torch.set_rng_state(state["torch"].to(torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].to(torch.uint8), torch.cuda.current_device())


def seed_everything(seed: int, rank: int) -> None:
    """Each rank gets its own stream, derived from (seed, rank)."""
    s = int.from_bytes(hashlib.sha256(f"baton-rng:{seed}:{rank}".encode()).digest()[:8], "little") >> 1
    random.seed(s)
    np.random.seed(s % (2**32))
    torch.manual_seed(s)
