"""Flush, async and save time: the big model's trainer state written by baton against a raw write.

Sides, interleaved, each `reps` times, on local disk and on a local S3 (moto):
- raw: one sequential write of the checkpoint's byte count (16 MiB chunks), then fsync (local) or
  the multipart upload's completion (S3): the physical limit of that storage through that client;
- dcp: `dcp.save` with the FsspecWriter that the trainer uses (serialize + write + fsync);
- store: `trainer.checkpoint.Store.save`, what a preemption save costs: dcp.save, then read back and
  sha256 every file, then manifest.json and _COMMIT;
- async (local only): `Store.save_async` (or `dcp.async_save` on a gloo group of its own when the
  store has no async path): the time it blocks the caller, and the time until it has committed.

    python -m bench.flush --result FILE [--reps 3] [--quick]
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from bench.common import WORK, log, median, section_args, write_result

CHUNK = 16 << 20


def _noise(n: int = 64 << 20) -> memoryview:
    return memoryview(os.urandom(n))


def raw_write(uri: str, nbytes: int, noise: memoryview) -> float:
    """Seconds to write `nbytes` to one object at `uri` and make it durable."""
    from trainer.checkpoint import local_path
    from trainer.storage import url_to_fs

    def fill(f: Any) -> None:
        left = nbytes
        while left > 0:
            n = min(left, CHUNK)
            off = (left // CHUNK * CHUNK) % (len(noise) - CHUNK)
            f.write(noise[off: off + n])
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
    """The four ways of writing the same state to one store."""

    def __init__(self, t: Any, store: Any, attempt: int, state: dict[str, Any], manifest: dict[str, Any]) -> None:
        self.t, self.store, self.attempt, self.state, self.manifest = t, store, attempt, state, manifest
        self.step = 100
        self.noise = _noise()
        self.nbytes = 0

    def _next(self) -> int:
        self.step += 1
        return self.step

    def store_save(self) -> dict[str, float]:
        step = self._next()
        t0 = time.perf_counter()
        res = self.store.save(step, self.state, self.manifest, self.attempt)
        dt = time.perf_counter() - t0
        self.nbytes = res.bytes
        _rm(self.store.fs, self.store.step_path(step))
        return {"s": dt}

    def dcp_save(self) -> dict[str, float]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        from trainer.storage import storage_options

        path = self.store.step_path(self._next())
        t0 = time.perf_counter()
        dcp.save(self.state, storage_writer=FsspecWriter(self.store.url(path), **storage_options(self.store.root_uri)))
        dt = time.perf_counter() - t0
        _rm(self.store.fs, path)
        return {"s": dt}

    def raw(self) -> dict[str, float]:
        path = f"{self.store.step_path(self._next())}/raw.bin"
        dt = raw_write(self.store.url(path), self.nbytes, self.noise)
        _rm(self.store.fs, path)
        return {"s": dt}

    def async_save(self) -> dict[str, float]:
        step = self._next()
        t0 = time.perf_counter()
        if hasattr(self.store, "save_async"):
            self.store.save_async(step, self.state, self.manifest, self.attempt, lambda res: None)
            t1 = time.perf_counter()
            self.store.step_boundary()  # what the next step waits for: the staging copy
            blocking = time.perf_counter() - t0
            self.store.drain()
            total = time.perf_counter() - t0
            blocked_in_boundary = blocking - (t1 - t0)
        else:
            blocking, total, blocked_in_boundary = self._dcp_async(step, t0)
        _rm(self.store.fs, self.store.step_path(step))
        return {"s": blocking, "total_s": total, "boundary_s": blocked_in_boundary}

    def _dcp_async(self, step: int, t0: float) -> tuple[float, float, float]:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        from trainer.storage import storage_options

        if not hasattr(self, "_group"):
            self._group = dist.new_group(backend="gloo")
        writer = FsspecWriter(self.store.url(self.store.step_path(step)), **storage_options(self.store.root_uri))
        fut = dcp.async_save(self.state, storage_writer=writer, process_group=self._group)
        blocking = time.perf_counter() - t0
        (getattr(fut, "upload_completion", None) or fut).result()
        return blocking, time.perf_counter() - t0, 0.0


def measure(sides: Sides, names: list[str], reps: int, where: str) -> dict[str, list[dict[str, float]]]:
    from bench.common import interleaved

    runs: dict[str, Callable[[], dict[str, float]]] = {
        "raw": sides.raw, "dcp": sides.dcp_save, "store": sides.store_save, "async": sides.async_save}
    out: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for rep, name in interleaved(reps, names):
        r = runs[name]()
        out[name].append(r)
        log(f"{where} rep {rep + 1}/{reps} {name}: {r['s']:.2f} s"
            + (f" (committed after {r['total_s']:.2f} s)" if "total_s" in r else ""))
    return out


def summarize(out: dict[str, list[dict[str, float]]], nbytes: int) -> dict[str, Any]:
    s: dict[str, Any] = {"runs": out}
    for name, rs in out.items():
        s[f"{name}_s"] = median([r["s"] for r in rs])
        s[f"{name}_MBps"] = nbytes / s[f"{name}_s"] / 1e6
        if rs and "total_s" in rs[0]:
            s[f"{name}_total_s"] = median([r["total_s"] for r in rs])
    return s


def main() -> None:
    args = section_args(__doc__ or "")
    from bench.s3 import LocalS3
    from bench.state import close, manifest_of, open_trainer, state_bytes, state_of
    from trainer.checkpoint import Store

    root = WORK / "flush"
    t = open_trainer(f"file://{root}", quick=args.quick)
    state, manifest = state_of(t), manifest_of(t)
    result: dict[str, Any] = {"state_bytes": state_bytes(state),
                              "params": sum(p.numel() for p in t.model.parameters()),
                              "async_path": "Store.save_async" if hasattr(t.store, "save_async") else "dcp.async_save"}
    local = Sides(t, t.store, t.attempt, state, manifest)
    t0 = time.perf_counter()
    local.store_save()  # warm-up, and the byte count the raw side writes
    result["first_store_save_s"] = time.perf_counter() - t0
    result["ckpt_bytes"] = local.nbytes
    log(f"checkpoint: {local.nbytes / 1e9:.2f} GB ({result['state_bytes'] / 1e9:.2f} GB of tensors), "
        f"first save {result['first_store_save_s']:.1f} s")
    result["local"] = summarize(measure(local, ["raw", "dcp", "store", "async"], args.reps, "local"), local.nbytes)
    with LocalS3() as s3:
        store = Store(s3.uri("flush"), t.cfg.run_id)
        attempt = store.claim_attempt({"bench": True})
        remote = Sides(t, store, attempt, state, manifest)
        remote.nbytes = local.nbytes
        result["s3"] = summarize(measure(remote, ["raw", "dcp", "store"], args.reps, "s3"), local.nbytes)
    close(t)
    write_result(args.result, result)


if __name__ == "__main__":
    main()
