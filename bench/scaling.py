"""How cost grows: save and restart time at three state sizes against the raw rate, and the listing
against the number of checkpoints.

In one process, on local disk, with a state of float32 tensors of 16 MiB each (the size is what
the save and load paths depend on, not what the tensors mean). For each size (about 0.1, 0.5 and
1.5 GB; `--quick`: 0.05, 0.1, 0.2), interleaved, `reps` times each:
- raw_write: one sequential write of the same byte count, then fsync;
- save: `Store.save` as a periodic save does it (hashed while writing, nothing read back, commit);
- raw_read: reading every file of that checkpoint once (after dropping nothing: the page cache is
  as warm as it is for the load);
- load: `resolve_and_load` of it (listing, manifest, sizes, the load with every file hashed while
  read, into a staging copy);
- two_pass: what a restart did before: every file read and hashed (`Store.verify_files`), then
  `dcp.load` of the same files into the state;
- hash: the data files' checksum (`checkpoint.digest`, crc32c by default) of the same bytes already in
  memory, on `io_threads` threads (the verification's floor on this CPU).
For load and two_pass it also counts the bytes the process read (/proc/self/io rchar) against the
checkpoint's size: how many times a restart reads the checkpoint, independent of the machine's load.
The slope of each against the byte count (least squares, GB/s) is the figure; a constant part (the
commit's small writes, the listing) shows as the intercept.
Listing: `Store.committed_steps()` with 3 and with 30 committed checkpoints (tiny ones): one
listing request either way, so its time should stay flat.

    python -m bench.scaling --result FILE [--reps 3] [--quick]
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from bench.common import WORK, interleaved, log, median, section_args, write_result

TENSOR = 16 << 20  # bytes per tensor
FP = "bench-scaling"


def state_of(nbytes: int) -> dict[str, Any]:
    import torch

    n = max(1, nbytes // TENSOR)
    g = torch.Generator().manual_seed(0)
    return {
        "model": {f"w{i}": torch.randn(TENSOR // 4, generator=g) for i in range(n)},
        "progress": torch.tensor([0]),
    }


def raw_write(path: str, nbytes: int, noise: memoryview) -> float:
    chunk = 1 << 20
    os.makedirs(os.path.dirname(path), exist_ok=True)
    t = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(left, chunk)
            f.write(noise[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
    dt = time.perf_counter() - t
    os.remove(path)
    return dt


def raw_read(folder: str) -> float:
    t = time.perf_counter()
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            while f.read(8 << 20):
                pass
    return time.perf_counter() - t


def hash_in_memory(store: Any, step: int) -> float:
    from concurrent.futures import ThreadPoolExecutor

    from trainer.checkpoint import digest

    folder = store.step_path(step)
    blobs = [open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))]
    t = time.perf_counter()
    with ThreadPoolExecutor(store.io_threads) as pool:
        list(pool.map(lambda b: digest.of_bytes(store.digest, b), blobs))
    return time.perf_counter() - t


def rchar() -> int:
    """Bytes this process has read through read() calls so far (/proc/self/io), page-cache hits included:
    how many times a restart reads the checkpoint, whatever the disk's speed."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


def slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x: (b, a)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return b, my - b * mx


