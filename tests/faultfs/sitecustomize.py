"""Loaded by every Python process that has tests/faultfs on its PYTHONPATH (site imports sitecustomize),
which every test's processes do (tests/helpers.py base_env). It installs the trainer's test seams
(seams.py: pauses, a hung or disagreeing rank, gradient noise) when a test sets one, and
registers the fsspec protocol ``faulty://``, the local filesystem with faults a test plants through
``BATON_TEST_FAULTS`` (JSON), in the trainer and its torchrun workers alike, so the fault meets the
trainer's real code path (DCP's fsspec writer, the manifest, _COMMIT) with nothing in trainer/ aware of it.

    {"enospc_steps": [20, 30]}   every write under step-000000NN/ fails with ENOSPC (a full disk)
    {"enospc_first": {"6": 1}}   only the first write under step-00000006/ fails with ENOSPC (per process): a
                                 save that fails once, and the next save of that step succeeds
    {"slow_writes": {"8": 0.5}, "marker": PATH}  every write under step-00000008/ first waits 0.5 s; the first
                                 such write creates the file PATH, if given (a test lands a kill mid-save)
    {"slow_writes": {...}, "marker": PATH, "once": true}  as that, but a process that starts when PATH already
                                 exists is not slowed: the attempt that retries one killed mid-save saves at
                                 full speed (tests/e2e/test_real_node.py, a grace shorter than the save)
    {"slow_reads": {"6": 1.0}, "marker": PATH}   every read under step-00000006/ first waits 1 s; the first
                                 such read creates the file PATH (a test lands a kill mid-restore)
    {"read_errors": 3, "read_match": ".distcp"}   only paths holding read_match count (here DCP's data files)
    {"read_errors": 3}           the first 3 opens for reading of any checkpoint file fail with EIO (a store
                                 that answers 5xx for a while), counted per process; -1: every one fails

A step's folder is baton's `step-000000NN/` or the HF callback's `checkpoint-N/` (trainer/hf.py).

Test-only; never on the image's path.
"""

from __future__ import annotations

import errno
import json
import os
import re

from fsspec import register_implementation
from fsspec.implementations.local import LocalFileSystem


def _faults() -> dict:
    try:
        return json.loads(os.environ.get("BATON_TEST_FAULTS", "") or "{}")
    except ValueError:
        return {}


_STEP_DIR = re.compile(r"/(?:step-(\d{8})|checkpoint-(\d+))(/|$)")


def _step_of(path: str, inside: bool = False) -> int | None:
    """The step of the checkpoint folder `path` is in (or is, unless `inside`), else None."""
    m = _STEP_DIR.search(str(path))
    if not m or (inside and m.group(3) != "/"):
        return None
    return int(m.group(1) or m.group(2))


def _slowed_at_start() -> bool:
    """Whether this process gets the slow writes: always, unless "once" and the marker existed when it started."""
    faults = _faults()
    return not (faults.get("once") and faults.get("marker") and os.path.exists(faults["marker"]))


_SLOWED = _slowed_at_start()


class FaultyFileSystem(LocalFileSystem):
    protocol = ("faulty",)
    root_marker = "/"

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("auto_mkdir", True)
        super().__init__(*args, **kwargs)

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        if path.startswith("faulty://"):
            path = path[len("faulty://") :]
        return LocalFileSystem._strip_protocol(path)

    _first_failed: dict = {}

    def _check_write(self, path: str) -> None:
        faults = _faults()
        step = _step_of(path)
        if step is None:
            return
        delay = float((faults.get("slow_writes") or {}).get(str(step), 0)) if _SLOWED else 0.0
        if delay:
            import time

            marker = faults.get("marker")
            if marker and not os.path.exists(marker):
                open(marker, "w").close()
            time.sleep(delay)
        if step in (faults.get("enospc_steps") or []):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        first = int((faults.get("enospc_first") or {}).get(str(step), 0))
        if FaultyFileSystem._first_failed.get(step, 0) < first:
            FaultyFileSystem._first_failed[step] = FaultyFileSystem._first_failed.get(step, 0) + 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    _reads_failed = 0

    def _check_read(self, path: str) -> None:
        step = _step_of(path, inside=True)
        delay = float((_faults().get("slow_reads") or {}).get(str(step), 0)) if step is not None else 0.0
        if delay:
            import time

            marker = _faults().get("marker")
            if marker and not os.path.exists(marker):
                open(marker, "w").close()
            time.sleep(delay)
        budget = _faults().get("read_errors", 0)
        if (
            budget
            and step is not None
            and _faults().get("read_match", "") in str(path)
            and (budget < 0 or FaultyFileSystem._reads_failed < budget)
        ):
            FaultyFileSystem._reads_failed += 1
            raise OSError(errno.EIO, "injected read error (BATON_TEST_FAULTS read_errors)", str(path))

    def _open(self, path, mode="rb", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            self._check_write(path)
        else:
            self._check_read(path)
        return super()._open(path, mode, *args, **kwargs)

    def cat_file(self, path, *args, **kwargs):
        self._check_read(path)
        return super().cat_file(path, *args, **kwargs)

    def get_file(self, rpath, lpath, *args, **kwargs):
        self._check_read(rpath)
        return super().get_file(rpath, lpath, *args, **kwargs)

    def pipe_file(self, path, value, *args, **kwargs):
        self._check_write(path)
        return super().pipe_file(path, value, *args, **kwargs)

    def put_file(self, lpath, rpath, *args, **kwargs):
        self._check_write(rpath)
        return super().put_file(lpath, rpath, *args, **kwargs)


register_implementation("faulty", FaultyFileSystem, clobber=True)

# The trainer's test seams (seams.py), installed only when a test asks for one: this file is loaded by
# every process on the test's PYTHONPATH, the pod's PID 1 and a user's script (beside a trainer.py of its
# own) included, and it must import nothing of baton's for them.
if any(
    os.environ.get(v)
    for v in (
        "BATON_PAUSE_AFTER_STEP",
        "BATON_TEST_HANG_AFTER_STEP",
        "BATON_TEST_DISAGREE_AFTER_STEP",
        "BATON_NOISE",
    )
):
    import seams  # noqa: F401 - installs them
