"""Where a tensor's bytes lie inside one DCP item, so that a load copies them once, into their target.

DCP writes each tensor item with `torch.save`: a small zip archive of stored (uncompressed) records,
`<prefix>/data.pkl` (the tensor's dtype, shape, strides and storage key), `<prefix>/byteorder` and
`<prefix>/data/0` (the storage's raw bytes), then the central directory, torch's zip64 end records and
the end-of-central-directory record. `torch.load` of an item copies its bytes twice more (into a new
storage, then DCP's `copy_` into the target); with the record's place known, the load reads the raw
bytes straight into the target tensor (read.VerifyingReader).

Every byte here is untrusted (docs/checkpoints.md, Untrusted input): each offset and length is
bounds-checked before it is used, the central directory is capped at `MAX_ENTRIES` entries and
`data.pkl` at `MAX_PICKLE` bytes, and `data.pkl` is read by torch's own weights-only unpickler with its
storage bound to a `meta` device (no memory, no data). Anything that is not exactly the simple layout
(compression, zip64 sizes, more than one storage, a view into a larger storage, strides that are not
contiguous, big-endian bytes, a dtype or shape other than the target's) is `None`: the caller then
loads the item through `torch.load` as before, which is never wrong, only slower.
"""

from __future__ import annotations

import io
import os
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

EOCD = struct.Struct("<IHHHHIIH")  # end of central directory: 22 bytes
CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # a central directory entry: 46 bytes, then its name
LOCAL = struct.Struct("<IHHHHHIIIHH")  # a local file header: 30 bytes, then name and extra
EOCD_SIG, CENTRAL_SIG, LOCAL_SIG = 0x06054B50, 0x02014B50, 0x04034B50
MAX_ENTRIES = 32  # torch.save of one tensor writes 7 records
MAX_CENTRAL = 64 << 10  # its central directory: about 500 bytes
MAX_PICKLE = 64 << 10  # its data.pkl: about 150 bytes
MAX_HEAD = 1 << 20  # the bytes before its storage record: about 600
MAX_TRAILER = 4 << 10  # the bytes from its central directory to its end: the directory, then 98
_ZIP64 = 0xFFFFFFFF  # a 32-bit field that defers to a zip64 extra field: not handled here
ZIP64_LOCATOR = struct.Struct("<IIQI")  # zip64 end of central directory locator: 20 bytes
ZIP64_END = struct.Struct("<IQHHIIQQQQ")  # zip64 end of central directory record: 56 bytes
ZIP64_LOCATOR_SIG, ZIP64_END_SIG = 0x07064B50, 0x06064B50
MAX_ARCHIVE_ENTRIES = 1 << 16  # an optimizer.pt of a large model: a record per state tensor
MAX_ARCHIVE_CENTRAL = 64 << 20


@dataclass(frozen=True)
class Entry:
    """One record of the archive, as its central directory says: its local header's offset and size."""

    header: int
    size: int


@dataclass(frozen=True)
class Record:
    """The storage record of a whole, contiguous tensor: `start` bytes from the item's start, `size` long."""

    start: int
    size: int


def _central_record(buf: bytes | memoryview, pos: int) -> tuple[int, ...]:
    """The fields of the central directory record at `pos` that the readers below use: signature, flags,
    method, compressed and uncompressed sizes, the name's, extra field's and comment's lengths, and the local
    header's offset."""
    f = CENTRAL.unpack_from(buf, pos)
    return f[0], f[3], f[4], f[8], f[9], f[10], f[11], f[12], f[16]


