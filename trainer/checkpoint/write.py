"""Writing a checkpoint's files: what a save returns, a save in flight, and the hashing on the way.

Every file is hashed as it is written (`HashingFileSystem`, DCP's fsspec filesystem with a hashing
stream), so a save need not read its files back to learn their checksums (digest.py: the data files'
algorithm, `.metadata`'s sha256); `require_written` refuses a save
whose `.metadata` lists items no file holds (DCP's extra writer threads report a failure only to
`threading.excepthook`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as DcpFileSystem

import trainer.checkpoint.digest as digest
from trainer import nofollow
from trainer.checkpoint.layout import name_of
from trainer.records import log
from trainer.storage import is_local


def skip_archive_crc32() -> None:
    """DCP writes each tensor as a `torch.save` archive, and torch.save computes a zip CRC-32 of every
    byte on the way (zlib's, one core): 2.25 GB/s against 6.98 GB/s without it here, the largest part of
    what serializing costs. Every file is checked by its own checksum in the manifest instead (crc32c by
    default, hardware-accelerated), so the writer turns the zip CRC off (`torch.serialization.
    set_crc32_options`; "torch.load will be able to load the file", and archives written with it load
    as before). The setting is per thread (torch's config overrides live in a ContextVar, and a new thread
    starts without them), so it is made in each thread that writes a file: `ArchiveFileSystem.create_stream`."""
    torch.serialization.set_crc32_options(False)


def assert_tensors_only(state: dict[str, Any], prefix: str = "") -> None:
    for k, v in state.items():
        if isinstance(v, dict):
            assert_tensors_only(v, f"{prefix}{k}.")
        elif not isinstance(v, torch.Tensor):
            raise TypeError(f"checkpoint state {prefix}{k} is a {type(v).__name__}; only tensors are saved")


@dataclass
class SaveResult:
    """A committed save, as the `checkpoint` record reports it."""

    step: int
    path: str
    save_ms: float
    bytes: int
    blocking_ms: float = 0.0
    asynchronous: bool = False


@dataclass
class PendingSave:
    """A save whose files are being written (and hashed) while training goes on; committed later."""

    step: int
    path: str
    manifest: dict[str, Any]
    attempt: int
    t0: float
    files: Future  # this rank's {name: {size, ALGORITHM: hex}}, once its upload finished and was read back
    staging: Future | None = None
    blocking_s: float = 0.0
    asynchronous: bool = False
    on_commit: Callable[[SaveResult], None] | None = None


def done(value: Any) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


class HashingStream:
    """A write stream that hashes what goes through it (everything else is the stream's own)."""

    def __init__(self, raw: Any, algorithm: str) -> None:
        self._raw, self._hash, self.size, self.algorithm = raw, digest.new(algorithm), 0, algorithm

    def write(self, data: Any) -> int:
        n = self._raw.write(data)
        view = memoryview(data)
        self._hash.update(view)
        self.size += view.nbytes
        return n

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class ArchiveFileSystem(DcpFileSystem):
    """DCP's fsspec filesystem over the store's fs, whose writer threads skip torch.save's zip CRC-32
    (skip_archive_crc32): what every save writes through. On a local store its files are created and
    renamed through their folder's descriptor, never through a link (trainer/nofollow.py)."""

    def __init__(self, fs: Any) -> None:
        super().__init__()
        self.fs = fs

    @contextmanager
    def create_stream(self, path: Any, mode: str):
        if "w" not in mode or not is_local(self.fs):
            if "w" in mode:
                skip_archive_crc32()  # this thread's torch.save archives go into this stream
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        skip_archive_crc32()
        with nofollow.open_write(self.fs, os.fspath(path), mode) as stream:
            try:
                yield stream
            except BaseException:  # as DCP's own create_stream: no torn file left behind
                with suppress(Exception):
                    nofollow.remove(self.fs, os.fspath(path))
                raise

    def rename(self, path: Any, new_path: Any) -> None:
        nofollow.rename(self.fs, os.fspath(path), os.fspath(new_path))


class HashingFileSystem(ArchiveFileSystem):
    """An ArchiveFileSystem that hashes each file as it is written (the data files with `algorithm`,
    .metadata with sha256): `written` maps a file's name to (bytes, algorithm, hex), .metadata under its
    final name."""

    def __init__(self, fs: Any, algorithm: str) -> None:
        super().__init__(fs)
        self.algorithm = algorithm
        self.written: dict[str, tuple[int, str, str]] = {}

    @contextmanager
    def create_stream(self, path: Any, mode: str):
        with super().create_stream(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            name = name_of(os.fspath(path))
            hashing = HashingStream(stream, digest.for_file(name, self.algorithm))
            yield hashing
        self.written[name] = (hashing.size, hashing.algorithm, hashing.hexdigest())

    def rename(self, path: Any, new_path: Any) -> None:
        super().rename(path, new_path)
        got = self.written.pop(name_of(os.fspath(path)), None)
        if got is not None:
            self.written[name_of(os.fspath(new_path))] = got


def require_written(md: Any) -> None:
    """Refuse a save whose .metadata lists items that no file holds. With thread_count > 1, DCP's
    extra writer threads report a failure only to threading.excepthook: their items are left out of
    storage_data and dcp.save returns as if it had succeeded (torch 2.11 to 2.13)."""
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

    have, items = getattr(md, "storage_data", None), getattr(md, "state_dict_metadata", None)
    if have is None or items is None:
        return
    missing = []
    for fqn, m in items.items():
        keys = (
            [MetadataIndex(fqn, c.offsets) for c in m.chunks]
            if isinstance(m, TensorStorageMetadata)
            else [MetadataIndex(fqn)]
        )
        missing += [fqn for k in keys if k not in have]
    if missing:
        raise OSError(
            f"{len(missing)} saved item(s) were not written, such as {missing[0]!r} "
            "(a checkpoint writer thread failed)"
        )


_previous_thread_hook = threading.excepthook


def writer_thread_hook(args: Any) -> None:
    """One line, not a traceback, for a failure in DCP's writer threads: require_written turns it
    into the save's error, which names the checkpoint."""
    if args.thread is not None and "_write_files_from_queue" in args.thread.name:
        log(f"a checkpoint writer thread failed: {args.exc_type.__name__}: {args.exc_value}")
        return
    _previous_thread_hook(args)
