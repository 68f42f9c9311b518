"""Reading a checkpoint: `.metadata` without arbitrary unpickling, and a load that verifies every
file's checksum while DCP reads it, so that a restart reads the checkpoint once.

`load_flat` reads a whole checkpoint without a process group (compare).

`VerifyingReader` is DCP's fsspec reader with two changes:
- `.metadata` is read under an allowlist (`SafeReader`) and checked against the manifest's (cryptographic) checksum;
- in `prepare_global_plan` (the coordinator, which sees every rank's plan) each data file is given to
  exactly one rank to hash: the rank that reads the most bytes of it, or rank 0 for a file nobody
  reads. That rank streams the whole file in order, hashing every byte, and deserializes the items it
  needs on the way; the other ranks read only their items. A file whose checksum differs from the
  manifest raises CorruptCheckpoint, which DCP turns into a CheckpointException on every rank.

The hash of a file is known only after its last byte, so items of a corrupt file have been copied
into the load's target by then: the target must be a staging copy, never the live model or optimizer
(`resolve.resolve_and_load` allocates one and hands it out only after the load succeeded on every
rank).
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import IO, Any, cast

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

import trainer.checkpoint.digest as digest
import trainer.checkpoint.tensor_record as tensor_record
from trainer.checkpoint.layout import CorruptCheckpoint, checksum, plain_name
from trainer.storage import storage_options, url_to_fs
from trainer.untrusted import CAPS, Refused, open_regular, read_bytes

_HASH_CHUNK = digest.CHUNK


# ---- .metadata without arbitrary unpickling ---------------------------------------------------------

# Exactly what a DCP `.metadata` of tensors holds (read off real ones, torch 2.11-2.13): its dataclasses,
# the memory-format enum, torch.Size and dtypes, and `_get_layout` (a lookup of torch's layouts by name).
# No callable that reaches attributes or modules (getattr, pathlib's classes): with those, a chain of
# allowed names gets from a class to its module's globals and on to os.system. `builtins.getattr` stands only
# for _enum_member, which names a member of an allowed enum (Python 3.11.0-3.11.2 pickle enums through it).
_ALLOWED_GLOBALS = (
    {
        ("torch.distributed.checkpoint.metadata", n)
        for n in (
            "Metadata",
            "TensorStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
            "BytesStorageMetadata",
        )
    }
    | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),
        ("torch", "Size"),
    }
    | {
        ("torch", n)
        for n in (
            "float32",
            "float64",
            "float16",
            "bfloat16",
            "int64",
            "int32",
            "int16",
            "int8",
            "uint8",
            "bool",
            "complex64",
            "complex128",
        )
    }
)


def _allowed_enums() -> frozenset[Any]:
    from enum import Enum

    from torch.distributed.checkpoint import metadata

    return frozenset(
        getattr(metadata, n)
        for m, n in _ALLOWED_GLOBALS
        if m == metadata.__name__
        and isinstance(getattr(metadata, n), type)
        and issubclass(getattr(metadata, n), Enum)
    )


_ALLOWED_ENUMS = _allowed_enums()
"""The enum classes among the allowed names (the memory-format encoding): the only classes getattr may name."""


def _enum_member(cls: Any, name: Any) -> Any:
    """What `builtins.getattr` may do in `.metadata`, and nothing else: name a member of an allowed enum. Python
    3.11.0 to 3.11.2 (Debian bookworm's 3.11.2 among them: baton's image) pickle an enum member as
    getattr(cls, name), where other versions write cls(value); the real getattr would reach any attribute."""
    allowed = cls in _ALLOWED_ENUMS and isinstance(name, str) and name in cls.__members__
    if not allowed:
        raise CorruptCheckpoint(
            f".metadata uses getattr on {getattr(cls, '__qualname__', type(cls).__name__)}"
            f".{str(name)[:60]}, which is no member of an enum a DCP checkpoint holds"
        )
    return cls.__members__[name]


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if (module, name) not in _ALLOWED_GLOBALS:
            raise CorruptCheckpoint(
                f".metadata references {module}.{name}, which a DCP checkpoint never needs"
            )
        return super().find_class(module, name)


class SafeReader(FsspecReader):
    """DCP's fsspec reader, with `.metadata` read under an allowlist instead of plain `pickle.load`, and
    every file opened only if it is a regular one (trainer/untrusted.py), `.metadata` under a cap."""

    def _check_metadata(self, raw: bytes) -> None:
        """Hook: VerifyingReader checks the bytes against the manifest."""

    def _metadata_cap(self) -> int:
        """The most bytes `.metadata` may have (VerifyingReader: the size its manifest declares)."""
        return CAPS["metadata"]

    @contextmanager
    def _open(self, path: str) -> Iterator[IO[bytes]]:
        """A checkpoint file for reading: CorruptCheckpoint unless it is a regular file (a planted FIFO
        would block the read for ever)."""
        try:
            with open_regular(self.fs.fs, str(path), str(path).rsplit("/", 1)[-1]) as f:
                yield f
        except Refused as e:
            raise CorruptCheckpoint(str(e)) from None

    def read_metadata(self, *args: Any, **kwargs: Any):
        from torch.distributed.checkpoint.metadata import StorageMeta

        try:
            raw = read_bytes(
                self.fs.fs,
                str(self._get_metadata_path(kwargs.get("rank"))),
                "metadata",
                ".metadata",
                cap=self._metadata_cap(),
            )
        except Refused as e:
            raise CorruptCheckpoint(str(e)) from None
        self._check_metadata(raw)
        try:
            metadata = _MetadataUnpickler(io.BytesIO(raw)).load()
        except CorruptCheckpoint:
            raise
        except Exception as e:
            raise CorruptCheckpoint(f".metadata does not parse: {str(e)[:200]}") from None
        _check_shape(metadata)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _check_shape(md: Any) -> None:
    """The unpickled .metadata has the types DCP's reader goes on to use, and every file it points at is
    a plain name inside the checkpoint folder (a relative_path of `../x` would read outside it)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata

    if not isinstance(md, Metadata) or not isinstance(md.state_dict_metadata, dict):
        raise CorruptCheckpoint(".metadata does not hold DCP metadata")
    storage = md.storage_data if md.storage_data is not None else {}
    if not isinstance(storage, dict):
        raise CorruptCheckpoint(".metadata's storage_data is not a mapping")
    for info in storage.values():
        if not isinstance(info, _StorageInfo):
            raise CorruptCheckpoint(".metadata's storage_data holds something other than file locations")
        plain_name(info.relative_path, ".metadata")
        if info.transform_descriptors:  # DCP's stream extensions (zstd): inflation to no declared limit
            raise CorruptCheckpoint(
                f".metadata declares transforms {list(info.transform_descriptors)[:4]!r} on "
                f"{info.relative_path}; baton writes none"
            )
        for n in (info.offset, info.length):
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise CorruptCheckpoint(".metadata holds a file offset or length that is not a count")


