"""A one-rank restart reads its checkpoint while the model is built.

A restart's load needs the state it loads into, and that needs the model, whose class's first import is
most of the start (docs/results.md, figure 10). But `.metadata` already says every tensor's shape and
dtype: on one rank the newest checkpoint can be read whole, every file hashed while it is read, into
tensors made from `.metadata` (read.load_flat), on a thread, while the main thread imports and builds the
model. Reading is mostly outside the GIL (the file's bytes land in the tensors by `readinto`), so on a
machine with a second core the two overlap.

The load then takes the tensors it would have read, arranged as its template, once each matches the
template's shape, dtype and device (`Prefetch.take`). Whatever does not match, and any failure of the
thread, leaves the load to read the checkpoint itself as before: the prefetch may only save time, never
decide anything. A checkpoint the thread found corrupt is refused by that load, with its reason.

Only at world size 1: with several ranks each loads its shard of each tensor (a DTensor), which
`.metadata` alone does not give, and a thread must not enter collectives beside the main thread's.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import torch

from trainer.checkpoint.read import load_flat
from trainer.checkpoint.store import Store


class Prefetch:
    """The committed `step` of `store`, read and verified on a thread started at once."""

    def __init__(self, store: Store, step: int) -> None:
        self.store, self.step = store, step
        self.copies: Counter[str] = Counter()
        self.manifest: dict[str, Any] | None = None
        self.flat: dict[str, torch.Tensor] | None = None
        self.failure: str | None = None
        self.read_s = 0.0
        self.wait_s = 0.0
        self.used = False
        self._thread = threading.Thread(target=self._run, name="baton-ckpt-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t = time.perf_counter()
        try:
            manifest = self.store.read_manifest(self.step)
            # One reading thread: the main thread, importing, needs the other core (two cores measured:
            # with four readers the import took 1.0 s longer, with one 0.3 s; docs/results.md).
            self.flat = load_flat(
                self.store.url(self.store.step_path(self.step)),
                manifest["files"],
                threads=1,
                copies=self.copies,
            )
            self.manifest = manifest
        except BaseException as e:  # noqa: BLE001 - the load reads it again and gives its own verdict
            self.failure = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            self.flat = None
        finally:
            self.read_s = time.perf_counter() - t

    def take(self, step: int, manifest: dict[str, Any], template: dict[str, Any]) -> dict[str, Any] | None:
        """`template`'s structure filled with the prefetched tensors, once the thread is done; None (load
        it as before) for another step or manifest, a failed read, or any tensor that differs from the
        template's in key, shape, dtype or device. Hands the tensors out once."""
        t = time.perf_counter()
        self._thread.join()
        self.wait_s += time.perf_counter() - t
        flat, self.flat = self.flat, None
        if flat is None or step != self.step or manifest != self.manifest:
            return None

        def arrange(node: dict[str, Any], prefix: str) -> dict[str, Any] | None:
            out: dict[str, Any] = {}
            for k, v in node.items():
                key = f"{prefix}.{k}" if prefix else str(k)
                if isinstance(v, dict):
                    sub = arrange(v, key)
                    if sub is None:
                        return None
                    out[k] = sub
                    continue
                got = flat.get(key)
                if (
                    type(v) is not torch.Tensor
                    or type(got) is not torch.Tensor
                    or got.shape != v.shape
                    or got.dtype != v.dtype
                    or got.device != v.device
                ):
                    return None
                out[k] = got
            return out

        staged = arrange(template, "")
        self.used = staged is not None
        return staged

    def phases(self) -> dict[str, float]:
        """For the `resume` record: the read on its thread, and how long the load waited for it."""
        return {
            "prefetch_read_s": round(self.read_s, 3),
            "prefetch_wait_s": round(self.wait_s, 3),
            "prefetch_used": float(self.used),
        }
