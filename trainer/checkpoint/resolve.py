"""A restart's load: the newest intact checkpoint, read once, into a staging copy.

`resolve_and_load` lists the committed checkpoints, checks the newest one's manifest (its checksum in
_COMMIT, its fingerprint, every file's size), then loads it through `read.VerifyingReader`, which
hashes every file while DCP reads it, into a staging copy of the state; it falls back past any
checkpoint that fails. Each phase is timed (`LoadTimes`) for the `resume` record.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException

from trainer.checkpoint.interface import newest_intact
from trainer.checkpoint.layout import CorruptCheckpoint
from trainer.checkpoint.read import corrupt_reason, wrapped_failures
from trainer.checkpoint.store import CheckpointRefused, Store
from trainer.collectives import broadcast, gather, rank, world
from trainer.empty import unfilled
from trainer.faults import is_peer_failure
from trainer.storage import StorageError, describe


def _staging_like(state: dict[str, Any]) -> dict[str, Any]:
    """A tensor-for-tensor copy of `state`'s structure with fresh storage (DTensors stay DTensors with
    the same placements): what a load writes into before the checkpoint is known to be intact; DCP
    writes every entry whole, and a load that fails drops the copy."""
    with unfilled():
        return {k: _staging_like(v) if isinstance(v, dict) else torch.empty_like(v) for k, v in state.items()}


def _load_failure(e: BaseException) -> str:
    """The reason to record for a failed load: a CorruptCheckpoint's own message when a rank raised one
    (DCP wraps every rank's failure in one CheckpointException)."""
    reason = corrupt_reason(e)
    if reason is not None:
        return reason
    inners = wrapped_failures(e)
    # A store that failed while DCP read from it (an I/O error, a connection): not a reason to pass over
    # this checkpoint. "storage:" makes the caller raise a StorageError, which the resume retries
    # (trainer/faults.py). A missing file is the checkpoint's fault (its sizes were checked just before).
    for err in (e, *inners):
        if (
            world() > 1 and err is not None and is_peer_failure(err)
        ):  # a rank died mid-restore: not the file's fault
            return f"storage:a peer rank is gone: {type(err).__name__}: {err}".splitlines()[0][:500]
        if isinstance(err, (OSError, StorageError)) and not isinstance(err, FileNotFoundError):
            return f"storage:reading a checkpoint failed: {describe(err)}"
    return f"load failed: {type(e).__name__}: {e}".splitlines()[0][:500]


def _all_hashed(store: Store, step: int, manifest: dict[str, Any], hashed: set[str]) -> str | None:
    """Collective: every file of the manifest was hashed by some rank during the load; a file that none
    read (an item no rank asked for) is hashed now on rank 0. Returns the agreed refusal, or None."""
    parts = gather(sorted(hashed))
    verdict = None
    if rank() == 0:
        missing = sorted(set(manifest.get("files") or {}) - {n for p in parts for n in p})
        try:
            if missing:
                store.verify_files(step, manifest, names=missing)
        except CorruptCheckpoint as e:
            verdict = str(e)
        except StorageError as e:
            verdict = f"storage:{e}"
    return broadcast(verdict)


@dataclass
class LoadTimes:
    """Seconds spent in each phase of resolve_and_load (over every checkpoint it tried)."""

    listing: float = 0.0
    manifest: float = 0.0
    load: float = 0.0
    tried: int = 0
    copies: Counter[str] = field(default_factory=Counter)
    """Items loaded by each of the reader's paths (read.VerifyingReader.copies), over every try."""

    def as_dict(self) -> dict[str, float]:
        items = sum(self.copies.values())
        copies = (
            self.copies["direct"]
            + 2 * self.copies["buffered"]
            + 3 * self.copies["torch_load"]
            + 2 * self.copies["bytes"]
        )
        return {
            "listing_s": round(self.listing, 3),
            "manifest_s": round(self.manifest, 3),
            "load_verify_s": round(self.load, 3),
            "items": items,
            "items_direct": self.copies["direct"],
            "items_buffered": self.copies["buffered"],
            "items_torch_load": self.copies["torch_load"],
            "copies_per_item": round(copies / items, 2) if items else 0.0,
        }


def resolve_and_load(
    store: Store,
    fingerprint: str,
    build_state: Callable[[int, dict], dict],
    on_refused: Callable[[int, str], None],
    times: LoadTimes | None = None,
    steps: list[int] | None = None,
    check_staged: Callable[[int, dict], str | None] | None = None,
    prefetched: Callable[[int, dict, dict], dict | None] | None = None,
) -> tuple[int, dict, dict] | None:
    """Load the newest complete, intact checkpoint; fall back past torn or corrupt ones.

    `steps`: the committed steps, newest first, when the caller has listed them (same on every rank).
    `build_state(step, manifest)` returns the tensor-only state to load (the live tensors may be in
    it): the load goes into a staging copy of it, hashing every file while reading it, and the staging
    copy is returned only once every file has matched its checksum on every rank and `check_staged(step,
    staged)` (the caller's check of what the copy holds, the same on every rank) returned None, so no
    tensor of a refused checkpoint reaches the live state. `prefetched(step, manifest, template)`, when
    given, may return that staging copy already loaded, every file verified (prefetch.Prefetch.take);
    None leaves the load to read it. Returns (step, manifest, staged state), or None when no
    usable checkpoint exists. Raises CheckpointRefused for a checkpoint of another run (a different
    fingerprint): that is a mistake to stop on, not to skip. A store that fails (after retries) while
    being read raises StorageError: a network fault is not a reason to pass over a good checkpoint.
    """
    times = times if times is not None else LoadTimes()
    if steps is None:  # the caller may have listed them already (one listing per start)
        t = time.perf_counter()
        steps = broadcast(store.committed_steps() if rank() == 0 else None)
        times.listing += time.perf_counter() - t

    def load(step: int) -> tuple[dict, dict]:
        """(manifest, staged state) of `step`; CorruptCheckpoint (the same on every rank) to fall back."""
        times.tried += 1
        t = time.perf_counter()
        verdict: str | None = None
        manifest: dict = {}
        if rank() == 0:
            try:
                manifest = store.read_manifest(step)
                if "fingerprint" not in manifest:
                    verdict = "manifest.json has no fingerprint"
                elif manifest["fingerprint"] != fingerprint:
                    verdict = (
                        f"foreign:{store.url(store.step_path(step))} has fingerprint "
                        f"{str(manifest.get('fingerprint'))[:12]}, this run has {fingerprint[:12]}"
                    )
                else:
                    store.verify_files(step, manifest, hash_files=False)  # sizes: a stat each
            except CorruptCheckpoint as e:
                verdict = str(e)
            except StorageError as e:
                verdict = f"storage:{e}"
        verdict, manifest = broadcast((verdict, manifest))
        times.manifest += time.perf_counter() - t
        if verdict and verdict.startswith("foreign:"):
            raise CheckpointRefused(
                f"refusing checkpoint {verdict.removeprefix('foreign:')}; it belongs to another run"
            )
        if verdict and verdict.startswith("storage:"):
            raise StorageError(verdict.removeprefix("storage:"))
        if verdict is None:
            t = time.perf_counter()
            try:
                template = build_state(step, manifest)
                state = prefetched(step, manifest, template) if prefetched is not None else None
                if state is None:
                    state = _staging_like(template)
                    hashed = store.load_verified(step, manifest, state, times.copies)
                    verdict = _all_hashed(store, step, manifest, hashed)
                if verdict is None and check_staged is not None:  # each rank checks its part; all agree
                    verdict = next((v for v in gather(check_staged(step, state)) if v), None)
            except (Exception, CheckpointException) as e:  # DCP raises it on every rank together
                verdict = _load_failure(e)
            times.load += time.perf_counter() - t
            if verdict and verdict.startswith("storage:"):
                raise StorageError(verdict.removeprefix("storage:"))
            if verdict is None:
                store.mark_verified(step, True)  # every file hashed while it loaded
                return manifest, state
        raise CorruptCheckpoint(verdict)

    found = newest_intact(steps, load, on_refused)
    if found is None:
        return None
    step, (manifest, state) = found
    return step, manifest, state
