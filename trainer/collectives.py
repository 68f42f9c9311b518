"""The collectives every part of the trainer uses, each a no-op on one process (no process group, or a
group of one): the world and rank, broadcast from rank 0, all-gather of Python objects, a barrier, and
`gather_rows`, the step's one all-reduce that gathers every rank's integers in rank order.

Every collective waits at most the process group's timeout (faults.collective_timeout_s): a dead or hung
peer raises instead of holding the others (trainer/faults.py)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def broadcast(obj: Any) -> Any:
    """Rank 0's value on every rank."""
    if world() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    if world() == 1:
        return [obj]
    out: list[Any] = [None] * world()
    dist.all_gather_object(out, obj)
    return out


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