def central_directory(tail: bytes, item_size: int) -> tuple[int, dict[bytes, Entry]] | None:
    """(offset of the central directory, its entries by name) from `tail`: the item's last bytes, at
    least the whole central directory and end records (`central_span` says how many). None unless the
    archive is the plain kind torch.save writes."""
    if item_size < EOCD.size or len(tail) < EOCD.size or len(tail) > item_size:
        return None
    sig, disk, cd_disk, n_disk, n, cd_size, cd_offset, comment = EOCD.unpack_from(tail, len(tail) - EOCD.size)
    if sig != EOCD_SIG or disk or cd_disk or comment or n != n_disk or not 0 < n <= MAX_ENTRIES:
        return None
    if cd_size > MAX_CENTRAL or cd_offset == _ZIP64 or cd_offset + cd_size > item_size - EOCD.size:
        return None
    base = item_size - len(tail)  # the item offset of tail[0]
    if cd_offset < base:
        return None
    entries: dict[bytes, Entry] = {}
    pos = cd_offset - base
    for _ in range(n):
        if pos + CENTRAL.size > len(tail):
            return None
        sig, flags, method, csize, usize, name_len, extra_len, comment_len, header = _central_record(
            tail, pos
        )
        if sig != CENTRAL_SIG or method != 0 or flags & 1 or csize != usize or _ZIP64 in (csize, header):
            return None
        name = bytes(tail[pos + CENTRAL.size : pos + CENTRAL.size + name_len])
        pos += CENTRAL.size + name_len + extra_len + comment_len
        if len(name) != name_len or pos > len(tail) or name in entries:
            return None
        entries[name] = Entry(header, usize)
    return cd_offset, entries


def central_span(last_22: bytes, item_size: int) -> int | None:
    """How many of the item's last bytes to read for `central_directory`, from its last 22; None when
    they are no plain end record."""
    if len(last_22) != EOCD.size:
        return None
    sig, _, _, _, _, cd_size, cd_offset, comment = EOCD.unpack(last_22)
    if sig != EOCD_SIG or comment or cd_size > MAX_CENTRAL or cd_offset + cd_size > item_size - EOCD.size:
        return None
    span = item_size - cd_offset
    # Between the directory and the end record torch writes only its zip64 end record and locator (76
    # bytes): a directory that claims to start far earlier would have the caller read most of the item.
    return span if span <= cd_size + MAX_TRAILER else None


def read_central(
    last: Callable[[int], bytes | memoryview], item_size: int
) -> tuple[int, dict[bytes, Entry]] | None:
    """`central_directory` of an item of `item_size` bytes, where `last(n)` returns its last `n` bytes
    (a slice in memory, a pread on a file): the end record first, then the directory it points at."""
    if item_size < EOCD.size:
        return None
    span = central_span(bytes(last(EOCD.size)), item_size)
    return central_directory(last(span), item_size) if span is not None else None


def _names(entries: dict[bytes, Entry]) -> tuple[bytes, bytes, bytes] | None:
    """The names of data.pkl, byteorder and the one storage record, all under one prefix."""
    pkl = [n for n in entries if n.endswith(b"/data.pkl") and n.count(b"/") == 1]
    if len(pkl) != 1:
        return None
    prefix = pkl[0][: -len(b"data.pkl")]
    storages = [n for n in entries if n.startswith(prefix + b"data/")]
    if storages != [prefix + b"data/0"] or prefix + b"byteorder" not in entries:
        return None
    return pkl[0], prefix + b"byteorder", storages[0]


def header_end(central: tuple[int, dict[bytes, Entry]]) -> int | None:
    """How many of the item's first bytes hold every record before the storage record and its local
    header up to its name (whose extra field's length says where the record begins); None unless
    data.pkl and byteorder come first, as torch.save writes them, within `MAX_HEAD`."""
    cd_offset, entries = central
    found = _names(entries)
    if found is None:
        return None
    pkl_name, order_name, storage_name = found
    end = entries[storage_name].header + LOCAL.size + len(storage_name)
    if any(entries[n].header >= entries[storage_name].header for n in (pkl_name, order_name)):
        return None
    return end if end <= min(cd_offset, MAX_HEAD) else None


def data_start(head: bytes | memoryview, entry: Entry, name: bytes) -> int | None:
    """Where the record `name` begins, from its local header in `head` (the item's first bytes); None
    unless that header is whole in `head` and names the same record."""
    if entry.header + LOCAL.size > len(head):
        return None
    sig, _need, flags, method, _t, _d, _crc, _cs, _us, name_len, extra_len = LOCAL.unpack_from(
        head, entry.header
    )
    at = entry.header + LOCAL.size
    if sig != LOCAL_SIG or method != 0 or flags & 1 or bytes(head[at : at + name_len]) != name:
        return None
    return at + name_len + extra_len


