"""Asynchronous saves: the part of a store's saving that runs while training goes on (a member of `Store`).

`save_async` stages the state (a copy, on the stager's own thread, into buffers kept for the run) with
`dcp.async_save` on a gloo group of its own, and returns; the files are written and read back in the
background. The loop calls `before_update` before the optimizer writes (it waits for the staging copy,
which overlaps the forward and backward passes meanwhile) and `step_boundary` at the top of every step (it
commits the save once every rank's upload finished). At most one save is in flight; `drain` commits it
before any synchronous save. Writing the files and the commit itself are the store's (`Committer`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist

from trainer.checkpoint.write import PendingSave, SaveResult
from trainer.collectives import world
from trainer.faults import collective_timeout
from trainer.storage import StorageError


class Committer(Protocol):
    """What an asynchronous save needs of its store: to start writing, to commit, to record a verified step."""

    def start_save(
        self,
        step: int,
        state: dict[str, Any],
        manifest: dict[str, Any],
        attempt: int,
        asynchronous: bool,
        read_back: bool = True,
    ) -> PendingSave: ...

    def commit_save(self, p: PendingSave) -> SaveResult: ...

    def mark_verified(self, step: int, verified: bool) -> None: ...


def _reusable(stager: Any) -> bool:
    """Whether a DefaultStager can stage again. Before torch 2.13 (seen in 2.11) its _stage() closes
    the inner StateDictStager after every stage, emptying its copy dispatch: a second stage then fails
    with `KeyError: <class 'type'>`. Such a stager serves one save, and the next save gets a new one."""
    inner = getattr(stager, "_state_dict_stager", None)
    return bool(getattr(inner, "_deepcopy_dispatch", True))


class AsyncSaves:
    """The save in flight (at most one), its staging buffers and its gloo group, for one store."""

    def __init__(self, store: Committer) -> None:
        self.store = store
        self.pending: PendingSave | None = None
        self._stager: Any = None
        self._group: Any = None

    def save_async(
        self,
        step: int,
        state: dict[str, Any],
        manifest: dict[str, Any],
        attempt: int,
        on_commit: Callable[[SaveResult], None],
    ) -> float:
        """Stage the state, write it in the background (dcp.async_save on a dedicated gloo group),
        and commit at a later step boundary (`step_boundary`) once every rank's files are written and
        read back. At most one save is in flight: an older one is committed first. Returns the ms
        this call blocked."""
        self.drain()  # that wait counts as the older save's blocking time
        t = time.perf_counter()
        pending = self.store.start_save(step, state, manifest, attempt, asynchronous=True)
        pending.on_commit = on_commit
        pending.blocking_s += time.perf_counter() - t
        self.pending = pending
        return pending.blocking_s * 1000

    def before_update(self) -> None:
        """Call before anything mutates the model or optimizer state (the optimizer step): waits until
        the save in flight has staged its copy. The staging copy runs in the background meanwhile, over
        the step's forward and backward passes, which only read that state. That wait counts as the
        save's blocking time."""
        p = self.pending
        if p is None or p.staging is None:
            return
        t = time.perf_counter()
        p.staging.result()
        p.staging = None
        p.blocking_s += time.perf_counter() - t

    def step_boundary(self) -> None:
        """Call at the top of every optimizer step: commits the save in flight if every rank's upload
        has finished. A collective while a save is in flight (all ranks agree on when). Its staging
        copy may still be running: `before_update` waits for it."""
        p = self.pending
        if p is None:
            return
        t = time.perf_counter()
        ready = p.files.done()
        if world() > 1:
            flag = torch.tensor([1 if ready else 0], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            ready = bool(flag.item())
        p.blocking_s += time.perf_counter() - t
        if ready:
            self._complete(p)

    def drain(self, raise_storage_errors: bool = True) -> str | None:
        """Wait for the save in flight (if any) and commit it. Collective. With
        `raise_storage_errors=False` a failed save is returned as a message instead (a preemption
        still saves its own step); FencedOut is always raised."""
        p = self.pending
        if p is None:
            return None
        t = time.perf_counter()
        with contextlib.suppress(Exception):  # a failure is reported, collectively, by _finish
            p.files.result()
        p.blocking_s += time.perf_counter() - t
        try:
            self._complete(p)
        except StorageError as e:
            if raise_storage_errors:
                raise
            return str(e)
        return None

    def _complete(self, p: PendingSave) -> None:
        self.pending = None
        res = self.store.commit_save(p)
        self.store.mark_verified(p.step, True)  # an async save reads its files back, in the background
        if p.on_commit:
            p.on_commit(res)

    def staging_buffers(self) -> Any:
        # One stager for the whole run: its staging copy (one checkpoint per rank) is allocated once
        # and refilled by later saves, instead of allocated and faulted in on every save (measured in
        # docs/results.md, figure 2). Safe to refill: save_async drains the previous save first.
        if self._stager is not None and not _reusable(self._stager):
            self._stager = None
        if self._stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            # Staged on the stager's own thread, so that the copy overlaps the next step's forward and
            # backward passes (before_update waits for it); into pinned memory where a GPU is (the
            # device-to-host copy goes by DMA). Blocking copies: they queue behind the work already
            # on the stream, so a copy cannot read a parameter that an update still has to write.
            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=torch.cuda.is_available(),
                    use_shared_memory=False,
                    use_async_staging=True,
                    use_non_blocking_copy=False,
                )
            )
        return self._stager

    def gloo_group(self) -> Any:
        # Created once, by every rank at the same save. dcp.async_save on the default group hangs
        # or mismatches while training uses it; its own gloo group does not.
        if self._group is None:
            # The same bound on a peer as every other collective (trainer/faults.py), not torch's 30 min.
            self._group = (
                dist.new_group(backend="gloo", timeout=collective_timeout())
                if dist.is_initialized()
                else False
            )
        return self._group or None
