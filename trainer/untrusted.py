"""The one reader for what a bucket, a peer or a trainer's records hold: bounded, and never a traceback.

Everything read from a bucket is untrusted (docs/checkpoints.md, "Untrusted input, and the threat
model"): anyone who can write to it can plant a file of any size, any nesting and any type. Every file that a step or the trainer opens from a bucket
goes through `read_bytes` / `read_json` here, and every message from a peer rank through `parse_json`:

- A local file (`file://` buckets) is opened with O_NOFOLLOW | O_NONBLOCK and checked with fstat on the
  descriptor: only a regular file is read. A FIFO would block open() for ever (and SIGTERM cannot end
  it, PEP 475), a device never ends, and a symbolic link could point anywhere. A stat before the open
  would race with a swap; the descriptor cannot.
- At most `cap` bytes are read, named per kind of file (`CAPS`): a file larger than its cap is refused
  before it is read, never read whole first.
- JSON is nested at most `max_depth` deep (checked before Python's parser sees it, which would raise
  RecursionError, a RuntimeError that callers take for a crash).
- What goes wrong becomes `Refused` (a ValueError), naming the file: RecursionError, MemoryError,
  UnicodeDecodeError, a bad constant, a wrong type. `FileNotFoundError` stays itself (absent is not
  refused), and any other OSError stays an OSError: a store outage is never taken for a refused file,
  and a refused file never for an outage.

Torch-free: steps.train (PID 1) and the steps read through it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

KIB, MIB = 1 << 10, 1 << 20

# The most bytes each kind of file may have. Each is far above what baton writes (the figure in the
# comment) and far below what would hurt a pod's memory.
CAPS: dict[str, int] = {
    "commit": 64 * KIB,  # a DCP _COMMIT: ~150 B
    "manifest": 16 * MIB,  # manifest.json, an HF _COMMIT: ~200 B a file listed
    "attempt": 64 * KIB,  # attempts/<n>.json: ~200 B
    "corpus_header": 1 * MIB,  # the packed corpus's header.json: ~300 B
    "corpus_samples": 64 << 30,  # its samples: read at most the size its header declares
    "weights_manifest": 1 * MIB,  # a model folder's manifest: ~150 B a file
    "trainer_state": 64 * MIB,  # HF trainer_state.json: its log_history grows with the run
    "hf_file": 64 << 30,  # a file of an HF checkpoint: read at most the size its _COMMIT declares
    "round": 64 * KIB,  # steps/lib/group.py's node-I.json: ~200 B
    "step_json": 16 * MIB,  # evictions.json, verify.json, a report.json
    "evidence": 256 * MIB,  # one pod's *.jsonl: ~300 B a step
    "metadata": 256 * MIB,  # DCP's .metadata: ~1 kB a tensor
}
MAX_DEPTH = 32  # baton's own documents nest at most 6 deep
MAX_LINE = 1 * MIB  # one record line of the evidence
MAX_MESSAGE = 64 * MIB  # one message between ranks (trainer/collectives.py)


class Refused(ValueError):
    """A file or message refused as it stands: not a regular file, over its cap, nested too deep, not the
    JSON or the type expected. The message names what was refused and why."""


# ---- opening and reading ----------------------------------------------------------------------------


def _is_local(fs: Any) -> bool:
    """fsspec's own local filesystem, exactly: a subclass (a test seam that injects faults into its
    opens, tests/faultfs) is opened through its own `open`."""
    from fsspec.implementations.local import LocalFileSystem

    return type(fs) is LocalFileSystem


@contextmanager
def open_regular(fs: Any, path: str, what: str | None = None) -> Iterator[IO[bytes]]:
    """`path` on `fs` opened for reading in binary, refused (`Refused`) unless it is a regular file. A
    local file is checked on its descriptor (fstat), after an open that neither follows a symbolic link
    nor blocks on a FIFO; an object store holds nothing else."""
    what = what or path
    if not _is_local(fs):
        with fs.open(path, "rb") as f:
            yield f
        return
    local = fs._strip_protocol(path)
    try:
        fd = os.open(local, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refused(f"{what} is a symbolic link, not a regular file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise Refused(f"{what} is not a regular file ({_kind(mode)})")
        os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"


def size_of(f: IO[bytes]) -> int | None:
    """The size of an open file where it is known without reading it: fstat for a local one, the size
    an object store reported when the file was opened."""
    try:
        return os.fstat(f.fileno()).st_size
    except (AttributeError, OSError, ValueError, NotImplementedError):
        size = getattr(f, "size", None)
        return size if isinstance(size, int) else None


# An object replaced between the open and the read (s3fs's FileExpired: the ETag it opened is gone, errno
# EBUSY). A file that its writer rewrites whole every few seconds (evidence, a round file) meets this on a
# busy store; reading it again gets the new version. Seen on the real control plane: evict's traceback.
REPLACED_RETRIES = 3


def read_bytes(fs: Any, path: str, kind: str, what: str | None = None, cap: int | None = None) -> bytes:
    """The whole of `path`, at most `cap` bytes (default: CAPS[kind]); `Refused` when it is larger or is
    not a regular file. `FileNotFoundError` when absent; another OSError when the store failed. An object
    replaced while it was read is read again (REPLACED_RETRIES times at most)."""
    for attempt in range(REPLACED_RETRIES + 1):
        try:
            return _read_bytes_once(fs, path, kind, what or path, CAPS[kind] if cap is None else cap)
        except OSError as e:
            if e.errno != errno.EBUSY or isinstance(e, FileNotFoundError) or attempt == REPLACED_RETRIES:
                raise
            fs.invalidate_cache(path)
    raise AssertionError("unreachable")


def _read_bytes_once(fs: Any, path: str, kind: str, what: str, cap: int) -> bytes:
    with open_regular(fs, path, what) as f:
        size = size_of(f)
        if size is not None and size > cap:
            raise Refused(
                f"{what} is larger than the {cap} bytes a {kind.replace('_', ' ')} may have ({size})"
            )
        try:
            data = f.read(cap + 1)
        except MemoryError:
            raise Refused(f"{what} could not be held in memory") from None
    if len(data) > cap:
        raise Refused(f"{what} is larger than the {cap} bytes a {kind.replace('_', ' ')} may have")
    return data


# ---- parsing ------------------------------------------------------------------------------------------

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_INNERMOST = re.compile(rb"\[\]|\{\}")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def nesting_at_most(data: bytes, max_depth: int) -> bool:
    """Whether the JSON text `data` nests arrays and objects at most `max_depth` deep. Linear passes in C
    (strings removed, then one pass per level strips the innermost pairs): no recursion, whatever the
    input. Text whose brackets do not pair is left to the parser to refuse."""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    for _ in range(max_depth):
        if not brackets:
            return True
        stripped = _INNERMOST.sub(b"", brackets)
        if stripped == brackets:  # brackets that do not pair: not JSON, which the parser reports
            return True
        brackets = stripped
    return not brackets


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(
    data: bytes | str,
    what: str,
    max_depth: int = MAX_DEPTH,
    allow_nan: bool = False,
    expect: type | tuple[type, ...] | None = None,
) -> Any:
    """`data` parsed as strict JSON (no NaN or Infinity unless `allow_nan`), nested at most `max_depth`
    deep, and of type `expect` where given; `Refused` naming `what` for anything else."""
    try:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        if not nesting_at_most(raw, max_depth):
            raise Refused(f"{what} nests deeper than {max_depth} levels")
        obj = json.loads(raw.decode("utf-8"), **({} if allow_nan else {"parse_constant": _no_constant}))
    except Refused:
        raise
    except (ValueError, UnicodeDecodeError, RecursionError, MemoryError, TypeError) as e:
        raise Refused(f"{what} is not JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if expect is not None and not isinstance(obj, expect):
        names = " or ".join(t.__name__ for t in (expect if isinstance(expect, tuple) else (expect,)))
        raise Refused(f"{what} is not a JSON {_json_name(names)} (a {_json_name(type(obj).__name__)})")
    return obj


def _json_name(py: str) -> str:
    return py.replace("dict", "object").replace("list", "array").replace("str", "string")


def read_json(
    fs: Any,
    path: str,
    kind: str,
    what: str | None = None,
    expect: type | tuple[type, ...] | None = dict,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """`path` read under its kind's cap and parsed by `parse_json` (an object by default)."""
    what = what or path
    return parse_json(read_bytes(fs, path, kind, what), what, max_depth=max_depth, expect=expect)


def read_json_lines(fs: Any, path: str, what: str | None = None) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of a JSON Lines file of records (the evidence), and how many lines were refused
    (over MAX_LINE, not JSON, too deep, not an object). Lines that do not start with `{` are a
    launcher's or a library's output and are skipped without counting. NaN and Infinity are accepted:
    a record may hold them from an older trainer."""
    what = what or path
    data = read_bytes(fs, path, "evidence", what)
    out: list[dict[str, Any]] = []
    refused = 0
    for n, line in enumerate(data.split(b"\n"), 1):
        line = line.strip()
        if not line.startswith(b"{"):
            continue
        if len(line) > MAX_LINE:
            refused += 1
            continue
        try:
            out.append(parse_json(line, f"{what}:{n}", allow_nan=True, expect=dict))
        except Refused:
            refused += 1  # a line cut by a kill mid-write, or planted
    return out, refused


# ---- showing it to a person -------------------------------------------------------------------------------

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` for a terminal: every control character but newline and tab shown escaped (`\\x1b`), so that
    a record's text cannot move the cursor, clear the screen, set the title or hide itself (ANSI/OSC
    escapes, bidi overrides)."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)
