"""The checksums of a checkpoint's files: which algorithm, how it is computed, how an entry names it.

A manifest entry is `{"size": N, ALGORITHM: HEX}` with exactly one algorithm of `ALGORITHMS`:

- `crc32c` (the `crc32c` package, hardware-accelerated; GCS's own object checksum): the data files by default,
  the algorithm the bench picked (docs/results.md: several times the speed of sha256, above the disk).
  It finds torn, truncated and flipped files; it is no defence against a forger, who can make a file of
  the same size match it, which is why it is never used for `.metadata`.
- `sha256`: `.metadata` (unpickled, under an allowlist, once it matches) and every checkpoint written
  before the algorithm was recorded; still read.
- `blake3`: cryptographic and multi-threaded, for data files (`checkpoint.digest: blake3`) where a
  forged file must be caught too.

`_COMMIT` holds the SHA-256 of manifest.json, whatever the files use. An entry with no algorithm, more
than one, or one not listed here is refused.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Protocol

from trainer.untrusted import open_regular

ALGORITHMS = ("crc32c", "sha256", "blake3")
CRYPTOGRAPHIC = ("sha256", "blake3")
DATA_DEFAULT = "crc32c"
METADATA = "sha256"
CHUNK = 8 << 20
_HEX_DIGITS = {"crc32c": 8, "sha256": 64, "blake3": 64}
_HEX = {a: re.compile(f"[0-9a-f]{{{n}}}") for a, n in _HEX_DIGITS.items()}
_NOT_ALGORITHMS = ("size", "hashed")


class Hasher(Protocol):
    def update(self, data: Any) -> None: ...

    def hexdigest(self) -> str: ...


class _Crc32c:
    """CRC-32C through the `crc32c` package: it takes any buffer (a memoryview of a tensor's bytes, as the
    load reads them) without copying it, and releases the GIL over large ones, so the writer and reader
    threads hash side by side. google-crc32c took only `bytes`: every other buffer was copied first,
    which at 0.5 GB took longer than the checksum itself (docs/results.md, 2026-12-05)."""

    def __init__(self) -> None:
        import crc32c

        self._c = crc32c.CRC32CHash()

    def update(self, data: Any) -> None:
        self._c.update(data)

    def hexdigest(self) -> str:
        return self._c.hexdigest()


def new(algorithm: str) -> Hasher:
    """A running checksum of `algorithm` (one of ALGORITHMS)."""
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm == "crc32c":
        return _Crc32c()
    if algorithm == "blake3":
        import blake3

        return blake3.blake3(max_threads=blake3.blake3.AUTO)
    raise ValueError(f"unknown checksum algorithm {algorithm!r}")


def of_bytes(algorithm: str, data: Any) -> str:
    h = new(algorithm)
    h.update(data)
    return h.hexdigest()


def for_file(name: str, data_algorithm: str) -> str:
    """The algorithm a file is written with: `.metadata` (and DCP's `.metadata.tmp` on its way there)
    always cryptographic, since it is unpickled; the data files with `data_algorithm`."""
    return METADATA if name.startswith(".metadata") else data_algorithm


def entry(size: int, algorithm: str, hexdigest: str) -> dict[str, Any]:
    return {"size": size, algorithm: hexdigest}


class BadChecksum(ValueError):
    """A manifest entry whose checksum cannot be used (layout.py turns it into a CorruptCheckpoint)."""


def expected(meta: dict[str, Any], what: str) -> tuple[str, str]:
    """(algorithm, hex) of a manifest entry; BadChecksum for none, several, an unknown one, or a value
    that is not that algorithm's hex."""
    named = [k for k in meta if k not in _NOT_ALGORITHMS]
    unknown = [k for k in named if k not in ALGORITHMS]
    if unknown:
        raise BadChecksum(
            f"{what} names an unknown checksum algorithm {str(unknown[0])[:40]!r} "
            f"(known: {', '.join(ALGORITHMS)})"
        )
    if len(named) != 1:
        raise BadChecksum(
            f"{what} must have exactly one checksum ({', '.join(ALGORITHMS)}), has {len(named)}"
        )
    algorithm = named[0]
    value = meta[algorithm]
    if not isinstance(value, str) or not _HEX[algorithm].fullmatch(value):
        raise BadChecksum(f"{what}: {algorithm!r} is not {_HEX_DIGITS[algorithm]} lowercase hex digits")
    return algorithm, value


def file_hexdigest(fs: Any, path: str, algorithm: str, max_bytes: int | None = None) -> str:
    """The checksum of a file on any fsspec filesystem (None: a local path, with Python's own open). On a
    filesystem the file must be a regular one (untrusted.open_regular: a planted FIFO would block the
    read for ever). With `max_bytes` (the size a manifest declares), at most one byte more is read: a
    longer file then fails its checksum without being read whole."""
    h = new(algorithm)
    left = max_bytes + 1 if max_bytes is not None else None
    with open_regular(fs, path) if fs is not None else open(path, "rb") as f:
        while left is None or left > 0:
            chunk = f.read(CHUNK if left is None else min(CHUNK, left))
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
    return h.hexdigest()
