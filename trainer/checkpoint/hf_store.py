"""The Hugging Face Trainer's checkpoints under a root: committed `checkpoint-N/` folders, on any fsspec
store, with a `_COMMIT` manifest written last.

A folder counts as committed only when `_COMMIT` is in it; its body (the manifest) lists every file with
its size and sha256. `commit` mirrors the Trainer's local folder to the root (unless the root is that
folder: committed in place), then writes `_COMMIT`; `fetch` brings the newest committed one back into
the Trainer's folder, every name from `_COMMIT` checked as a plain file name and every file against its
size and sha256, every `.pt`/`.pth` loaded under `weights_only` before the Trainer loads it, and nothing
but the manifest's files left there. The callback that drives it is trainer/hf.py.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from typing import Any

import torch

from trainer.checkpoint.digest import CHUNK, file_hexdigest
from trainer.checkpoint.layout import COMMIT, CorruptCheckpoint, hf_step_name, hf_step_of, parse_hf_commit
from trainer.checkpoint.tensor_record import file_problem
from trainer.nofollow import check_below, open_write, remove
from trainer.records import log
from trainer.storage import full_url, is_local, retrying, storage_error, url_to_fs
from trainer.untrusted import Refused, open_regular, parse_json, read_bytes

# Left out of the manifest and the mirror: it pickles 9 transformers/accelerate classes, holds no
# state that a resume needs (the script builds its own TrainingArguments), and cannot be loaded safely.
SKIPPED_FILES = ("training_args.bin",)


class HFStore:
    """Committed `checkpoint-N/` folders under a root, on any fsspec store.

    A folder counts as committed only when `_COMMIT` is in it; its body lists every file with its size
    and sha256. `local_dir` is where the Trainer writes (`args.output_dir`); when the root is that same
    folder, `_COMMIT` is written in place and nothing is copied."""

    def __init__(self, uri: str, local_dir: str) -> None:
        self.uri = uri
        self.fs, self.base = url_to_fs(uri)
        self.base = self.base.rstrip("/")
        self.local_dir = os.path.abspath(local_dir)
        self.in_place = is_local(self.fs) and os.path.abspath(self.base) == self.local_dir

    def url(self, step: int) -> str:
        return full_url(self.fs, f"{self.base}/{hf_step_name(step)}")

    def committed_steps(self) -> list[int]:
        """Steps with a `_COMMIT`, newest first: one listing of the root, the markers checked per folder.
        Only folders named `checkpoint-` and ASCII digits count, and never a symlink."""
        self.fs.invalidate_cache()
        try:
            entries = self.fs.ls(self.base, detail=True)
        except FileNotFoundError:
            return []
        steps = sorted(
            (
                step
                for e in entries
                if e.get("type") == "directory"
                and not e.get("islink")
                and (step := hf_step_of(e["name"].rstrip("/").rsplit("/", 1)[-1])) is not None
            ),
            reverse=True,
        )
        return [s for s in steps if self.fs.exists(f"{self.base}/{hf_step_name(s)}/{COMMIT}")]

    # -- commit --
    def local_names(self, step: int) -> list[str]:
        """The files of `local_dir/checkpoint-<step>` that a commit lists."""
        src = os.path.join(self.local_dir, hf_step_name(step))
        return sorted(
            n
            for n in os.listdir(src)
            if n != COMMIT and n not in SKIPPED_FILES and os.path.isfile(os.path.join(src, n))
        )

    def upload(self, step: int, names: list[str]) -> dict[str, dict[str, Any]]:
        """Hash `names` of `local_dir/checkpoint-<step>` and copy them to the root (not in place); returns
        their manifest entries. Another node's first rank calls it for its node's files, before the commit."""
        src = os.path.join(self.local_dir, hf_step_name(step))
        files = {
            n: {
                "size": os.path.getsize(os.path.join(src, n)),
                "sha256": file_hexdigest(None, os.path.join(src, n), "sha256"),
            }
            for n in names
        }
        dst = f"{self.base}/{hf_step_name(step)}"
        if not self.in_place:
            if is_local(self.fs) and os.path.islink(
                dst
            ):  # a link in the folder's place is foreign: only it goes
                remove(self.fs, dst)
                log(
                    f"{hf_step_name(step)} was a symbolic link in the store, not a checkpoint: removed the link "
                    "itself (nothing it points to) before the upload"
                )
            for n in names:
                retrying(
                    lambda n=n: _put(self.fs, os.path.join(src, n), f"{dst}/{n}"), self.url(step), "upload"
                )
        return files

    def commit(
        self,
        step: int,
        world_size: int,
        device: str = "cpu",
        other_nodes: dict[str, dict[str, Any]] | None = None,
    ) -> tuple[str, int]:
        """Mirror `local_dir/checkpoint-<step>` (unless in place), then write `_COMMIT` last, listing these
        files and `other_nodes` (entries of files the other nodes uploaded already). Returns (url, bytes)."""
        src = os.path.join(self.local_dir, hf_step_name(step))
        names = self.local_names(step)
        files = self.upload(step, names)
        for n, entry in (other_nodes or {}).items():
            if n in files:
                raise ValueError(f"checkpoint-{step}: {n} was written on node 0 and on another node")
            files[n] = entry
        files = dict(sorted(files.items()))
        manifest = {
            "format": "hf-checkpoint",
            "step": step,
            "world_size": world_size,
            "device": device,
            "files": files,
            "time": round(time.time(), 3),
        }
        dst = f"{self.base}/{hf_step_name(step)}"
        body = json.dumps(manifest, sort_keys=True)
        if self.in_place:  # durable before it claims anything: fsync the files, then the marker
            for n in names:
                fd = os.open(os.path.join(src, n), os.O_RDONLY)
                os.fsync(fd)
                os.close(fd)
            with open_write(self.fs, os.path.join(src, COMMIT), "w") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
        else:

            def write() -> None:
                with open_write(self.fs, f"{dst}/{COMMIT}", "w") as f:
                    f.write(body)

            retrying(write, self.url(step), "commit")
        return self.url(step), sum(v["size"] for v in files.values())

    def retain(self, keep_last: int) -> list[int]:
        """Keep the newest `keep_last` committed checkpoints; `_COMMIT` goes first, so a deletion cut
        short leaves a folder that is passed over, never one that looks complete. Returns the deleted steps."""
        if self.in_place or keep_last <= 0:
            return []  # in place, HF's own save_total_limit rotates
        deleted = []
        for step in self.committed_steps()[keep_last:]:  # real checkpoint-N folders only, never a symlink
            folder = f"{self.base}/{hf_step_name(step)}"
            retrying(lambda folder=folder: remove(self.fs, folder, first=COMMIT), self.url(step), "delete")
            deleted.append(step)
        return sorted(deleted)

    # -- resume --
    def manifest(self, step: int) -> dict[str, Any]:
        """The `_COMMIT` of `step`, checked against its schema: CorruptCheckpoint when malformed (names
        that are not plain file names included)."""
        path = f"{self.base}/{hf_step_name(step)}/{COMMIT}"
        try:
            return parse_hf_commit(
                read_bytes(self.fs, path, "manifest", f"{hf_step_name(step)}/{COMMIT}"), step
            )
        except Refused as e:  # too large, or not a regular file
            raise CorruptCheckpoint(str(e)) from None

    def fetch(self, step: int) -> str:
        """The checkpoint as a local folder the Trainer can resume from, its files checked against the
        manifest. Raises CorruptCheckpoint for what is wrong with the checkpoint (a missing file, a bad
        manifest, a size or sha256 that does not match), StorageError for a read that failed (an I/O
        error, a store answering 5xx after its own retries): that one is worth retrying."""
        try:
            manifest = self.manifest(step)
            files = manifest["files"]
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{COMMIT} is missing") from None
        except CorruptCheckpoint:
            raise
        except Exception as e:
            raise storage_error(self.url(step), "reading", e) from None
        local = os.path.join(self.local_dir, hf_step_name(step))
        if self.in_place:
            # Committed in place: only the manifest's files may be loaded. A file beside them that the
            # commit does not list (an optional scaler.pt of another save) is removed, never used.
            for name in os.listdir(local):
                if name != COMMIT and name not in files:
                    log(f"checkpoint-{step}: removing {name!r}, which its {COMMIT} does not list")
                    _remove(os.path.join(local, name))
        else:
            _remove(local)  # a stale local copy is never trusted
            os.makedirs(local)
            for n, meta in files.items():
                try:
                    _copy_capped(
                        self.fs, f"{self.base}/{hf_step_name(step)}/{n}", os.path.join(local, n), meta["size"]
                    )
                except FileNotFoundError:
                    raise CorruptCheckpoint(f"{n} is missing") from None
                except Refused as e:
                    raise CorruptCheckpoint(str(e)) from None
                except Exception as e:
                    raise storage_error(self.url(step), f"reading {n} of", e) from None
        for n, meta in files.items():
            path = os.path.join(local, n)
            if not os.path.isfile(path):
                raise CorruptCheckpoint(f"{n} is missing")
            try:
                matches = (
                    os.path.getsize(path) == meta["size"]
                    and file_hexdigest(None, path, "sha256") == meta["sha256"]
                )
            except OSError as e:
                raise storage_error(self.url(step), f"reading {n} of", e) from None
            if not matches:
                raise CorruptCheckpoint(f"{n} does not match its size or sha256 in {COMMIT}")
        for n in files:
            if n.endswith((".pt", ".pth", ".bin")):
                _loads_safely(os.path.join(local, n))
            elif n.endswith(
                ".json"
            ):  # the Trainer json.loads these (trainer_state.json): strict and depth-capped here
                try:
                    with open(os.path.join(local, n), "rb") as f:
                        parse_json(f.read(), n)
                except Refused as e:
                    raise CorruptCheckpoint(str(e)) from None
        return local

    def claim_attempt(self) -> int:
        """The next attempt number (one per process start): a listing, then a write. Not fencing,
        only the records' `attempt` field."""
        folder = f"{self.base}/attempts"
        try:
            n = len([p for p in self.fs.ls(folder, detail=False) if p.endswith(".json")]) + 1
        except FileNotFoundError:
            n = 1
        check_below(self.fs, self.base, folder)
        with open_write(self.fs, f"{folder}/{n:08d}-{uuid.uuid4().hex[:8]}.json", "w") as f:
            f.write(json.dumps({"attempt": n, "time": time.time(), "pid": os.getpid()}))
        return n


