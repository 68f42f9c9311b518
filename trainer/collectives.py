"""The collectives every part of the trainer uses, each a no-op on one process (no process group, or a
group of one): the world and rank, broadcast from rank 0, all-gather of JSON values, a barrier, and
`gather_rows`, the step's one all-reduce that gathers every rank's integers in rank order.

What `broadcast` and `gather` carry is strict JSON in a byte tensor, at most untrusted.MAX_MESSAGE bytes
and untrusted.MAX_DEPTH deep, never a pickle: torch's `broadcast_object_list` unpickles whatever the
peer sends, and a peer is untrusted (a rank that joined an attacker's store would run its code). A value
comes back as JSON gives it: tuples as lists, dict keys as strings. DCP and accelerate still exchange
pickles between ranks inside their own collectives; what keeps an attacker out of the group is the
authenticated round (steps/lib/group.py).

Every collective waits at most the process group's timeout (faults.collective_timeout_s): a dead or hung
peer raises instead of holding the others (trainer/faults.py)."""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

from trainer.untrusted import MAX_MESSAGE, Refused, parse_json


def world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _device() -> torch.device:
    """Where a collective's tensors live for the default group: the current GPU under NCCL, else the CPU
    (what torch's own object collectives pick)."""
    from torch.distributed.distributed_c10d import _get_object_coll_device

    return torch.device(_get_object_coll_device())


def _encode(obj: Any) -> bytes:
    return json.dumps(obj, allow_nan=False, separators=(",", ":")).encode()


def _decode(data: bytes, sender: int) -> Any:
    return parse_json(data, f"the message from rank {sender}")


def _checked_length(n: int, sender: int) -> int:
    if not 0 <= n <= MAX_MESSAGE:
        raise Refused(f"rank {sender} sent a message of {n} bytes (at most {MAX_MESSAGE})")
    return n


def broadcast(obj: Any) -> Any:
    """Rank 0's value (JSON: None, bool, int, float, str, lists and string-keyed dicts) on every rank.
    Rank 0 gets back what the others decoded, so every rank holds the same value."""
    if world() == 1:
        return json.loads(_encode(obj))
    dev = _device()
    data = _encode(obj) if rank() == 0 else b""
    length = torch.tensor([len(data)], dtype=torch.int64, device=dev)
    dist.broadcast(length, src=0)
    n = _checked_length(int(length.item()), 0)
    buf = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
        if rank() == 0 and n
        else torch.empty(n, dtype=torch.uint8, device=dev)
    )
    dist.broadcast(buf, src=0)
    return _decode(buf.cpu().numpy().tobytes(), 0)


def gather(obj: Any) -> list[Any]:
    """Every rank's `obj` (JSON, as for `broadcast`), in rank order, on every rank."""
    if world() == 1:
        return [json.loads(_encode(obj))]
    dev, n = _device(), world()
    data = _encode(obj)
    lengths = torch.zeros(n, dtype=torch.int64, device=dev)
    lengths[rank()] = len(data)
    dist.all_reduce(lengths, op=dist.ReduceOp.SUM)
    sizes = [_checked_length(int(v), r) for r, v in enumerate(lengths.tolist())]
    width = max(sizes)
    mine = torch.zeros(width, dtype=torch.uint8, device=dev)
    if data:
        mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
    parts = [torch.empty(width, dtype=torch.uint8, device=dev) for _ in range(n)]
    dist.all_gather(parts, mine)
    return [
        _decode(p[:size].cpu().numpy().tobytes(), r)
        for r, (p, size) in enumerate(zip(parts, sizes, strict=True))
    ]


def barrier() -> None:
    if world() > 1:
        dist.barrier()


def gather_rows(mine: list[int], device: torch.device | None = None) -> list[list[int]]:
    """Every rank's `mine` (signed 64-bit integers, the same length on every rank), in rank order: one SUM
    all-reduce of a (world, len) table in which each rank fills its own row, exact since the other rows
    are zero. What a step's record needs from every rank travels in it (trainer/trajectory.py)."""
    n = world()
    if n == 1:
        return [list(mine)]
    table = torch.zeros((n, len(mine)), dtype=torch.int64, device=device)
    table[rank()] = torch.tensor(mine, dtype=torch.int64, device=device)
    dist.all_reduce(table, op=dist.ReduceOp.SUM)
    return table.tolist()