def storage_start(head: bytes | memoryview, central: tuple[int, dict[bytes, Entry]]) -> int | None:
    """Where the storage record begins, from `head` (at least `header_end` bytes)."""
    found = _names(central[1])
    return None if found is None else data_start(head, central[1][found[2]], found[2])


def archive_problem(read_at: Callable[[int, int], bytes | memoryview], size: int) -> str | None:
    """Why torch.load must not open this archive of `size` bytes (`read_at(offset, n)` reads it), or None.

    torch's zip reader (miniz) allocates each record's declared uncompressed size and inflates into it,
    before anything checks that size: a deflated record of zeros declares about 1,000 times its bytes. So
    the central directory is read here as miniz reads it (the end record at the archive's end, the zip64
    end record where its locator points, then every entry in turn: miniz_zip.c,
    mz_zip_reader_read_central_dir, miniz 3.0.2 as torch 2.13 builds it), and the archive is refused
    unless every record is stored as torch.save writes it: not compressed, not encrypted, its two sizes
    equal, all together no larger than the archive. A file that is no zip at all (torch.load's legacy
    format) is refused too: DCP and the Trainer write zip archives only."""
    if size < EOCD.size or bytes(read_at(0, 4)) != struct.pack("<I", LOCAL_SIG):
        return "not a zip archive (torch.save's format)"
    eocd_at = size - EOCD.size
    sig, disk, cd_disk, n_disk, n, cd_size, cd_offset, comment = EOCD.unpack(
        bytes(read_at(eocd_at, EOCD.size))
    )
    if sig != EOCD_SIG or comment:
        return "no end record at the archive's end"
    if eocd_at >= ZIP64_LOCATOR.size + ZIP64_END.size:
        lsig, _ldisk, z64_at, _disks = ZIP64_LOCATOR.unpack(
            bytes(read_at(eocd_at - ZIP64_LOCATOR.size, ZIP64_LOCATOR.size))
        )
        if lsig == ZIP64_LOCATOR_SIG:
            if z64_at > size - ZIP64_END.size:
                return "a zip64 end record outside the archive"
            z64 = ZIP64_END.unpack(bytes(read_at(z64_at, ZIP64_END.size)))
            if z64[0] == ZIP64_END_SIG:  # else miniz keeps the end record's 32-bit fields
                disk, cd_disk, n_disk, n, cd_size, cd_offset = z64[4:]
    if (
        n != n_disk
        or disk
        or cd_disk
        or not 0 < n <= MAX_ARCHIVE_ENTRIES
        or cd_size > MAX_ARCHIVE_CENTRAL
        or cd_size < n * CENTRAL.size
        or cd_offset + cd_size > size
    ):
        return f"a central directory of {n} records and {cd_size} bytes at {cd_offset} does not fit"
    central = bytes(read_at(cd_offset, cd_size))
    pos, declared = 0, 0
    for _ in range(n):
        if pos + CENTRAL.size > len(central):
            return "the central directory ends inside a record"
        sig, flags, method, csize, usize, name_len, extra_len, comment_len, _header = _central_record(
            central, pos
        )
        name = central[pos + CENTRAL.size : pos + CENTRAL.size + name_len].decode("utf-8", "replace")[:80]
        if sig != CENTRAL_SIG:
            return "a central directory record without its signature"
        if method != 0:
            return f"record {name!r} is compressed (method {method}); torch.save stores every record as is"
        if flags & 1:
            return f"record {name!r} is encrypted"
        extra = central[pos + CENTRAL.size + name_len : pos + CENTRAL.size + name_len + extra_len]
        sizes = _zip64_sizes(extra, usize, csize)
        if sizes is None:
            return f"record {name!r} has a malformed zip64 field"
        usize, csize = sizes
        if usize != csize:
            return f"record {name!r} declares {usize} bytes but holds {csize}"
        declared += usize
        pos += CENTRAL.size + name_len + extra_len + comment_len
    if declared > size:
        return f"its records declare {declared} bytes, more than the archive's {size}"
    return None


def bytes_problem(data: bytes | memoryview) -> str | None:
    """`archive_problem` of an archive in memory."""
    return archive_problem(lambda offset, n: data[offset : offset + n], len(data))


