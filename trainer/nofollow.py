"""Writes, renames and deletes in a local store (file://) that never pass through a symbolic link.

A bucket on a local disk can hold links its writers never made: planted, or copied in with the rest. The
OS, and fsspec's local filesystem over it, follow them: removing `step-N/_COMMIT` where `step-N` is a link
removes the `_COMMIT` of the folder it points to, outside the bucket, and writing `checkpoint-N/x` where
`checkpoint-N` is a link writes outside it. Here a file is written, renamed or removed through its
folder opened with O_NOFOLLOW | O_DIRECTORY (the *at system calls name the file inside that folder), so
a link at either of a path's last two places is refused (LinkRefused) or removed as a link, never
followed; `check_below` refuses a link anywhere between a store's root and a path, for the places above
those two. A folder removed whole goes through shutil.rmtree, which on Linux works on descriptors and
never follows a link inside the folder, nor one put in its place.

Object stores have no links: there each of these is the plain fsspec call.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import IO, Any

from trainer.storage import is_local


class LinkRefused(OSError):
    """A symbolic link where baton was about to write, rename or delete: nothing was done through it."""

    def __init__(self, path: str) -> None:
        super().__init__(
            errno.ELOOP, f"{path} is a symbolic link: baton writes and deletes through no link", path
        )


def _path(fs: Any, path: str) -> str:
    return os.path.abspath(fs._strip_protocol(os.fspath(path)))


@contextmanager
def _folder(path: str) -> Iterator[int]:
    """A descriptor of the folder `path` itself; LinkRefused when it is a symbolic link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
            raise LinkRefused(path) from None
        raise
    try:
        yield fd
    finally:
        os.close(fd)


def check_below(fs: Any, root: str, path: str) -> None:
    """LinkRefused when `path`, or a folder between `root` (the store's root, the user's) and it, is a
    symbolic link. Parts that do not exist yet are fine; only a local store can hold links."""
    if not is_local(fs):
        return
    root, path = _path(fs, root), _path(fs, path)
    rel = os.path.relpath(path, root)
    if rel == "." or rel.startswith(".."):
        return
    at = root
    for part in rel.split(os.sep):
        at = os.path.join(at, part)
        try:
            mode = os.lstat(at).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISLNK(mode):
            raise LinkRefused(at)


@contextmanager
def open_write(fs: Any, path: str, mode: str = "wb") -> Iterator[IO[Any]]:
    """`path` opened for writing (created or truncated); on a local store never through a link: not the
    file's own name, not its folder (created first where missing)."""
    if not is_local(fs):
        with fs.open(path, mode) as f:
            yield f
        return
    folder, name = os.path.split(_path(fs, path))
    os.makedirs(folder, exist_ok=True)
    with _folder(folder) as dfd:
        try:
            fd = os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd
            )
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise LinkRefused(os.path.join(folder, name)) from None
            raise
    with os.fdopen(fd, mode) as f:
        yield f


def rename(fs: Any, src: str, dst: str) -> None:
    """`src` renamed to `dst` in the same folder; on a local store through the folder's descriptor (a link
    named `dst` is replaced, never followed)."""
    if not is_local(fs):
        fs.mv(src, dst)
        return
    (folder, old), (folder2, new) = os.path.split(_path(fs, src)), os.path.split(_path(fs, dst))
    if folder != folder2:
        raise ValueError(f"{src} and {dst} are not in one folder")
    with _folder(folder) as dfd:
        os.rename(old, new, src_dir_fd=dfd, dst_dir_fd=dfd)


def remove(fs: Any, path: str, first: str | None = None) -> str:
    """Remove `path` and what it holds, `first` (a name inside it) before the rest. Returns what it was:
    "link" (a symbolic link: the link itself is removed, nothing it points to), "folder", "file" or
    "absent"."""
    if not is_local(fs):
        if not fs.exists(path):
            return "absent"
        if first is not None:
            with suppress(FileNotFoundError):
                fs.rm(f"{path.rstrip('/')}/{first}")
        with suppress(FileNotFoundError):
            fs.rm(path, recursive=True)
        return "folder"
    local = _path(fs, path)
    try:
        mode = os.lstat(local).st_mode
    except FileNotFoundError:
        return "absent"
    if not stat.S_ISDIR(mode):
        os.unlink(local)
        return "link" if stat.S_ISLNK(mode) else "file"
    if first is not None:
        with _folder(local) as dfd, suppress(FileNotFoundError, IsADirectoryError, PermissionError):
            os.unlink(first, dir_fd=dfd)
    shutil.rmtree(local)  # by descriptors: raises, rather than follows, if a link took the folder's place
    return "folder"
