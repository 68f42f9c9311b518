"""The trajectory of a run: what each step was fed and which random state it started from, as digests
that kernel nondeterminism cannot change.

Every `step` record carries `batch_sha` (the inputs of every micro-batch of every rank) and `rng_sha`
(every RNG state the step starts from: python, numpy, torch's CPU generator and every CUDA device's, on
every rank), and `batch_rng_sha` (the RNG before the step's batches were drawn: for baton's loader, which
draws from no global RNG, the same state; the HF callback digests it before each collator call). Each rank digests its own into a signed 64-bit integer; the ranks' integers travel in the
step's one collective (each rank fills its own slot of a SUM all-reduce, which gathers them in rank
order), and `combine` hashes them in rank order. The drill compares them step by step: a data order or
an RNG that was not restored shows at the first step it changes, whatever the tier (steps/lib/trajectory.py).
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


class InputDigest:
    """The inputs of one step's micro-batches as one signed 64-bit digest, computed where they are (a
    weighted sum of each tensor's values with fixed pseudo-random int64 weights, wrapping: exact and
    order-sensitive on any device, so no device-to-host copy per micro-batch), and whether every raw
    loss of the step was finite. `take()` reads both once a step."""

    def __init__(self) -> None:
        self._weights: dict[tuple[int, str], torch.Tensor] = {}
        self._acc: torch.Tensor | None = None
        self._finite: torch.Tensor | None = None

    def _w(self, n: int, device: torch.device) -> torch.Tensor:
        key = (n, str(device))
        if key not in self._weights:
            g = torch.Generator().manual_seed(0x6261746F6E)  # private: the training's RNG is never touched
            self._weights[key] = torch.randint(-(2**62), 2**62, (n,), generator=g, dtype=torch.int64).to(
                device
            )
        return self._weights[key]

    def on_forward(self, module, args, kwargs):
        if not module.training:
            return None
        tensors = [("", a) for a in args if isinstance(a, torch.Tensor)]
        tensors += sorted((k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor))
        for _, t in tensors:
            flat = (
                t.detach().reshape(-1).to(torch.int64)
                if not t.is_floating_point()
                else t.detach().reshape(-1).double().view(torch.int64)
            )
            d = (flat * self._w(flat.numel(), flat.device)).sum() + flat.numel()
            self._acc = d if self._acc is None else self._acc * 1_000_003 + d
        return None

    def on_output(self, module, args, output):
        loss = getattr(output, "loss", None)
        if module.training and isinstance(loss, torch.Tensor):
            ok = torch.isfinite(loss.detach()).all()
            self._finite = ok if self._finite is None else self._finite & ok
        return None

    def take(self) -> tuple[int, bool]:
        acc, finite = self._acc, self._finite
        self._acc = self._finite = None
        return (int(acc.item()) if acc is not None else 0), (
            bool(finite.item()) if finite is not None else True
        )


# ---- the exact start ---------------------------------------------------------------------------------------

START_EVENT = "start"
"""The record a fresh start writes before its first step: `weights_sha` and `optim_sha` (start_digests).
The drill compares the reference's with its replay's: two fresh starts of one seed must begin from the same
model, or nothing can be certified (a resume bug would hide in the difference, at Tier 2 in the floor)."""


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a parameter or state entry, gathered across shards (collective for a DTensor:
    every rank calls this for the same names in the same order)."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


def start_digests(model: torch.nn.Module, optim: torch.optim.Optimizer | None = None) -> dict[str, str]:
    """sha256 (hex) of the full initial trainable weights, each in its stored dtype, by name in sorted
    order; and of the optimizer's state if it holds any (its tensors full, its hyperparameters as JSON).
    Collective on a sharded model: call it on every rank."""
    import json

    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if not p.requires_grad:
            continue
        t = _full(p.detach())
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(_tensor_bytes(t))
    out = {"weights_sha": h.hexdigest()}
    if optim is not None:
        o = hashlib.sha256()
        names = {id(p): n for n, p in model.named_parameters()}
        groups = [
            {
                k: v
                for k, v in g.items()
                if k != "params" and isinstance(v, (int, float, str, bool, list, tuple))
            }
            for g in optim.param_groups
        ]
        o.update(json.dumps(groups, sort_keys=True, default=str).encode())
        for p in sorted(
            (p for g in optim.param_groups for p in g["params"]), key=lambda p: names.get(id(p), "")
        ):
            for key, value in sorted(optim.state.get(p, {}).items()):
                if isinstance(value, torch.Tensor):
                    v = _full(value.detach())
                    o.update(f"{names.get(id(p), '?')}.{key}:{v.dtype}:{tuple(v.shape)}".encode())
                    o.update(_tensor_bytes(v))
        out["optim_sha"] = o.hexdigest()
    return out