# ---- hashing while loading ------------------------------------------------------------------------------


class VerifyingReader(SafeReader):
    """A SafeReader that checks every file of the checkpoint against `files` (the manifest's
    {name: {size, ALGORITHM: hex}}) while it loads, hashing each file once with its entry's algorithm,
    on `threads` threads per rank.
    `hashed` names the files this rank verified (rank 0 also counts .metadata)."""

    def __init__(self, path: str, files: dict[str, dict[str, Any]], threads: int = 1, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.files = files
        self.threads = max(1, threads)
        self.hashed: set[str] = set()
        # Items loaded by each path: `direct` (read into the target: one copy), `buffered` (read into memory,
        # then copied into the target: two), `torch_load` (three: bytes, torch.load's storage, the target).
        self.copies: Counter[str] = Counter()
        self._copies_lock = threading.Lock()

    def _metadata_cap(self) -> int:
        want = self.files.get(".metadata")
        size = want.get("size") if isinstance(want, dict) else None
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise CorruptCheckpoint("manifest lists no .metadata with a size")
        return min(size, CAPS["metadata"])

    def _check_metadata(self, raw: bytes) -> None:
        want = self.files.get(".metadata")
        if not isinstance(want, dict):
            raise CorruptCheckpoint("manifest lists no .metadata")
        algorithm, hexdigest = checksum(want, "manifest entry '.metadata'")
        if algorithm not in digest.CRYPTOGRAPHIC:  # it is unpickled next: a forger must not match its check
            raise CorruptCheckpoint(
                f"manifest entry '.metadata': {algorithm} is not accepted (only "
                f"{', '.join(digest.CRYPTOGRAPHIC)})"
            )
        if len(raw) != want.get("size") or digest.of_bytes(algorithm, raw) != hexdigest:
            raise CorruptCheckpoint(f".metadata fails its {algorithm} checksum")
        self.hashed.add(".metadata")

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """Each data file to exactly one rank for hashing: the one that reads most of it."""
        plans = super().prepare_global_plan(plans)
        read: dict[str, list[int]] = {n: [0] * len(plans) for n in self.files if n != ".metadata"}
        for r, plan in enumerate(plans):
            for item in plan.items:
                info = self.storage_data[item.storage_index]
                if info.relative_path not in read:
                    raise CorruptCheckpoint(
                        f"{info.relative_path} is listed in .metadata but not in the manifest"
                    )
                read[info.relative_path][r] += info.length
        owner: dict[int, list[str]] = {r: [] for r in range(len(plans))}
        for name, per_rank in sorted(read.items()):
            owner[max(range(len(plans)), key=lambda r: (per_rank[r], -r))].append(name)
        return [dataclasses.replace(p, storage_data={"hash": owner[r]}) for r, p in enumerate(plans)]

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        mine = set((plan.storage_data or {}).get("hash", []))
        per_file: dict[str, list[ReadItem]] = {name: [] for name in mine}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        jobs = sorted(per_file.items())

        def one(job: tuple[str, list[ReadItem]]) -> None:
            name, reqs = job
            if name in mine:
                self._read_hashing(name, reqs, planner)
            else:
                self._read_items(name, reqs, planner)

        if self.threads > 1 and len(jobs) > 1:
            with ThreadPoolExecutor(
                min(self.threads, len(jobs)), thread_name_prefix="baton-ckpt-read"
            ) as pool:
                list(pool.map(one, jobs))
        else:
            for job in jobs:
                one(job)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _by_item(self, reqs: list[ReadItem]) -> list[tuple[Any, list[ReadItem]]]:
        """Requests grouped by the stored item they read, in file order (an item may serve several)."""
        groups: dict[Any, list[ReadItem]] = {}
        for req in reqs:
            groups.setdefault(req.storage_index, []).append(req)
        return sorted(((self.storage_data[k], v) for k, v in groups.items()), key=lambda g: g[0].offset)

    def _read_hashing(self, name: str, reqs: list[ReadItem], planner: LoadPlanner) -> None:
        want = self.files[name]
        algorithm, hexdigest = checksum(want, f"manifest entry {name!r}")
        sha, pos = digest.new(algorithm), 0
        with self._open(self.fs.concat_path(self.path, name)) as stream:
            fd = _descriptor(stream)

            def take(n: int, keep: bool) -> bytes:
                nonlocal pos
                parts = []
                while n > 0:
                    chunk = stream.read(min(n, _HASH_CHUNK) if not keep else n)
                    if not chunk:
                        raise CorruptCheckpoint(f"{name} ends at byte {pos}, before the items it should hold")
                    sha.update(chunk)
                    pos += len(chunk)
                    n -= len(chunk)
                    if keep:
                        parts.append(chunk)
                return b"".join(parts) if keep else b""

            def take_into(view: memoryview) -> None:
                """Read straight into `view` (the target tensor's bytes), hashing what lands there."""
                nonlocal pos
                done = 0
                while done < len(view):
                    got = stream.readinto(view[done : done + _HASH_CHUNK])
                    if not got:
                        raise CorruptCheckpoint(f"{name} ends at byte {pos}, before the items it should hold")
                    sha.update(view[done : done + got])
                    pos += got
                    done += got

            for info, group in self._by_item(reqs):
                if info.offset < pos:
                    raise CorruptCheckpoint(f"{name}: items overlap at byte {info.offset}")
                take(info.offset - pos, keep=False)
                if fd is not None and self._direct(fd, name, info, group, planner, take, take_into):
                    continue
                data = take(info.length, keep=True)
                for req in group:
                    self._deliver(req, info, data, planner)
            # The rest, but never more than one byte past the size the manifest declares.
            while pos <= want["size"] and (chunk := stream.read(min(_HASH_CHUNK, want["size"] + 1 - pos))):
                sha.update(chunk)
                pos += len(chunk)
        if pos != want["size"]:
            raise CorruptCheckpoint(f"{name} has {pos} bytes, the manifest says {want['size']}")
        if sha.hexdigest() != hexdigest:
            raise CorruptCheckpoint(f"{name} fails its {algorithm} checksum")
        self.hashed.add(name)

    def _direct(
        self,
        fd: int,
        name: str,
        info: Any,
        group: list[ReadItem],
        planner: LoadPlanner,
        take: Callable[[int, bool], bytes],
        take_into: Callable[[memoryview], None],
    ) -> bool:
        """One item read from the hashed stream (at its first byte) straight into its target: its
        central directory is read first without moving the stream (pread), then everything up to the
        storage record is read and kept, and the record itself lands in the target. False (nothing
        read) when the item is not the plain kind; an item found not plain after its head was read is
        finished through torch.load, so nothing is read twice."""
        target = self._whole_target(info, group, planner)
        if target is None:
            return False
        central = _pread_central(fd, info.offset, info.length)
        head_len = tensor_record.header_end(central) if central is not None else None
        if central is None or head_len is None:
            return False
        head = take(head_len, True)
        start = tensor_record.storage_start(head, central)
        if start is not None and head_len < start <= central[0]:
            head += take(start - head_len, True)
        record = tensor_record.locate(head, central, target) if start is not None else None
        if record is None:  # finish this item the slow way, with the bytes already read
            data = head + take(info.length - len(head), True)
            for req in group:
                self._deliver(req, info, data, planner)
            return True
        if record.size:
            take_into(memoryview(_byte_view(target)))
        rest = take(info.length - record.start - record.size, True)
        # The central directory parsed above was read apart from the hashed stream: it must be what the
        # stream then held, or the checksum would not cover what placed the record.
        cd_at = central[0] - record.start - record.size
        if os.pread(fd, info.length - central[0], info.offset + central[0]) != rest[cd_at:]:
            raise CorruptCheckpoint(f"{name} changed while it was read")
        planner.commit_tensor(group[0], target)
        self._count("direct")
        return True

    def _count(self, path: str) -> None:
        with self._copies_lock:  # the files are read on several threads
            self.copies[path] += 1

    def _whole_target(self, info: Any, group: list[ReadItem], planner: LoadPlanner) -> torch.Tensor | None:
        """The target of an item read whole by one plain tensor request (no resharding, no transform)."""
        if len(group) != 1 or info.transform_descriptors:
            return None
        req = group[0]
        if req.type != LoadItemType.TENSOR or any(req.storage_offsets):
            return None
        target = planner.resolve_tensor(req).detach()  # already narrowed to the request's part
        if type(target) is not torch.Tensor or not target.is_contiguous() or target.device.type != "cpu":
            return None  # a DTensor, a strided view, a GPU tensor: torch.load's path
        return target

    def _read_items(self, name: str, reqs: list[ReadItem], planner: LoadPlanner) -> None:
        with self._open(self.fs.concat_path(self.path, name)) as stream:
            for info, group in self._by_item(reqs):
                stream.seek(info.offset)
                data = stream.read(info.length)
                if len(data) != info.length:
                    raise CorruptCheckpoint(f"{name} ends before byte {info.offset + info.length}")
                for req in group:
                    self._deliver(req, info, data, planner)

    def _deliver(self, req: ReadItem, info: Any, data: bytes, planner: LoadPlanner) -> None:
        """What FileSystemReader.read_data does with one item's bytes (torch 2.13), but for a plain whole
        tensor the record's bytes are copied from `data` into the target, without torch.load."""
        target = self._whole_target(info, [req], planner)
        if target is not None:
            central = tensor_record.read_central(lambda n: data[len(data) - n :], len(data))
            record = tensor_record.locate(data, central, target) if central is not None else None
            if record is not None:
                if record.size:
                    _byte_view(target)[:] = memoryview(data)[record.start : record.start + record.size]
                planner.commit_tensor(req, target)
                self._count("buffered")
                return
        if req.type == LoadItemType.BYTE_IO:  # no transform: _check_shape refused every one
            planner.load_bytes(req, io.BytesIO(data))
            self._count("bytes")
            return
        why = tensor_record.bytes_problem(data)
        if why is not None:  # refused before torch.load would allocate and inflate what it declares
            raise CorruptCheckpoint(f"{info.relative_path}: the item of {req.storage_index.fqn}: {why}")
        tensor = cast(torch.Tensor, torch.load(io.BytesIO(data), map_location="cpu", weights_only=True))
        tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
        target = planner.resolve_tensor(req).detach()
        if target.size() != tensor.size():
            raise CorruptCheckpoint(
                f"{req.storage_index.fqn}: stored {tuple(tensor.size())}, expected {tuple(target.size())}"
            )
        target.copy_(tensor)
        planner.commit_tensor(req, target)
        self._count("torch_load")


def _descriptor(stream: Any) -> int | None:
    """The OS file descriptor under `stream` (a local file), else None: an object store's file would
    have to fetch the central directory apart, a request per item."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    return fd if isinstance(fd, int) and hasattr(stream, "readinto") else None


def _pread_central(fd: int, offset: int, length: int) -> tuple[int, dict] | None:
    """The central directory of the item at `offset` (`length` bytes) of the open file `fd`, read without
    moving the file's position; None unless plain."""
    return tensor_record.read_central(lambda n: os.pread(fd, n, offset + length - n), length)


def _byte_view(target: torch.Tensor) -> Any:
    """A writable array over the bytes of a contiguous CPU tensor (numpy shares its memory)."""
    return target.reshape(-1).view(torch.uint8).numpy()


# ---- a whole checkpoint, without a process group (compare) ----------------------------------------------


def wrapped_failures(e: BaseException) -> list[BaseException]:
    """The ranks' exceptions that DCP's CheckpointException wraps (its `failures`: rank -> (exception,
    traceback), or an object with `exc`), in rank order; [] for any other exception."""
    inners = [
        w[0] if isinstance(w, tuple) else getattr(w, "exc", None)
        for w in (getattr(e, "failures", None) or {}).values()
    ]
    return [x for x in inners if isinstance(x, BaseException)]


def corrupt_reason(e: BaseException) -> str | None:
    """The message of a CorruptCheckpoint, raised directly or by a rank inside DCP's CheckpointException."""
    if isinstance(e, CorruptCheckpoint):
        return str(e)
    return next((str(x) for x in wrapped_failures(e) if isinstance(x, CorruptCheckpoint)), None)


def load_flat(
    url: str,
    files: dict[str, dict[str, Any]] | None = None,
    threads: int = 1,
    copies: Counter[str] | None = None,
) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint, full (unsharded), by flattened key. No process group needed.

    With `files` (its manifest's), `.metadata` is checked against its checksum before it is unpickled and
    every file is hashed while it is read (CorruptCheckpoint on a mismatch); without (a bare DCP folder),
    `.metadata` is still unpickled only under the allowlist. `threads` read files side by side; `copies`
    gets the items each path loaded (VerifyingReader.copies)."""
    # The same private pair that torch's own dcp_to_torch_save uses: the public load() skips an empty dict.
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    reader = (
        VerifyingReader(url, files, threads=threads, **storage_options(url))
        if files is not None
        else SafeReader(url, **storage_options(url))
    )
    # Checked (its checksum first, then the allowlist) here, where its refusal is a CorruptCheckpoint: DCP reports a
    # failure to read .metadata only as text inside an AssertionError.
    reader.read_metadata()
    try:
        _load_state_dict(state, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    except CheckpointException as e:
        reason = corrupt_reason(e)
        if reason is None:
            raise
        raise CorruptCheckpoint(reason) from None
    if copies is not None and isinstance(reader, VerifyingReader):
        copies.update(reader.copies)
    if files is not None:
        unread = sorted(set(files) - reader.hashed)
        fs, path = url_to_fs(url)
        for name in unread:  # a file no item was read from still has to be what the manifest says
            algorithm, hexdigest = checksum(files[name], f"manifest entry {name!r}")
            if (
                digest.file_hexdigest(fs, f"{path.rstrip('/')}/{name}", algorithm, files[name]["size"])
                != hexdigest
            ):
                raise CorruptCheckpoint(f"{name} fails its {algorithm} checksum")
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat[prefix] = node

    walk("", state)
    return flat
