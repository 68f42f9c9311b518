"""Flush, async and save time: the trainer's checkpoint state written by baton against a raw write.

Sides, interleaved, each `reps` times (after one untimed warm-up of each baton side; on local disk the
raw, dcp and store sides then get `reps` more interleaved rounds, because the shared disk is noisy):
- raw: one sequential write of the checkpoint's byte count (1 MiB chunks, which were faster here than
  16 MiB ones), then fsync (local) or the multipart upload's completion (S3): the physical limit of
  that storage through that client;
- dcp: `dcp.save` with the FsspecWriter that the trainer uses (its thread_count is the store's
  io_threads; serialize + write + fsync);
- store: `trainer.checkpoint.Store.save`, what a preemption save costs: dcp.save, then read back and
  sha256 every file, then manifest.json and _COMMIT, with the config's `checkpoint.io_threads` (a file
  per writer thread, hashed in parallel);
- store_1thread (local): the same with io_threads=1, one file per rank written and hashed in turn;
- store_preempt: `Store.save(read_back=False)`, what a preemption save now does: hashed while written,
  sizes checked in the store, nothing read back;
- async (local): `Store.asyncs.save_async` (or `dcp.async_save` on a gloo group of its own when the store
  has no async path): the time it blocks the caller when the next optimizer update follows at once
  (the call, the step boundary, and `before_update`'s wait for the staging copy: the worst case),
  and the time until it has committed;
- async_step (local): the same save with one forward and backward pass of the bench's model (one
  batch of 64 tokens) between the step boundary and `before_update`, as in the trainer's loop, where
  the staging copy runs meanwhile: the call, the boundary and the wait that is left;
- async_reuse (local, a diagnostic): `dcp.async_save` on the same kind of group with one
  DefaultStager kept across saves, so the staging buffers are reused instead of allocated per save.

`--where local` uses the big model (~125 M parameters, ~1.5 GB). `--where s3` uses the small stand-in
state (`--quick` size, ~0.2 GB): moto keeps objects in memory and slows down faster than linearly with
object size (one 1.5 GB raw upload took over a minute), so a big round would measure moto.

    python -m bench.flush --result FILE --where local|s3 [--reps 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

from bench.common import WORK, interleaved, log, median, section_args, write_result

CHUNK = 1 << 20


def raw_write(uri: str, nbytes: int, noise: memoryview) -> float:
    """Seconds to write `nbytes` to one object at `uri` and make it durable."""
    from trainer.storage import local_path, url_to_fs

    def fill(f: Any) -> None:
        left = nbytes
        while left > 0:
            n = min(left, CHUNK)
            off = (left // CHUNK * CHUNK) % (len(noise) - CHUNK)
            f.write(noise[off : off + n])
            left -= n

    path = local_path(uri)
    t0 = time.perf_counter()
    if path is not None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
    else:
        fs, p = url_to_fs(uri)
        with fs.open(p, "wb") as f:
            fill(f)
    return time.perf_counter() - t0


def _rm(fs: Any, path: str) -> None:
    try:
        fs.rm(path, recursive=True)
    except FileNotFoundError:
        pass


class Sides:
    """The ways of writing the same state to one store; each returns {"s": seconds, ...}."""

    def __init__(
        self,
        store: Any,
        attempt: int,
        state: dict[str, Any],
        manifest: dict[str, Any],
        work: Callable[[], None] | None = None,
    ) -> None:
        self.store, self.attempt, self.state, self.manifest = store, attempt, state, manifest
        self.work = work  # one forward and backward pass: what runs between a boundary and the update
        self.step = 100
        self.noise = memoryview(os.urandom(64 << 20))
        self.nbytes = 0
        self._group: Any = None
        self._stager: Any = None

    def _next(self) -> int:
        self.step += 1
        return self.step

    def _writer(self, path: str) -> Any:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        from trainer.storage import storage_options

        return FsspecWriter(
            self.store.url(path), thread_count=self.store.io_threads, **storage_options(self.store.root_uri)
        )

    def store_save(self, read_back: bool = True) -> dict[str, float]:
        step = self._next()
        t0 = time.perf_counter()
        res = self.store.save(step, self.state, self.manifest, self.attempt, read_back=read_back)
        dt = time.perf_counter() - t0
        self.nbytes = res.bytes
        _rm(self.store.fs, self.store.step_path(step))
        return {"s": dt}

    def store_preempt(self) -> dict[str, float]:
        """A preemption save: hashed while writing, sizes checked, nothing read back."""
        return self.store_save(read_back=False)

    def store_1thread(self) -> dict[str, float]:
        """The same save with checkpoint.io_threads=1: one file per rank, written and hashed in turn."""
        threads, self.store.io_threads = self.store.io_threads, 1
        try:
            return self.store_save()
        finally:
            self.store.io_threads = threads

    def dcp_save(self, zip_crc: bool = True) -> dict[str, float]:
        """`dcp.save` alone; `zip_crc=False`: through the Store's ArchiveFileSystem, whose writer threads
        skip torch.save's zip CRC-32 as every `Store.save` does (trainer/checkpoint/write.py)."""
        import torch
        import torch.distributed.checkpoint as dcp

        from trainer.checkpoint import ArchiveFileSystem

        path = self.store.step_path(self._next())
        writer = self._writer(path)
        torch.serialization.set_crc32_options(
            zip_crc
        )  # this thread; DCP's own writer threads start with True
        if not zip_crc:
            writer.fs = ArchiveFileSystem(self.store.fs)
        t0 = time.perf_counter()
        dcp.save(self.state, storage_writer=writer)
        dt = time.perf_counter() - t0
        _rm(self.store.fs, path)
        return {"s": dt}

    def dcp_nocrc(self) -> dict[str, float]:
        return self.dcp_save(zip_crc=False)

    def raw(self) -> dict[str, float]:
        path = f"{self.store.step_path(self._next())}/raw.bin"
        dt = raw_write(self.store.url(path), self.nbytes, self.noise)
        _rm(self.store.fs, path)
        return {"s": dt}

    def async_save(self) -> dict[str, float]:
        if not hasattr(self.store, "asyncs"):
            return self._dcp_async(reuse_stager=False)
        step = self._next()
        t0 = time.perf_counter()
        self.store.asyncs.save_async(step, self.state, self.manifest, self.attempt, lambda res: None)
        t1 = time.perf_counter()
        self.store.asyncs.step_boundary()
        blocking = time.perf_counter() - t0
        if self.work is not None:
            tw = time.perf_counter()
            self.work()
            t_work = time.perf_counter() - tw
        else:
            t_work = 0.0
        tb = time.perf_counter()
        if hasattr(self.store, "before_update"):
            self.store.asyncs.before_update()  # what the next optimizer update waits for: the staging copy
        blocking += time.perf_counter() - tb
        self.store.asyncs.drain()
        total = time.perf_counter() - t0 - t_work
        _rm(self.store.fs, self.store.step_path(step))
        return {"s": blocking, "total_s": total, "call_s": t1 - t0, "work_s": t_work}

    def async_step(self) -> dict[str, float]:
        """The async save with a forward and backward pass before the update (`work`)."""
        return self.async_save()

    def _async_no_work(self) -> dict[str, float]:
        work, self.work = self.work, None
        try:
            return self.async_save()
        finally:
            self.work = work

    def async_reuse(self) -> dict[str, float]:
        return self._dcp_async(reuse_stager=True)

    def _dcp_async(self, reuse_stager: bool) -> dict[str, float]:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        if reuse_stager and self._stager is None:
            self._stager = DefaultStager(StagingOptions(False, False, False, False))
        path = self.store.step_path(self._next())
        t0 = time.perf_counter()
        fut = dcp.async_save(
            self.state,
            storage_writer=self._writer(path),
            process_group=self._group,
            async_stager=self._stager if reuse_stager else None,
        )
        blocking = time.perf_counter() - t0
        (getattr(fut, "upload_completion", None) or fut).result()
        total = time.perf_counter() - t0
        _rm(self.store.fs, path)
        return {"s": blocking, "total_s": total}

    def run(self, name: str) -> dict[str, float]:
        runs: dict[str, Callable[[], dict[str, float]]] = {
            "raw": self.raw,
            "dcp": self.dcp_save,
            "dcp_nocrc": self.dcp_nocrc,
            "store": self.store_save,
            "store_1thread": self.store_1thread,
            "store_preempt": self.store_preempt,
            "async": self._async_no_work,
            "async_step": self.async_step,
            "async_reuse": self.async_reuse,
        }
        return runs[name]()