def file_problem(path: str) -> str | None:
    """`archive_problem` of a local file, read with pread (only its ends and its central directory)."""
    with open(path, "rb") as f:
        fd = f.fileno()
        return archive_problem(lambda offset, n: os.pread(fd, n, offset), os.fstat(fd).st_size)


def _zip64_sizes(extra: bytes, usize: int, csize: int) -> tuple[int, int] | None:
    """(uncompressed, compressed) sizes of a central record, from its zip64 extra field (0x0001) where a
    32-bit size is 0xFFFFFFFF, in miniz's order; None when that field is missing or short."""
    if _ZIP64 not in (usize, csize):
        return usize, csize
    at = 0
    while at + 4 <= len(extra):
        field, length = struct.unpack_from("<HH", extra, at)
        body = extra[at + 4 : at + 4 + length]
        if len(body) != length:
            return None
        if field == 1:
            values = [int.from_bytes(body[i : i + 8], "little") for i in range(0, len(body) - 7, 8)]
            if usize == _ZIP64:
                if not values:
                    return None
                usize = values.pop(0)
            if csize == _ZIP64:
                if not values:
                    return None
                csize = values.pop(0)
            return usize, csize
        at += 4 + length
    return None


class _MetaUnpickler(torch._weights_only_unpickler.Unpickler):  # type: ignore[name-defined]
    """torch's weights-only unpickler, whose one storage is bound to the meta device: the tensor it
    rebuilds carries the dtype, shape, strides and offset, and no data."""

    def persistent_load(self, pid: object) -> torch.storage.TypedStorage:
        if not isinstance(pid, tuple) or len(pid) != 5:
            raise ValueError("not a storage reference")
        _kind, storage_type, key, _location, numel = pid
        if key != "0" or isinstance(numel, bool) or not isinstance(numel, int) or not 0 <= numel < 1 << 50:
            raise ValueError("not storage 0")
        dtype = (
            storage_type if isinstance(storage_type, torch.dtype) else getattr(storage_type, "dtype", None)
        )
        if not isinstance(dtype, torch.dtype):
            raise ValueError("no dtype")
        untyped = torch.UntypedStorage(numel * torch._utils._element_size(dtype), device="meta")
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)


def describes(pickle_bytes: bytes | memoryview, target: torch.Tensor, size: int) -> bool:
    """Whether `data.pkl` describes exactly `target`'s tensor as a whole, contiguous storage of `size`
    bytes: the same dtype and shape, offset 0, contiguous strides."""
    if len(pickle_bytes) > MAX_PICKLE:
        return False
    try:
        t = _MetaUnpickler(io.BytesIO(bytes(pickle_bytes)), encoding="utf-8").load()
    except Exception:  # noqa: BLE001 - any refusal of the unpickler: the caller's torch.load decides
        return False
    return (
        type(t) is torch.Tensor
        and t.is_meta
        and t.dtype == target.dtype
        and t.size() == target.size()
        and t.storage_offset() == 0
        and t.is_contiguous()
        and t.untyped_storage().nbytes() == size == target.numel() * target.element_size()
    )


def locate(
    head: bytes | memoryview, central: tuple[int, dict[bytes, Entry]], target: torch.Tensor
) -> Record | None:
    """The storage record of `target`'s whole tensor, or None (the caller loads the item through
    torch.load). `head` holds the item's first bytes, at least up to the storage record's first byte."""
    if sys.byteorder != "little" or not target.is_contiguous() or target.device.type != "cpu":
        return None
    cd_offset, entries = central
    found = _names(entries)
    if found is None or header_end(central) is None:
        return None
    pkl_name, order_name, storage_name = found
    storage = entries[storage_name]
    start = data_start(head, storage, storage_name)
    if start is None or start > len(head) or start + storage.size > cd_offset:
        return None
    record: dict[bytes, bytes] = {}
    for name in (pkl_name, order_name):
        at = data_start(head, entries[name], name)
        if at is None or at + entries[name].size > storage.header:
            return None
        record[name] = bytes(head[at : at + entries[name].size])
    if record[order_name] != b"little" or not describes(record[pkl_name], target, storage.size):
        return None
    return Record(start, storage.size)