def main() -> None:
    args = section_args(__doc__ or "", None)
    import torch
    import torch.distributed.checkpoint as dcp

    from trainer.checkpoint import Store, resolve_and_load

    root = WORK / "scaling"
    shutil.rmtree(root, ignore_errors=True)
    sizes = [50e6, 100e6, 200e6] if args.quick else [0.1e9, 0.5e9, 1.5e9]
    noise = memoryview(os.urandom(1 << 20))
    per_size: dict[str, Any] = {}
    for size in sizes:
        state = state_of(int(size))
        nbytes = sum(t.numel() * t.element_size() for t in state["model"].values()) + 8
        store = Store(f"file://{root}/s{int(size)}", "run", io_threads=4)
        attempt = store.claim_attempt({})
        step = 0
        runs: dict[str, list[float]] = {
            "raw_write": [],
            "save": [],
            "raw_read": [],
            "load": [],
            "two_pass": [],
            "hash": [],
        }
        read_x: dict[str, list[float]] = {"load": [], "two_pass": []}  # bytes read / checkpoint bytes
        for _, side in interleaved(args.reps, ["raw_write", "save"]):
            if side == "raw_write":
                runs[side].append(raw_write(str(root / "raw.bin"), nbytes, noise))
            else:
                step += 1
                t = time.perf_counter()
                store.save(step, state, {"fingerprint": FP}, attempt, read_back=False)
                runs[side].append(time.perf_counter() - t)
                if step > 1:
                    store.delete_step(step - 1)
        template = {
            "model": {k: torch.empty_like(v) for k, v in state["model"].items()},
            "progress": torch.zeros(1, dtype=torch.int64),
        }
        for _, side in interleaved(args.reps, ["raw_read", "load", "two_pass", "hash"]):
            if side == "raw_read":
                runs[side].append(raw_read(store.step_path(step)))
            elif side == "two_pass":
                r0 = rchar()
                t = time.perf_counter()
                manifest = store.read_manifest(step)
                store.verify_files(step, manifest)
                dcp.load(
                    template, storage_reader=dcp.FileSystemReader(store.step_path(step))
                )  # the second read
                runs[side].append(time.perf_counter() - t)
                read_x[side].append((rchar() - r0) / nbytes)
            elif side == "hash":
                runs[side].append(hash_in_memory(store, step))
            else:
                r0 = rchar()
                t = time.perf_counter()
                got = resolve_and_load(store, FP, lambda s, m, tpl=template: tpl, lambda s, why: None)
                runs[side].append(time.perf_counter() - t)
                read_x[side].append((rchar() - r0) / nbytes)
                assert got is not None and got[0] == step

        per_size[str(int(size))] = {
            "bytes": nbytes,
            "runs": runs,
            **{f"{k}_s": median(v) for k, v in runs.items()},
            **{f"{k}_read_x": median(v) for k, v in read_x.items()},
        }
        log(f"scaling {nbytes / 1e9:.2f} GB: " + ", ".join(f"{k} {median(v):.2f} s" for k, v in runs.items()))
        shutil.rmtree(root / f"s{int(size)}", ignore_errors=True)
        del state, template, got
    xs = [v["bytes"] / 1e9 for v in per_size.values()]
    fits = {}
    for side in ("raw_write", "save", "raw_read", "load", "two_pass", "hash"):
        b, a = slope(xs, [v[f"{side}_s"] for v in per_size.values()])
        fits[side] = {"s_per_GB": b, "GBps": 1 / b if b > 0 else None, "intercept_s": a}

    # Listing: flat in the number of checkpoints.
    def listing_s(uri_of, reps: int) -> dict[str, float]:
        """Median seconds to list n committed checkpoints (n = 3 and 30) of a store at uri_of(n)."""
        out = {}
        for n in (3, 30):
            store = Store(uri_of(n), "run")
            attempt = store.claim_attempt({})
            for s in range(1, n + 1):
                store.save(s, {"progress": torch.tensor([s])}, {"fingerprint": FP}, attempt, read_back=False)
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                assert len(store.committed_steps()) == n
                times.append(time.perf_counter() - t)
            out[str(n)] = median(times)
        return out

    listing = listing_s(lambda n: f"file://{root}/list{n}", max(5, args.reps))
    shutil.rmtree(root, ignore_errors=True)
    from bench.s3 import LocalS3

    with LocalS3() as s3:
        listing_s3 = listing_s(lambda n: s3.uri(f"list{n}"), max(5, args.reps))
    write_result(
        args.result, {"sizes": per_size, "fits": fits, "listing_s": listing, "listing_s3_s": listing_s3}
    )


if __name__ == "__main__":
    main()
