"""Checkpoints: save, commit, resolve, verify, fall back, retain, fence.

Layout under any fsspec root (file://, s3://, gs://, or a local path):

    <root>/runs/<run_id>/step-<step:08d>/.metadata, __<rank>_<i>.distcp DCP, io_threads files per rank
                                         manifest.json                  step, fingerprint, metrics, files + sha256
                                         _COMMIT                        written last; absent = incomplete
    <root>/runs/<run_id>/attempts/<n:08d>-<token>.json                  one per process start (fencing);
                                                                        <n:08d>.json on gs://

Commit order: every rank writes its DCP files, reads them back and hashes them; rank 0 gathers the
hashes, checks the fencing, writes manifest.json, and writes _COMMIT last (its body holds the
manifest's sha256). So a _COMMIT exists only over files that were all durable and hashed. A
preemption save (`read_back=False`) hashes each file as it is written and checks only its stored
size: inside the grace a full read-back (a download, on an object store) costs too much, and the
load-time verification still catches a store that changed the bytes. Loading verifies sizes and
checksums against the manifest and falls back past anything that fails.

Finding the newest complete checkpoint is one listing request (`Store.committed_steps`), after the
listing caches are dropped. Retention keeps the newest `keep_last` committed checkpoints and the best
one by a metric recorded in the manifest; it runs only after a commit, and every deletion removes
_COMMIT first, so a deletion cut short leaves an incomplete folder, never a complete-looking one.

Asynchronous saves (`Store.save_async`): the state is staged (copied) by `dcp.async_save` on a gloo
group of its own, written and read back in the background, and committed at a later step boundary
(`Store.step_boundary`) once every rank's upload has finished; at most one is in flight, and `drain`
commits it before any synchronous save.

Fencing, and its limits. Each process start claims the next attempt number by listing `attempts/`
and writing its own marker (equal numbers: the smaller token keeps it, the other retries). Before a
save touches the step folder, and again before manifest.json and before _COMMIT, rank 0 lists
`attempts/` and refuses (FencedOut) if a newer attempt exists. This is check-then-act on a store
without compare-and-swap, so it narrows the window without closing it:
- an attempt that claims its number after the older one's last check, but before that older
  one's _COMMIT lands, does not stop that commit (a process stalled in that gap, by GC or a network
  partition, commits late). The commit is still a complete checkpoint of the same run (same
  fingerprint, same step, so the same tensors), and the newer attempt may or may not list it;
- the older attempt's retention, in the same gap, may delete an uncommitted folder that the newer
  attempt is still writing; that save then fails its read-back or, if the files vanish after the
  hashes, its checkpoint fails verification at load and the loader falls back;
- claims rely on the store's read-after-write listing consistency (S3 and GCS have it).
On gs:// the store has a conditional write (GCS `ifGenerationMatch=0`: create only if absent; see
trainer.storage.create_only), and both markers use it: `attempts/<n>.json` is created only if
absent, so two claimants can never both hold one number, and `_COMMIT` is created only if absent, so
a commit marker is never replaced (a second committer of one step gets FencedOut). The check-then-act
gap between the last fence check and _COMMIT remains on every store: closing it would need the
commit itself to be conditional on the attempt (a lease, or a generation-matched write of a shared
object), which neither s3fs nor this layout has.

The state handed to DCP holds tensors only, and `.metadata` is read through an unpickler that admits
DCP's own metadata classes and nothing else, so loading never runs code from the bucket.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as DcpFileSystem
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

from trainer.ckpt_read import CorruptCheckpoint, SafeReader, VerifyingReader
from trainer.faults import collective_timeout, is_peer_failure
from trainer.records import log
from trainer.storage import (
    StorageError,
    create_only,
    create_only_supported,
    describe,
    full_url,
    redact,
    retrying,
    storage_error,
    storage_options,
    url_to_fs,
)

COMMIT = "_COMMIT"
MANIFEST = "manifest.json"
_HASH_CHUNK = 8 << 20


class CheckpointRefused(RuntimeError):
    """A checkpoint that must never be loaded and must not be passed over silently (foreign run)."""


class FencedOut(RuntimeError):
    """A newer attempt of this run exists; this process may no longer commit."""


# ---- collectives that are no-ops on one process -----------------------------------------------------

def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def broadcast(obj: Any) -> Any:
    """Rank 0's value on every rank."""
    if _world() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(obj: Any) -> list[Any]:
    if _world() == 1:
        return [obj]
    out: list[Any] = [None] * _world()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if _world() > 1:
        dist.barrier()


def assert_tensors_only(state: dict[str, Any], prefix: str = "") -> None:
    for k, v in state.items():
        if isinstance(v, dict):
            assert_tensors_only(v, f"{prefix}{k}.")
        elif not isinstance(v, torch.Tensor):
            raise TypeError(f"checkpoint state {prefix}{k} is a {type(v).__name__}; only tensors are saved")


