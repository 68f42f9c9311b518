"""Memory of saving: peak RSS during 20 saves of the big model's trainer state, and RSS after each.

One process per mode, so that each peak is its own:
- sync: `Store.save` (what periodic saves do by default, and what a preemption save does);
- async: `Store.asyncs.save_async`, then the next step boundary, then `drain` (the staging copy lives
  until the upload has finished).
A thread samples this process's RSS every 5 ms from /proc/self/statm; the peak is taken over the saves
only (loading the model has a peak of its own). Older checkpoints are deleted as the saves go.

    python -m bench.memory --result FILE --mode sync|async [--saves 20] [--quick]
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from bench.common import WORK, log, rss_bytes, section_args, write_result


class PeakRss:
    def __init__(self, every_s: float = 0.005) -> None:
        self.every_s, self.peak = every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.every_s)

    def __enter__(self) -> PeakRss:
        self.peak = rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def _extra(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--mode", choices=["sync", "async"], required=True)
    ap.add_argument("--saves", type=int, default=20)


def main() -> None:
    args = section_args(__doc__ or "", _extra)
    from bench.state import close, manifest_of, open_trainer, state_bytes, state_of

    t = open_trainer(
        f"file://{WORK / ('memory-' + args.mode)}", quick=args.quick, name=f"bench-mem-{args.mode}"
    )
    store, fs = t.ckpt.store, t.ckpt.store.fs
    state, manifest = state_of(t), manifest_of(t)
    before = rss_bytes()
    after: list[int] = []
    save_s: list[float] = []
    with PeakRss() as peak:
        for i in range(1, args.saves + 1):
            t0 = time.perf_counter()
            if args.mode == "sync":
                store.save(i, state, manifest, t.attempt)
            else:
                store.asyncs.save_async(i, state, manifest, t.attempt, lambda res: None)
                store.asyncs.step_boundary()
                store.asyncs.drain()
            save_s.append(time.perf_counter() - t0)
            if i > 1:
                fs.rm(store.step_path(i - 1), recursive=True)
            after.append(rss_bytes())
            log(
                f"memory {args.mode}: save {i}/{args.saves} in {save_s[-1]:.1f} s, "
                f"RSS {after[-1] / 1e9:.2f} GB, peak so far {peak.peak / 1e9:.2f} GB"
            )
    fs.rm(store.step_path(args.saves), recursive=True)
    result: dict[str, Any] = {
        "mode": args.mode,
        "state_bytes": state_bytes(state),
        "rss_before": before,
        "peak": peak.peak,
        "rss_after": after,
        "save_s": save_s,
    }
    close(t)
    write_result(args.result, result)


if __name__ == "__main__":
    main()
