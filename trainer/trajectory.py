"""The trajectory of a run: what each step was fed and which random state it started from, as digests
that kernel nondeterminism cannot change.

Every `step` record carries `batch_sha` (the inputs of every micro-batch of every rank) and `rng_sha`
(every RNG state the step starts from: python, numpy, torch's CPU generator and every CUDA device's, on
every rank). Each rank digests its own into a signed 64-bit integer; the ranks' integers travel in the
step's one collective (each rank fills its own slot of a SUM all-reduce, which gathers them in rank
order), and `combine` hashes them in rank order. The drill compares them step by step: a data order or
an RNG that was not restored shows at the first step it changes, whatever the tier (steps/trajectory.py).
"""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Iterable

import numpy as np
import torch


def _digest(h: hashlib._Hash) -> int:
    return int.from_bytes(h.digest()[:8], "little", signed=True)


def _tensor_bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()


def batch_digest(batches: Iterable[torch.Tensor]) -> int:
    """This rank's micro-batches of one step (host copies), in order."""
    h = hashlib.sha256()
    for t in batches:
        h.update(str(tuple(t.shape)).encode())
        h.update(_tensor_bytes(t))
    return _digest(h)


def rng_digest(captured: dict[str, torch.Tensor] | None = None) -> int:
    """The RNG states a step starts from: `captured` (trainer.rng.capture's tensors) or, without it, the
    live generators; then every CUDA device's generator."""
    h = hashlib.sha256()
    if captured is not None:
        for name in sorted(captured):
            h.update(name.encode())
            h.update(_tensor_bytes(captured[name]))
    else:
        version, state, gauss = random.getstate()
        h.update(struct.pack(f"<{len(state) + 1}q", version, *state))
        h.update(repr(gauss).encode())
        name, keys, pos, has_gauss, cached = np.random.get_state()
        h.update(keys.tobytes())
        h.update(struct.pack("<qqd", pos, has_gauss, cached))
        h.update(_tensor_bytes(torch.get_rng_state()))
    if torch.cuda.is_available():
        for state in torch.cuda.get_rng_state_all():
            h.update(_tensor_bytes(state))
    return _digest(h)


def combine(per_rank: Iterable[int]) -> str:
    """The ranks' digests, in rank order, as one short hex string (what a record carries)."""
    h = hashlib.sha256()
    for d in per_rank:
        h.update(int(d).to_bytes(8, "little", signed=True))
    return h.hexdigest()[:16]


def f64_bits(x: float) -> int:
    """A float64 as the int64 with its bit pattern: floats travel exactly in an int64 all-reduce."""
    return struct.unpack("<q", struct.pack("<d", x))[0]


def bits_f64(i: int) -> float:
    return struct.unpack("<d", struct.pack("<q", int(i)))[0]