# ---- the store ----------------------------------------------------------------------------------------

@dataclass
class SaveResult:
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
    files: Future  # this rank's {name: {size, sha256}}, once its upload finished and was read back
    staging: Future | None = None
    blocking_s: float = 0.0
    asynchronous: bool = False
    on_commit: Callable[[SaveResult], None] | None = None


def _sha256(fs, path: str) -> str:
    h = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _name(p: str) -> str:
    return p.rstrip("/").split("/")[-1]


def _step_of(name: str) -> int | None:
    digits = name.removeprefix("step-")
    return int(digits) if name.startswith("step-") and digits.isdigit() else None


def _sharing(fs, io: Any) -> Any:
    """Point a DCP fsspec reader or writer at the store's filesystem instead of a new one: a new s3fs
    instance builds a new botocore client, 0.2-0.8 s on every save and load."""
    inner = getattr(io, "fs", None)
    if inner is not None and hasattr(inner, "fs"):
        inner.fs = fs
    return io


def _done(value: Any) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


class _HashingStream:
    """A write stream that hashes what goes through it (everything else is the stream's own)."""

    def __init__(self, raw: Any) -> None:
        self._raw, self._sha, self.size = raw, hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        n = self._raw.write(data)
        view = memoryview(data)
        self._sha.update(view)
        self.size += view.nbytes
        return n

    def hexdigest(self) -> str:
        return self._sha.hexdigest()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class _HashingFileSystem(DcpFileSystem):
    """DCP's fsspec filesystem over the store's fs, hashing each file as it is written:
    `written` maps a file's name to (bytes, sha256), .metadata under its final name."""

    def __init__(self, fs: Any) -> None:
        super().__init__()
        self.fs = fs
        self.written: dict[str, tuple[int, str]] = {}

    @contextmanager
    def create_stream(self, path: Any, mode: str):
        with super().create_stream(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            hashing = _HashingStream(stream)
            yield hashing
        self.written[_name(os.fspath(path))] = (hashing.size, hashing.hexdigest())

    def rename(self, path: Any, new_path: Any) -> None:
        super().rename(path, new_path)
        got = self.written.pop(_name(os.fspath(path)), None)
        if got is not None:
            self.written[_name(os.fspath(new_path))] = got


def _require_written(md: Any) -> None:
    """Refuse a save whose .metadata lists items that no file holds. With thread_count > 1, DCP's
    extra writer threads report a failure only to threading.excepthook: their items are left out of
    storage_data and dcp.save returns as if it had succeeded (torch 2.11 to 2.13)."""
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

    have, items = getattr(md, "storage_data", None), getattr(md, "state_dict_metadata", None)
    if have is None or items is None:
        return
    missing = []
    for fqn, m in items.items():
        keys = [MetadataIndex(fqn, c.offsets) for c in m.chunks] if isinstance(m, TensorStorageMetadata) \
            else [MetadataIndex(fqn)]
        missing += [fqn for k in keys if k not in have]
    if missing:
        raise OSError(f"{len(missing)} saved item(s) were not written, such as {missing[0]!r} "
                      "(a checkpoint writer thread failed)")


_previous_thread_hook = threading.excepthook


def _writer_thread_hook(args: Any) -> None:
    """One line, not a traceback, for a failure in DCP's writer threads: _require_written turns it
    into the save's error, which names the checkpoint."""
    if args.thread is not None and "_write_files_from_queue" in args.thread.name:
        log(f"a checkpoint writer thread failed: {args.exc_type.__name__}: {args.exc_value}")
        return
    _previous_thread_hook(args)


def _reusable(stager: Any) -> bool:
    """Whether a DefaultStager can stage again. Before torch 2.13 (seen in 2.11) its _stage() closes
    the inner StateDictStager after every stage, emptying its copy dispatch: a second stage then fails
    with `KeyError: <class 'type'>`. Such a stager serves one save, and the next save gets a new one."""
    inner = getattr(stager, "_state_dict_stager", None)
    return bool(getattr(inner, "_deepcopy_dispatch", True))


class Store:
    """One run's checkpoints under `<root>/runs/<run_id>`.

    Construction checks the store (one listing), so a bad URI, a missing bucket, missing
    credentials or an unreachable endpoint stop the run at start-up with a StorageError naming the URI.
    """

    def __init__(self, root_uri: str, run_id: str, check: bool = True, io_threads: int = 4) -> None:
        self.root_uri = root_uri
        self.io_threads = io_threads
        threading.excepthook = _writer_thread_hook
        self.fs, root = url_to_fs(root_uri)
        self.run_path = f"{root.rstrip('/')}/runs/{run_id}"
        self.run_id = run_id
        self.pending: PendingSave | None = None
        self._group: Any = None
        self._hasher: ThreadPoolExecutor | None = None
        self._stager: Any = None
        self._manifests: dict[int, dict[str, Any]] = {}
        # The newest step known to be intact as stored: a save that read its files back, or the
        # checkpoint this attempt's resume hashed while loading. Retention never deletes it.
        self.verified_step: int | None = None
        self.unverified_commits = 0  # commits since verified_step that were not read back
        if check:
            self.check()

    def step_path(self, step: int) -> str:
        return f"{self.run_path}/step-{step:08d}"

    def url(self, path: str) -> str:
        return full_url(self.fs, path)

    @contextmanager
    def _io(self, what: str, path: str | None = None):
        """Storage failures (after the client's retries) become a StorageError naming the URI."""
        try:
            yield
        except (CheckpointRefused, CorruptCheckpoint, FencedOut, StorageError):
            raise
        except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
            raise storage_error(self.url(path or self.run_path), what, e) from None

    def check(self) -> None:
        """Fail fast when the store cannot be used: list the run prefix (which needs the endpoint,
        the bucket and the credentials). Nothing is created: a missing bucket is an error, not a
        bucket to make. Local folders are created on the first write."""
        with self._io("checking the checkpoint store"):
            self.committed_steps()

    def _fresh(self) -> None:
        # s3fs and gcsfs cache listings per instance; another process's _COMMIT must be seen.
        self.fs.invalidate_cache()

    def committed_steps(self) -> list[int]:
        """Steps with a _COMMIT, newest first, from exactly one listing request.

        One recursive listing of the keys that start with `<run>/step-` (a glob would list every step
        folder on its own on object stores: one request per checkpoint). It returns up to 1000 keys
        per request, and retention bounds the folders to keep_last + 1 (+ torn ones), each with
        world_size + 3 keys, so it is one request in practice.
        """
        self._fresh()
        steps = []
        with self._io("listing checkpoints under"):
            found = self.fs.find(self.run_path, prefix="step-")
        for p in found:
            parts = p.rstrip("/").split("/")
            if len(parts) >= 2 and parts[-1] == COMMIT and parts[-3:-2] == [_name(self.run_path)]:
                step = _step_of(parts[-2])
                if step is not None:
                    steps.append(step)
        return sorted(set(steps), reverse=True)

    # -- attempts and fencing --
    def _attempts(self) -> list[tuple[int, str]]:
        self._fresh()
        out = []
        try:
            names = self.fs.ls(f"{self.run_path}/attempts", detail=False)
        except FileNotFoundError:
            return []
        for p in names:
            num, _, token = _name(p).removesuffix(".json").partition("-")
            if num.isdigit():
                out.append((int(num), token))
        return sorted(out)

    def _attempt_path(self, n: int, token: str) -> str:
        # `<n>-<token>.json` where claims are list-then-write; `<n>.json`, one name per number, where
        # the store creates it only if absent (gs://).
        return f"{self.run_path}/attempts/{n:08d}{'-' + token if token else ''}.json"

    def attempt_start_times(self) -> list[float]:
        """When each attempt of this run started, oldest first (unreadable records are skipped)."""
        starts = []
        for n, token in self._attempts():
            try:
                with self.fs.open(self._attempt_path(n, token), "r") as f:
                    starts.append(float(json.loads(f.read())["time"]))
            except (OSError, ValueError, KeyError):
                continue
        return sorted(starts)

    def claim_attempt(self, info: dict[str, Any]) -> int:
        """Take the next attempt number. Where the store can create an object only if it is absent
        (gs://), `attempts/<n>.json` is created that way: one claimant gets n, the others move on.
        Elsewhere, two claimants of one number: the smaller token keeps it (a race remains, above)."""
        token = uuid.uuid4().hex[:12]
        if create_only_supported(self.fs):
            return self._claim_create_only(info, token)
        with self._io("claiming an attempt number under"):
            for _ in range(20):
                existing = self._attempts()
                n = (existing[-1][0] + 1) if existing else 1
                path = f"{self.run_path}/attempts/{n:08d}-{token}.json"
                body = json.dumps({**info, "attempt": n, "token": token, "time": time.time()})
                retrying(lambda p=path, b=body: self._write(p, b), self.url(path), "writing")
                rivals = [t for m, t in self._attempts() if m == n]
                if min(rivals) == token:
                    return n
                self.fs.rm(path)
        raise StorageError(f"could not claim an attempt number under {self.url(self.run_path)}")

    def _claim_create_only(self, info: dict[str, Any], token: str) -> int:
        with self._io("claiming an attempt number under"):
            existing = self._attempts()
            n = (existing[-1][0] + 1) if existing else 1
            for _ in range(1000):
                path = self._attempt_path(n, "")
                body = json.dumps({**info, "attempt": n, "token": token, "time": time.time()}).encode()
                if retrying(lambda p=path, b=body: create_only(self.fs, p, b), self.url(path), "writing"):
                    return n
                n += 1  # taken: the next number, without listing again (a listing may lag the create)
        raise StorageError(f"could not claim an attempt number under {self.url(self.run_path)}")

    def newest_attempt(self) -> int:
        with self._io("listing attempts under"):
            existing = self._attempts()
        return existing[-1][0] if existing else 0

    def _fence(self, attempt: int, step: int) -> None:
        newest = self.newest_attempt()
        if newest > attempt:
            raise FencedOut(f"attempt {attempt} may not commit step {step}: attempt {newest} of "
                            f"{self.run_id} has started since (another process now owns this run)")

    def _write(self, path: str, text: str) -> None:
        with self.fs.open(path, "w") as f:
            f.write(text)

    def _write_commit(self, p: PendingSave, commit: str) -> None:
        """_COMMIT, last. On gs:// it is created only if absent: a commit marker, once written, is
        never replaced, so a late writer (a stalled older attempt) cannot swap the manifest a reader
        has verified; finding another writer's marker there is a FencedOut."""
        path = f"{p.path}/{COMMIT}"
        if not create_only_supported(self.fs):
            retrying(lambda: self._write(path, commit), self.url(p.path), "committing")
            return
        if not retrying(lambda: create_only(self.fs, path, commit.encode()), self.url(p.path), "committing"):
            raise FencedOut(f"attempt {p.attempt} may not commit step {p.step}: another writer committed it "
                            f"first ({self.url(path)} exists)")

    # -- save and commit (collective) --
    def save(self, step: int, state: dict[str, Any], manifest: dict[str, Any], attempt: int,
             on_commit: Callable[[SaveResult], None] | None = None, read_back: bool = True) -> SaveResult:
        """Write, verify and commit a checkpoint now (a save in flight commits first).

        `read_back=False` (preemption saves, inside the grace): the files are hashed as they are written
        and only their sizes are checked in the store, instead of reading them all back. A store that
        changed the bytes is then caught when a resume verifies the checkpoint, which falls back to an
        older one: retention deletes nothing after a preemption save, so that one still exists."""
        self.drain()
        res = self._finish(self._start(step, state, manifest, attempt, asynchronous=False, read_back=read_back))
        self._verified(step, read_back)
        if on_commit:
            on_commit(res)
        return res

    def save_async(self, step: int, state: dict[str, Any], manifest: dict[str, Any], attempt: int,
                   on_commit: Callable[[SaveResult], None]) -> float:
        """Stage the state, write it in the background (dcp.async_save on a dedicated gloo group),
        and commit at a later step boundary (`step_boundary`) once every rank's files are written and
        read back. At most one save is in flight: an older one is committed first. Returns the ms
        this call blocked."""
        self.drain()  # that wait counts as the older save's blocking time
        t = time.perf_counter()
        pending = self._start(step, state, manifest, attempt, asynchronous=True)
        pending.on_commit = on_commit
        pending.blocking_s += time.perf_counter() - t
        self.pending = pending
        return pending.blocking_s * 1000

    def before_update(self) -> None:
        """Call before anything mutates the model or optimizer state (the optimizer step): waits until
        the save in flight has staged its copy. The staging copy runs in the background meanwhile, over
        the step's forward and backward passes, which only read that state. That wait counts as the
        save's blocking time."""
        p = self.pending
        if p is None or p.staging is None:
            return
        t = time.perf_counter()
        p.staging.result()
        p.staging = None
        p.blocking_s += time.perf_counter() - t

    def step_boundary(self) -> None:
        """Call at the top of every optimizer step: commits the save in flight if every rank's upload
        has finished. A collective while a save is in flight (all ranks agree on when). Its staging
        copy may still be running: `before_update` waits for it."""
        p = self.pending
        if p is None:
            return
        t = time.perf_counter()
        ready = p.files.done()
        if _world() > 1:
            flag = torch.tensor([1 if ready else 0], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            ready = bool(flag.item())
        p.blocking_s += time.perf_counter() - t
        if ready:
            self._complete(p)

    def drain(self, raise_storage_errors: bool = True) -> str | None:
        """Wait for the save in flight (if any) and commit it. Collective. With
        `raise_storage_errors=False` a failed save is returned as a message instead (a preemption
        still saves its own step); FencedOut is always raised."""
        p = self.pending
        if p is None:
            return None
        t = time.perf_counter()
        with contextlib.suppress(Exception):  # a failure is reported, collectively, by _finish
            p.files.result()
        p.blocking_s += time.perf_counter() - t
        try:
            self._complete(p)
        except StorageError as e:
            if raise_storage_errors:
                raise
            return str(e)
        return None

    def _complete(self, p: PendingSave) -> None:
        self.pending = None
        res = self._finish(p)
        self._verified(p.step, True)  # an async save reads its files back, in the background
        if p.on_commit:
            p.on_commit(res)

    def _verified(self, step: int, verified: bool) -> None:
        if verified:
            self.verified_step, self.unverified_commits = step, 0
        else:
            self.unverified_commits += 1

    def _staging_buffers(self) -> Any:
        # One stager for the whole run: its staging copy (one checkpoint per rank) is allocated once
        # and refilled by later saves, instead of allocated and faulted in on every save (measured in
        # docs/results.md, figure 2). Safe to refill: save_async drains the previous save first.
        if self._stager is not None and not _reusable(self._stager):
            self._stager = None
        if self._stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            # Staged on the stager's own thread, so that the copy overlaps the next step's forward and
            # backward passes (before_update waits for it); into pinned memory where a GPU is (the
            # device-to-host copy goes by DMA). Blocking copies: they queue behind the work already
            # on the stream, so a copy cannot read a parameter that an update still has to write.
            self._stager = DefaultStager(StagingOptions(use_pinned_memory=torch.cuda.is_available(),
                                                        use_shared_memory=False, use_async_staging=True,
                                                        use_non_blocking_copy=False))
        return self._stager

    def _gloo_group(self) -> Any:
        # Created once, by every rank at the same save. dcp.async_save on the default group hangs
        # or mismatches while training uses it; its own gloo group does not.
        if self._group is None:
            # The same bound on a peer as every other collective (trainer/faults.py), not torch's 30 min.
            self._group = (dist.new_group(backend="gloo", timeout=collective_timeout()) if dist.is_initialized()
                           else False)
        return self._group or None

    def _start(self, step: int, state: dict[str, Any], manifest: dict[str, Any], attempt: int,
               asynchronous: bool, read_back: bool = True) -> PendingSave:
        assert_tensors_only(state)
        rank = _rank()
        path = self.step_path(step)
        t0 = time.perf_counter()
        error = None
        if rank == 0:
            try:
                # Fenced before anything is written or deleted: a stale attempt must not remove a
                # folder at this step that the newer attempt may own.
                self._fence(attempt, step)
                self._manifests.pop(step, None)
                with self._io("clearing a leftover folder at", path):
                    if self.fs.exists(path):
                        self._delete(path)  # uncommitted leftover, or a refused one being replaced
            except Exception as e:
                error = _agreed(e)
        _raise_agreed(broadcast(error))
        writer = _sharing(self.fs, FsspecWriter(self.url(path), thread_count=self.io_threads,
                                                **storage_options(self.root_uri)))
        written = None
        if not read_back and not asynchronous:
            writer.fs = _HashingFileSystem(self.fs)
            written = writer.fs.written
        what = f"saving step {step} to"
        if not asynchronous:
            try:
                with self._io(what, path):
                    md = dcp.save(state, storage_writer=writer)
                    _require_written(md)
                files = _done(self._hash_own(path, md, written))
            except Exception as e:
                files = Future()
                files.set_exception(e)
            return PendingSave(step, path, manifest, attempt, t0, files, blocking_s=time.perf_counter() - t0)
        with self._io(what, path):
            resp = dcp.async_save(state, storage_writer=writer, process_group=self._gloo_group(),
                                  async_stager=self._staging_buffers())
        staging, upload = ((resp.staging_completion, resp.upload_completion)
                           if isinstance(resp, AsyncSaveResponse) else (None, resp))
        if self._hasher is None:
            self._hasher = ThreadPoolExecutor(1, thread_name_prefix="baton-ckpt-hash")

        def written_then_hashed() -> dict[str, Any]:
            with self._io(what, path):
                md = upload.result()
                _require_written(md)
            return self._hash_own(path, md)

        return PendingSave(step, path, manifest, attempt, t0, self._hasher.submit(written_then_hashed),
                           staging=staging, asynchronous=True)

    def _hash_own(self, path: str, md: Any, written: dict[str, tuple[int, str]] | None = None) -> dict[str, Any]:
        """Size and sha256 of the files this rank wrote (rank 0 also owns .metadata), read back from
        the store: the manifest describes what is stored, not what was meant to be. With `written`
        (hashed while writing), a file whose stored size matches is not read back."""
        rank = _rank()
        names = sorted({si.relative_path for si in (getattr(md, "storage_data", None) or {}).values()})
        if not names:
            with self._io("listing", path):
                names = sorted(_name(p) for p in self.fs.ls(path, detail=False))
        mine = [n for n in names if n.startswith(f"__{rank}_")]
        if rank == 0:
            mine = [".metadata", *[n for n in names if not n.startswith("__") and n != ".metadata"], *mine]

        def read_back(n: str) -> dict[str, Any]:
            full = f"{path}/{n}"
            with self._io("reading back", full):
                size = self.fs.size(full)
                seen = (written or {}).get(n)
                if seen is not None and seen[0] == size:
                    return {"size": size, "sha256": seen[1], "hashed": "writing"}
                return {"size": size, "sha256": _sha256(self.fs, full)}

        return dict(zip(mine, self._each_file(read_back, mine), strict=True))

    def _each_file(self, fn: Any, names: list[str]) -> list[Any]:
        """`fn` over `names` on up to io_threads threads (hashlib and file reads release the GIL), in
        order; the first error is raised."""
        if self.io_threads <= 1 or len(names) <= 1:
            return [fn(n) for n in names]
        with ThreadPoolExecutor(min(self.io_threads, len(names)), thread_name_prefix="baton-ckpt-io") as pool:
            return list(pool.map(fn, names))

    def _finish(self, p: PendingSave) -> SaveResult:
        """Commit `p` once every rank's files are written and hashed: rank 0 checks the fencing,
        writes manifest.json and then _COMMIT. Collective; every rank raises the same error."""
        t = time.perf_counter()
        rank, world = _rank(), _world()
        try:
            mine, err = p.files.result(), None
        except Exception as e:
            mine, err = {}, _agreed(e)
        parts = gather((mine, err))
        error = next((e for _, e in parts if e), None)
        all_files = {k: v for files, _ in parts for k, v in files.items()}
        save_ms = (time.perf_counter() - p.t0) * 1000
        if rank == 0 and error is None:
            try:
                body = {**p.manifest, "step": p.step, "attempt": p.attempt, "world_size": world,
                        "files": all_files, "save_ms": round(save_ms, 1), "async": p.asynchronous}
                text = json.dumps(body, indent=1, sort_keys=True)
                commit = json.dumps({"step": p.step, "attempt": p.attempt,
                                     "manifest_sha256": hashlib.sha256(text.encode()).hexdigest()})
                self._fence(p.attempt, p.step)
                retrying(lambda: self._write(f"{p.path}/{MANIFEST}", text), self.url(p.path), "writing the manifest of")
                self._fence(p.attempt, p.step)  # the last look before the marker that makes it count
                self._write_commit(p, commit)
                self._manifests[p.step] = body
            except Exception as e:
                error = _agreed(e)
        _raise_agreed(broadcast(error))
        p.blocking_s += time.perf_counter() - t
        return SaveResult(p.step, self.url(p.path), (time.perf_counter() - p.t0) * 1000,
                          sum(f["size"] for f in all_files.values()), p.blocking_s * 1000, p.asynchronous)

    # -- verify and load --
    def read_manifest(self, step: int) -> dict[str, Any]:
        path = self.step_path(step)
        try:
            with self.fs.open(f"{path}/{COMMIT}", "r") as f:
                commit = json.loads(f.read())
            with self.fs.open(f"{path}/{MANIFEST}", "r") as f:
                text = f.read()
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CorruptCheckpoint(f"commit or manifest unreadable: {e}") from e
        except Exception as e:
            raise storage_error(self.url(path), "reading the manifest of", e) from None
        if hashlib.sha256(text.encode()).hexdigest() != commit.get("manifest_sha256"):
            raise CorruptCheckpoint("manifest.json does not match the checksum in _COMMIT")
        return json.loads(text)

    def verify_files(self, step: int, manifest: dict[str, Any], hash_files: bool = True,
                     names: list[str] | None = None) -> None:
        """Check the stored files of `step` against its manifest: each present with its size and, with
        `hash_files`, its sha256 (a full read). A resume checks sizes only here (a stat each) and the
        hashes while it loads (`load_verified`); `names` limits the check to those files."""
        path = self.step_path(step)
        files = manifest.get("files") or {}
        if ".metadata" not in files:
            raise CorruptCheckpoint("manifest lists no .metadata")

        def check(name: str) -> None:
            want, full = files[name], f"{path}/{name}"
            with self._io("verifying", full):
                try:
                    size = self.fs.size(full)
                except FileNotFoundError:
                    raise CorruptCheckpoint(f"{name} is missing") from None
                if size != want["size"]:
                    raise CorruptCheckpoint(f"{name} has {size} bytes, the manifest says {want['size']}")
                if hash_files and _sha256(self.fs, full) != want["sha256"]:
                    raise CorruptCheckpoint(f"{name} fails its sha256 checksum")

        self._each_file(check, sorted(names if names is not None else files))

    def shapes(self, step: int) -> dict[str, tuple[int, ...]]:
        """Saved tensor shapes by flattened key, read from .metadata (safely)."""
        md = self._reader(step).read_metadata()
        return {k: tuple(v.size) for k, v in md.state_dict_metadata.items() if hasattr(v, "size")}

    def load_verified(self, step: int, manifest: dict[str, Any], state: dict[str, Any]) -> set[str]:
        """dcp.load into `state`, hashing each file once while it is read (ckpt_read.VerifyingReader).
        Collective. A file that fails its sha256 raises on every rank, after some of its items may have
        been copied into `state`: pass a staging state, never the live tensors. Returns the files this
        rank hashed (the caller checks that the ranks together hashed every file)."""
        assert_tensors_only(state)
        reader = _sharing(self.fs, VerifyingReader(self.url(self.step_path(step)), manifest.get("files") or {},
                                                   threads=self.io_threads, **storage_options(self.root_uri)))
        dcp.load(state, storage_reader=reader)
        return reader.hashed

    def _reader(self, step: int) -> SafeReader:
        return _sharing(self.fs, SafeReader(self.url(self.step_path(step)), **storage_options(self.root_uri)))

    # -- retention --
    def _delete(self, path: str) -> None:
        # _COMMIT goes first: a half-deleted checkpoint must read as incomplete, never as complete.
        def rm(target: str, recursive: bool) -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(target, recursive=recursive)

        retrying(lambda: rm(f"{path}/{COMMIT}", False), self.url(path), "deleting the commit marker of")
        retrying(lambda: rm(path, True), self.url(path), "deleting")

    def metric(self, step: int, name: str) -> float | None:
        """The value of metric `name` that the manifest of committed `step` records (None if absent)."""
        if step not in self._manifests:
            try:
                self._manifests[step] = self.read_manifest(step)
            except (CorruptCheckpoint, StorageError):
                return None
        value = (self._manifests[step].get("metrics") or {}).get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        return None

    def best_step(self, name: str, steps: list[int]) -> int | None:
        """The step with the lowest `name` among `steps` (the newest of equals); None if none has it."""
        scored = [(v, -s) for s in steps if (v := self.metric(s, name)) is not None]
        return -min(scored)[1] if scored else None

    def retain(self, keep_last: int, newest: int, best_metric: str = "") -> list[int]:
        """Delete committed checkpoints beyond the newest `keep_last` (keeping also the best one by
        `best_metric`, lower is better, when set, and `verified_step`, the newest checkpoint that was
        read back or loaded by a resume), and torn folders older than `newest`. Called only
        after `newest` committed. _COMMIT goes first in every deletion. Returns the deleted steps."""
        deleted: list[int] = []
        try:
            committed = self.committed_steps()
            keep = set(committed[:keep_last]) | {newest}
            if self.verified_step is not None:  # the newest read back or loaded: never deleted
                keep.add(self.verified_step)
            best = self.best_step(best_metric, committed) if best_metric else None
            if best is not None:
                keep.add(best)
            for step in committed:
                if step not in keep:
                    self._delete(self.step_path(step))
                    self._manifests.pop(step, None)
                    deleted.append(step)
            with self._io("listing"):
                try:
                    entries = self.fs.ls(self.run_path, detail=False)
                except FileNotFoundError:
                    entries = []
            for p in entries:
                s = _step_of(_name(p))
                if s is not None and s < newest and s not in committed:
                    self._delete(p)
                    deleted.append(s)
        except StorageError as e:
            # Best effort: the new checkpoint is committed, and the next commit retries the rest.
            log(f"retention stopped early, nothing more deleted this time: {e}")
        return sorted(deleted)


def _agreed(e: BaseException) -> tuple[str, str]:
    """An exception as (kind, message), to broadcast so that every rank raises the same one."""
    if isinstance(e, FencedOut):
        return "fenced", str(e)
    if isinstance(e, StorageError):
        return "storage", str(e)
    return "storage", redact(f"{type(e).__name__}: {e}".splitlines()[0][:500])


def _raise_agreed(error: tuple[str, str] | None) -> None:
    if error is None:
        return
    kind, msg = error
    raise FencedOut(msg) if kind == "fenced" else StorageError(msg)


def _staging_like(state: dict[str, Any]) -> dict[str, Any]:
    """A tensor-for-tensor copy of `state`'s structure with fresh storage (DTensors stay DTensors with
    the same placements): what a load writes into before the checkpoint is known to be intact."""
    return {k: _staging_like(v) if isinstance(v, dict) else torch.empty_like(v) for k, v in state.items()}


def _load_failure(e: BaseException) -> str:
    """The reason to record for a failed load: a CorruptCheckpoint's own message when a rank raised one
    (DCP wraps every rank's failure in one CheckpointException)."""
    if isinstance(e, CorruptCheckpoint):
        return str(e)
    inners = []
    for wrapped in (getattr(e, "failures", None) or {}).values():  # rank -> (exception, traceback)
        inner = wrapped[0] if isinstance(wrapped, tuple) else getattr(wrapped, "exc", None)
        if isinstance(inner, CorruptCheckpoint):
            return str(inner)
        inners.append(inner)
    # A store that failed while DCP read from it (an I/O error, a connection): not a reason to pass over
    # this checkpoint. "storage:" makes the caller raise a StorageError, which the resume retries
    # (trainer/faults.py). A missing file is the checkpoint's fault (its sizes were checked just before).
    for err in (e, *inners):
        if _world() > 1 and err is not None and is_peer_failure(err):  # a rank died mid-restore: not the file's fault
            return f"storage:a peer rank is gone: {type(err).__name__}: {err}".splitlines()[0][:500]
        if isinstance(err, (OSError, StorageError)) and not isinstance(err, FileNotFoundError):
            return f"storage:reading a checkpoint failed: {describe(err)}"
    return f"load failed: {type(e).__name__}: {e}".splitlines()[0][:500]


def _all_hashed(store: Store, step: int, manifest: dict[str, Any], hashed: set[str]) -> str | None:
    """Collective: every file of the manifest was hashed by some rank during the load; a file that none
    read (an item no rank asked for) is hashed now on rank 0. Returns the agreed refusal, or None."""
    parts = gather(sorted(hashed))
    verdict = None
    if _rank() == 0:
        missing = sorted(set(manifest.get("files") or {}) - {n for p in parts for n in p})
        try:
            if missing:
                store.verify_files(step, manifest, names=missing)
        except CorruptCheckpoint as e:
            verdict = str(e)
        except StorageError as e:
            verdict = f"storage:{e}"
    return broadcast(verdict)


@dataclass
class LoadTimes:
    """Seconds spent in each phase of resolve_and_load (over every checkpoint it tried)."""

    listing: float = 0.0
    manifest: float = 0.0
    load: float = 0.0
    tried: int = 0

    def as_dict(self) -> dict[str, float]:
        return {"listing_s": round(self.listing, 3), "manifest_s": round(self.manifest, 3),
                "load_verify_s": round(self.load, 3)}


def resolve_and_load(store: Store, fingerprint: str, build_state: Callable[[int, dict], dict],
                     on_refused: Callable[[int, str], None], times: LoadTimes | None = None,
                     steps: list[int] | None = None) -> tuple[int, dict, dict] | None:
    """Load the newest complete, intact checkpoint; fall back past torn or corrupt ones.

    `steps`: the committed steps, newest first, when the caller has listed them (same on every rank).
    `build_state(step, manifest)` returns the tensor-only state to load (the live tensors may be in
    it): the load goes into a staging copy of it, hashing every file while reading it, and the staging
    copy is returned only once every file has matched its sha256 on every rank, so no tensor of a
    refused checkpoint reaches the live state. Returns (step, manifest, staged state), or None when no
    usable checkpoint exists. Raises CheckpointRefused for a checkpoint of another run (a different
    fingerprint): that is a mistake to stop on, not to skip. A store that fails (after retries) while
    being read raises StorageError: a network fault is not a reason to pass over a good checkpoint.
    """
    times = times if times is not None else LoadTimes()
    if steps is None:  # the caller may have listed them already (one listing per start)
        t = time.perf_counter()
        steps = broadcast(store.committed_steps() if _rank() == 0 else None)
        times.listing += time.perf_counter() - t
    for step in steps:
        times.tried += 1
        t = time.perf_counter()
        verdict: str | None = None
        manifest: dict = {}
        if _rank() == 0:
            try:
                manifest = store.read_manifest(step)
                if manifest.get("fingerprint") != fingerprint:
                    verdict = (f"foreign:{store.url(store.step_path(step))} has fingerprint "
                               f"{str(manifest.get('fingerprint'))[:12]}, this run has {fingerprint[:12]}")
                else:
                    store.verify_files(step, manifest, hash_files=False)  # sizes: a stat each
            except CorruptCheckpoint as e:
                verdict = str(e)
            except StorageError as e:
                verdict = f"storage:{e}"
        verdict, manifest = broadcast((verdict, manifest))
        times.manifest += time.perf_counter() - t
        if verdict and verdict.startswith("foreign:"):
            raise CheckpointRefused(f"refusing checkpoint {verdict.removeprefix('foreign:')}; "
                                    "it belongs to another run")
        if verdict and verdict.startswith("storage:"):
            raise StorageError(verdict.removeprefix("storage:"))
        if verdict is None:
            t = time.perf_counter()
            try:
                state = _staging_like(build_state(step, manifest))
                hashed = store.load_verified(step, manifest, state)
                verdict = _all_hashed(store, step, manifest, hashed)
            except (Exception, CheckpointException) as e:  # DCP raises it on every rank together
                verdict = _load_failure(e)
            times.load += time.perf_counter() - t
            if verdict and verdict.startswith("storage:"):
                raise StorageError(verdict.removeprefix("storage:"))
            if verdict is None:
                store._verified(step, True)  # every file hashed while it loaded
                return step, manifest, state
        on_refused(step, verdict)
    return None


def tensor_from_json(obj: Any) -> torch.Tensor:
    return torch.frombuffer(bytearray(json.dumps(obj, sort_keys=True).encode()), dtype=torch.uint8).clone()


def json_from_tensor(t: torch.Tensor) -> Any:
    return json.loads(bytes(t.to(torch.uint8).tolist()).decode())


def local_path(uri: str) -> str | None:
    """The filesystem path of a file:// URI or plain path; None for remote stores."""
    if uri.startswith("file://"):
        return uri.removeprefix("file://")
    if "://" not in uri:
        return os.path.abspath(uri)
    return None


def load_flat(url: str) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint, full (unsharded), by flattened key. No process group needed."""
    # The same private pair that torch's own dcp_to_torch_save uses: the public load() skips an empty dict.
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=SafeReader(url, **storage_options(url)),
                     planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat[prefix] = node

    walk("", state)
    return flat