def measure(sides: Sides, names: list[str], reps: int, where: str, cheap_reps: int = 0) -> dict[str, Any]:
    """`reps` interleaved rounds of every side, then rounds of the raw, dcp and store sides alone up to
    `cheap_reps` (they take seconds, and the disk is noisy: more samples steady their medians)."""
    t0 = time.perf_counter()
    sides.store_save()  # warm-up, and the byte count the raw side writes
    first = time.perf_counter() - t0
    for name in names:
        if name.startswith("async"):
            sides.run(name)  # warm-up: the first async save also sets up its gloo group and planner
    log(f"{where}: checkpoint {sides.nbytes / 1e9:.2f} GB, first save {first:.1f} s (untimed warm-ups done)")
    out: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    cheap = [n for n in names if n in ("raw", "dcp", "dcp_nocrc", "store", "store_1thread", "store_preempt")]
    rounds = [(r, n) for r, n in interleaved(reps, names)]
    rounds += [(reps + r, n) for r, n in interleaved(max(0, cheap_reps - reps), cheap)]
    for rep, name in rounds:
        r = sides.run(name)
        out[name].append(r)
        log(
            f"{where} rep {rep + 1} {name}: {r['s']:.2f} s"
            + (f" (committed after {r['total_s']:.2f} s)" if "total_s" in r else "")
        )
    s: dict[str, Any] = {"runs": out, "ckpt_bytes": sides.nbytes, "first_store_save_s": first}
    for name, rs in out.items():
        s[f"{name}_s"] = median([r["s"] for r in rs])
        s[f"{name}_MBps"] = sides.nbytes / s[f"{name}_s"] / 1e6
        if rs and "total_s" in rs[0]:
            s[f"{name}_total_s"] = median([r["total_s"] for r in rs])
    return s