def _put(fs: Any, src: str, dst: str) -> None:
    """The local file `src` copied to the store's `dst`: on a local store never through a link."""
    if not is_local(fs):
        fs.put_file(src, dst)
        return
    with open(src, "rb") as fin, open_write(fs, dst) as fout:
        shutil.copyfileobj(fin, fout, CHUNK)


def _copy_capped(fs: Any, src: str, dst: str, size: int) -> None:
    """Copy `src` to the local `dst`: only from a regular file (untrusted.open_regular), and never more
    than one byte past the `size` its manifest declares (the check after it then refuses the copy)."""
    left = size + 1
    with open_regular(fs, src, src.rsplit("/", 1)[-1]) as fin, open(dst, "wb") as fout:
        while left > 0 and (chunk := fin.read(min(CHUNK, left))):
            fout.write(chunk)
            left -= len(chunk)


def _remove(path: str) -> None:
    """A file, a folder or a symlink (the link itself, never what it points to)."""
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def _loads_safely(path: str) -> None:
    """A `.pt`/`.pth` the Trainer will `torch.load` must load under `weights_only` with the globals HF
    allows (its RNG file holds numpy arrays); mapped, not read. The Trainer loads them that way too, but
    a refusal there would end the run: here it is a refused checkpoint, and the resume falls back."""
    from transformers.trainer_pt_utils import safe_globals

    why = file_problem(path)
    if why is not None:  # before torch.load would inflate what its records declare
        raise CorruptCheckpoint(f"{os.path.basename(path)} cannot be loaded safely: {why}")
    try:
        with safe_globals():
            torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 - every refusal of the safe unpickler, and torn archives
        raise CorruptCheckpoint(
            f"{os.path.basename(path)} cannot be loaded safely: "
            f"{str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"
        ) from None