def _extra(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--where", choices=["local", "s3"], required=True)


def main() -> None:
    args = section_args(__doc__ or "", _extra)
    from bench.s3 import LocalS3
    from bench.state import close, manifest_of, open_trainer, state_bytes, state_of
    from trainer.checkpoint import Store

    quick = args.quick or args.where == "s3"
    t = open_trainer(f"file://{WORK / 'flush'}", quick=quick)
    state, manifest = state_of(t), manifest_of(t)
    result: dict[str, Any] = {
        "where": args.where,
        "state_bytes": state_bytes(state),
        "params": sum(p.numel() for p in t.model.parameters()),
        "async_path": "Store.asyncs.save_async" if hasattr(t.ckpt.store, "asyncs") else "dcp.async_save",
    }
    if args.where == "local":
        batch = t.data.next_batch()

        def work() -> None:  # one forward and backward pass, as between a boundary and its update
            t.model(input_ids=batch, labels=batch).loss.backward()

        sides = Sides(t.ckpt.store, t.attempt, state, manifest, work)
        result.update(
            measure(
                sides,
                [
                    "raw",
                    "dcp",
                    "dcp_nocrc",
                    "store",
                    "store_1thread",
                    "store_preempt",
                    "async",
                    "async_step",
                    "async_reuse",
                ],
                args.reps,
                "local",
                cheap_reps=2 * args.reps,
            )
        )
    else:
        with LocalS3() as s3:
            store = Store(s3.uri("flush"), t.cfg.run_id)
            attempt = store.claim_attempt({"bench": True})
            result.update(
                measure(
                    Sides(store, attempt, state, manifest),
                    ["raw", "dcp", "store", "store_preempt"],
                    args.reps,
                    "s3",
                )
            )
    close(t)
    write_result(args.result, result)


if __name__ == "__main__":
    main()
