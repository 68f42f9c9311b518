"""One run's checkpoints in a store: listing, the attempt claim and fencing, save and commit, verify,
retention.

    <root>/runs/<run_id>/step-<step:08d>/.metadata, __<rank>_<i>.distcp   DCP, io_threads files per rank
                                         manifest.json                   step, fingerprint, metrics, files + checksums
                                         _COMMIT                         written last; absent = incomplete
    <root>/runs/<run_id>/attempts/<n:08d>-<token>.json                   one per process start (<n:08d>.json on gs://)

Commit order: every rank writes its files and hashes them; rank 0 gathers the hashes, checks the
fencing, writes manifest.json, then _COMMIT (its body holds the manifest's sha256), so a _COMMIT exists
only over files that were all durable and hashed. A save with `read_back=True` reads every file back to
hash what is stored; otherwise it hashes while writing and checks sizes. `verified_step` is the newest
checkpoint known intact as stored (read back, or loaded by a resume): retention never deletes it. The
newest complete checkpoint is one listing request away (`committed_steps`). Retention keeps the newest
`keep_last` and the best by a metric, runs only after a commit, and removes _COMMIT first.

Fencing: each start claims the next attempt number (`attempts/`); before a save touches its folder,
before manifest.json and before _COMMIT, rank 0 refuses (FencedOut) if a newer attempt exists. On s3://
and file:// this is check-then-act without compare-and-swap: an attempt that claims its number after the
older one's last check does not stop that commit (still a complete checkpoint of the same run), and the
older attempt's retention may delete a folder the newer one is still writing (its save then fails its
check, or its checkpoint fails verification at load and the loader falls back). On gs:// both markers
are created only if absent (GCS `ifGenerationMatch=0`, trainer.storage.create_only): two claimants never
hold one number, and a commit marker is never replaced. The gap between the last fence check and
_COMMIT remains on every store.

Reading is trainer/checkpoint/read.py (hashing while loading, the `.metadata` allowlist), resolving a
restart is resolve.py, writing is write.py, asynchronous saves are async_save.py (a member of the store).
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

import trainer.checkpoint.digest as digest
from trainer import collectives
from trainer.checkpoint.async_save import AsyncSaves
from trainer.checkpoint.layout import (
    COMMIT,
    MANIFEST,
    CorruptCheckpoint,
    checksum,
    finite_metric,
    name_of,
    parse_commit,
    parse_manifest,
    run_path,
    step_name,
    step_of,
)
from trainer.checkpoint.read import SafeReader, VerifyingReader
from trainer.checkpoint.write import (
    ArchiveFileSystem,
    HashingFileSystem,
    PendingSave,
    SaveResult,
    assert_tensors_only,
    done,
    require_written,
    writer_thread_hook,
)
from trainer.nofollow import check_below, open_write, remove
from trainer.records import log
from trainer.storage import (
    StorageError,
    create_only,
    create_only_supported,
    full_url,
    redact,
    retrying,
    storage_error,
    storage_options,
    url_to_fs,
)
from trainer.untrusted import Refused, read_bytes, read_json

_file_hexdigest = digest.file_hexdigest  # the store's full-file hash, one name a test can count calls through


def sharing(fs: Any, io: Any) -> Any:
    """Point a DCP fsspec reader or writer at the store's filesystem instead of a new one: a new s3fs
    instance builds a new botocore client, 0.2-0.8 s on every save and load."""
    inner = getattr(io, "fs", None)
    if inner is not None and hasattr(inner, "fs"):
        inner.fs = fs
    return io


class CheckpointRefused(RuntimeError):
    """A checkpoint that must never be loaded and must not be passed over silently (foreign run)."""


class FencedOut(RuntimeError):
    """A newer attempt of this run exists; this process may no longer commit."""


class Store:
    """One run's checkpoints under `<root>/runs/<run_id>`.

    Construction checks the store (one listing), so a bad URI, a missing bucket, missing
    credentials or an unreachable endpoint stop the run at start-up with a StorageError naming the URI.
    """

    def __init__(
        self,
        root_uri: str,
        run_id: str,
        check: bool = True,
        io_threads: int = 4,
        digest_algorithm: str = digest.DATA_DEFAULT,
    ) -> None:
        self.root_uri = root_uri
        self.io_threads = io_threads
        self.digest = digest_algorithm  # the data files' checksum (digest.py); .metadata's is always sha256
        threading.excepthook = writer_thread_hook
        self.fs, self.root = url_to_fs(root_uri)
        self.run_path = run_path(self.root, run_id)
        self.run_id = run_id
        self.asyncs = AsyncSaves(self)  # saves written while training goes on (async_save.py)
        self._hasher: ThreadPoolExecutor | None = None
        self._manifests: dict[int, dict[str, Any]] = {}
        # The newest step known to be intact as stored: a save that read its files back, or the
        # checkpoint this attempt's resume hashed while loading. Retention never deletes it.
        self.verified_step: int | None = None
        self.unverified_commits = 0  # commits since verified_step that were not read back
        if check:
            self.check()

    def step_path(self, step: int) -> str:
        return f"{self.run_path}/{step_name(step)}"

    def url(self, path: str) -> str:
        return full_url(self.fs, path)

    @contextmanager
    def _io(self, what: str, path: str | None = None):
        """Storage failures (after the client's retries) become a StorageError naming the URI."""
        try:
            yield
        except (CheckpointRefused, CorruptCheckpoint, FencedOut, StorageError):
            raise
        except Refused as e:  # a file of the wrong type or size: the checkpoint's fault, never the store's
            raise CorruptCheckpoint(str(e)) from None
        except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
            raise storage_error(self.url(path or self.run_path), what, e) from None

    def check(self) -> None:
        """Fail fast when the store cannot be used: list the run prefix (which needs the endpoint,
        the bucket and the credentials). Nothing is created: a missing bucket is an error, not a
        bucket to make. Local folders are created on the first write."""
        with self._io("checking the checkpoint store"):
            check_below(self.fs, self.root, f"{self.run_path}/attempts")  # runs/, the run's folder, attempts/
            self.committed_steps()

    # Saves in flight are the member `asyncs`'s (async_save.py: save_async, before_update, step_boundary, drain,
    # pending): the checkpointer and the bench call it directly.

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
            if len(parts) >= 2 and parts[-1] == COMMIT and parts[-3:-2] == [name_of(self.run_path)]:
                step = step_of(parts[-2])
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
            num, _, token = name_of(p).removesuffix(".json").partition("-")
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
                t = read_json(self.fs, self._attempt_path(n, token), "attempt").get("time")
            except (OSError, Refused):
                continue
            if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t):
                starts.append(float(t))
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
            raise FencedOut(
                f"attempt {attempt} may not commit step {step}: attempt {newest} of "
                f"{self.run_id} has started since (another process now owns this run)"
            )

    def _write(self, path: str, text: str) -> None:
        """A small file of the run (an attempt's claim, manifest.json, _COMMIT): never through a link."""
        check_below(self.fs, self.root, path)
        with open_write(self.fs, path, "w") as f:
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
            raise FencedOut(
                f"attempt {p.attempt} may not commit step {p.step}: another writer committed it "
                f"first ({self.url(path)} exists)"
            )

    # -- save and commit (collective) --
    def save(
        self,
        step: int,
        state: dict[str, Any],
        manifest: dict[str, Any],
        attempt: int,
        on_commit: Callable[[SaveResult], None] | None = None,
        read_back: bool = True,
    ) -> SaveResult:
        """Write, verify and commit a checkpoint now (a save in flight commits first).

        `read_back=False` (preemption saves, inside the grace): the files are hashed as they are written
        and only their sizes are checked in the store, instead of reading them all back. A store that
        changed the bytes is then caught when a resume verifies the checkpoint, which falls back to an
        older one: retention deletes nothing after a preemption save, so that one still exists."""
        self.asyncs.drain()
        res = self.commit_save(
            self.start_save(step, state, manifest, attempt, asynchronous=False, read_back=read_back)
        )
        self.mark_verified(step, read_back)
        if on_commit:
            on_commit(res)
        return res

    def mark_verified(self, step: int, verified: bool) -> None:
        if verified:
            self.verified_step, self.unverified_commits = step, 0
        else:
            self.unverified_commits += 1

    def start_save(
        self,
        step: int,
        state: dict[str, Any],
        manifest: dict[str, Any],
        attempt: int,
        asynchronous: bool,
        read_back: bool = True,
    ) -> PendingSave:
        assert_tensors_only(state)
        rank = collectives.rank()
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
                    self._delete(path)  # uncommitted leftover, or a refused one being replaced
            except Exception as e:
                error = _agreed(e)
        _raise_agreed(collectives.broadcast(error))
        writer = sharing(
            self.fs,
            FsspecWriter(self.url(path), thread_count=self.io_threads, **storage_options(self.root_uri)),
        )
        written = None
        if not read_back and not asynchronous:
            writer.fs = HashingFileSystem(self.fs, self.digest)
            written = writer.fs.written
        else:
            writer.fs = ArchiveFileSystem(self.fs)
        what = f"saving step {step} to"
        if not asynchronous:
            try:
                with self._io(what, path):
                    md = dcp.save(state, storage_writer=writer)
                    require_written(md)
                files = done(self._hash_own(path, md, written))
            except Exception as e:
                files = Future()
                files.set_exception(e)
            return PendingSave(step, path, manifest, attempt, t0, files, blocking_s=time.perf_counter() - t0)
        with self._io(what, path):
            resp = dcp.async_save(
                state,
                storage_writer=writer,
                process_group=self.asyncs.gloo_group(),
                async_stager=self.asyncs.staging_buffers(),
            )
        staging, upload = (
            (resp.staging_completion, resp.upload_completion)
            if isinstance(resp, AsyncSaveResponse)
            else (None, resp)
        )
        if self._hasher is None:
            self._hasher = ThreadPoolExecutor(1, thread_name_prefix="baton-ckpt-hash")

        def written_then_hashed() -> dict[str, Any]:
            with self._io(what, path):
                md = upload.result()
                require_written(md)
            return self._hash_own(path, md)

        return PendingSave(
            step,
            path,
            manifest,
            attempt,
            t0,
            self._hasher.submit(written_then_hashed),
            staging=staging,
            asynchronous=True,
        )

    def _hash_own(
        self, path: str, md: Any, written: dict[str, tuple[int, str, str]] | None = None
    ) -> dict[str, Any]:
        """Size and checksum of the files this rank wrote (rank 0 also owns .metadata), read back from
        the store: the manifest describes what is stored, not what was meant to be. With `written`
        (hashed while writing), a file whose stored size matches is not read back."""
        rank = collectives.rank()
        names = sorted({si.relative_path for si in (getattr(md, "storage_data", None) or {}).values()})
        if not names:
            with self._io("listing", path):
                names = sorted(name_of(p) for p in self.fs.ls(path, detail=False))
        mine = [n for n in names if n.startswith(f"__{rank}_")]
        if rank == 0:
            mine = [".metadata", *[n for n in names if not n.startswith("__") and n != ".metadata"], *mine]

        def read_back(n: str) -> dict[str, Any]:
            full = f"{path}/{n}"
            with self._io("reading back", full):
                size = self.fs.size(full)
                seen = (written or {}).get(n)
                if seen is not None and seen[0] == size:
                    return {**digest.entry(size, seen[1], seen[2]), "hashed": "writing"}
                algorithm = digest.for_file(n, self.digest)
                return digest.entry(size, algorithm, _file_hexdigest(self.fs, full, algorithm))

        return dict(zip(mine, self._each_file(read_back, mine), strict=True))

    def _each_file(self, fn: Any, names: list[str]) -> list[Any]:
        """`fn` over `names` on up to io_threads threads (the hashes and file reads release the GIL), in
        order; the first error is raised."""
        if self.io_threads <= 1 or len(names) <= 1:
            return [fn(n) for n in names]
        with ThreadPoolExecutor(min(self.io_threads, len(names)), thread_name_prefix="baton-ckpt-io") as pool:
            return list(pool.map(fn, names))

    def commit_save(self, p: PendingSave) -> SaveResult:
        """Commit `p` once every rank's files are written and hashed: rank 0 checks the fencing,
        writes manifest.json and then _COMMIT. Collective; every rank raises the same error."""
        t = time.perf_counter()
        rank, world = collectives.rank(), collectives.world()
        try:
            mine, err = p.files.result(), None
        except Exception as e:
            mine, err = {}, _agreed(e)
        parts = collectives.gather((mine, err))
        error = next((e for _, e in parts if e), None)
        all_files = {k: v for files, _ in parts for k, v in files.items()}
        save_ms = (time.perf_counter() - p.t0) * 1000
        if rank == 0 and error is None:
            try:
                body = {
                    **p.manifest,
                    "step": p.step,
                    "attempt": p.attempt,
                    "world_size": world,
                    "files": all_files,
                    "save_ms": round(save_ms, 1),
                    "async": p.asynchronous,
                }
                text = json.dumps(body, indent=1, sort_keys=True)
                commit = json.dumps(
                    {
                        "step": p.step,
                        "attempt": p.attempt,
                        "manifest_sha256": digest.of_bytes("sha256", text.encode()),
                    }
                )
                self._fence(p.attempt, p.step)
                retrying(
                    lambda: self._write(f"{p.path}/{MANIFEST}", text),
                    self.url(p.path),
                    "writing the manifest of",
                )
                self._fence(p.attempt, p.step)  # the last look before the marker that makes it count
                self._write_commit(p, commit)
                self._manifests[p.step] = body
            except Exception as e:
                error = _agreed(e)
        _raise_agreed(collectives.broadcast(error))
        p.blocking_s += time.perf_counter() - t
        return SaveResult(
            p.step,
            self.url(p.path),
            (time.perf_counter() - p.t0) * 1000,
            sum(f["size"] for f in all_files.values()),
            p.blocking_s * 1000,
            p.asynchronous,
        )

    # -- verify and load --
    def read_manifest(self, step: int) -> dict[str, Any]:
        """The manifest of committed `step`, checked against the checksum in its _COMMIT and against
        its schema (layout.py): CorruptCheckpoint for anything malformed, StorageError
        only for a read that failed."""
        path = self.step_path(step)
        try:
            commit_text = read_bytes(self.fs, f"{path}/{COMMIT}", "commit", f"{step_name(step)}/{COMMIT}")
            text = read_bytes(self.fs, f"{path}/{MANIFEST}", "manifest", f"{step_name(step)}/{MANIFEST}")
        except FileNotFoundError as e:
            raise CorruptCheckpoint(f"commit or manifest missing: {e}") from e
        except Refused as e:  # too large, or not a regular file: the checkpoint's fault, never the store's
            raise CorruptCheckpoint(str(e)) from None
        except Exception as e:
            raise storage_error(self.url(path), "reading the manifest of", e) from None
        commit = parse_commit(commit_text, step)
        if digest.of_bytes("sha256", text) != commit["manifest_sha256"]:
            raise CorruptCheckpoint("manifest.json does not match the checksum in _COMMIT")
        return parse_manifest(text, step)

    def verify_files(
        self, step: int, manifest: dict[str, Any], hash_files: bool = True, names: list[str] | None = None
    ) -> None:
        """Check the stored files of `step` against its manifest: each present with its size and, with
        `hash_files`, its checksum (a full read). A resume checks sizes only here (a stat each) and the
        hashes while it loads (`load_verified`); `names` limits the check to those files."""
        path = self.step_path(step)
        files = manifest["files"]  # parse_manifest checked its shape: plain names, sizes, checksums

        def check(name: str) -> None:
            want, full = files[name], f"{path}/{name}"
            with self._io("verifying", full):
                try:
                    info = self.fs.info(full)
                except FileNotFoundError:
                    raise CorruptCheckpoint(f"{name} is missing") from None
                # An early refusal only: the read itself checks the open descriptor (untrusted.open_regular).
                if info.get("type", "file") != "file" or info.get("islink"):
                    raise CorruptCheckpoint(f"{name} is not a regular file")
                size = info.get("size")
                if size != want["size"]:
                    raise CorruptCheckpoint(f"{name} has {size} bytes, the manifest says {want['size']}")
                algorithm, hexdigest = checksum(want, f"manifest entry {name!r}")
                if hash_files and _file_hexdigest(self.fs, full, algorithm, want["size"]) != hexdigest:
                    raise CorruptCheckpoint(f"{name} fails its {algorithm} checksum")

        self._each_file(check, sorted(names if names is not None else files))

    def shapes(self, step: int, manifest: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """Saved tensor shapes by flattened key, read from .metadata: its bytes checked against the
        manifest's sha256 before anything is unpickled, and then only under the allowlist."""
        md = self._reader(step, manifest).read_metadata()
        return {k: tuple(v.size) for k, v in md.state_dict_metadata.items() if hasattr(v, "size")}

    def load_verified(
        self, step: int, manifest: dict[str, Any], state: dict[str, Any], copies: Counter[str] | None = None
    ) -> set[str]:
        """dcp.load into `state`, hashing each file once while it is read (read.VerifyingReader).
        Collective. A file that fails its checksum raises on every rank, after some of its items may have
        been copied into `state`: pass a staging state, never the live tensors. Returns the files this
        rank hashed (the caller checks that the ranks together hashed every file); `copies` gets how
        many items each path loaded (VerifyingReader.copies)."""
        assert_tensors_only(state)
        reader = sharing(
            self.fs,
            VerifyingReader(
                self.url(self.step_path(step)),
                manifest["files"],
                threads=self.io_threads,
                **storage_options(self.root_uri),
            ),
        )
        try:
            dcp.load(state, storage_reader=reader)
        finally:
            if copies is not None:
                copies.update(reader.copies)
        return reader.hashed

    def _reader(self, step: int, manifest: dict[str, Any]) -> SafeReader:
        return sharing(
            self.fs,
            VerifyingReader(
                self.url(self.step_path(step)), manifest["files"], **storage_options(self.root_uri)
            ),
        )

    # -- retention --
    def delete_step(self, step: int) -> None:
        """Delete the checkpoint of `step`, _COMMIT first (what retention does to each step it drops)."""
        self._delete(self.step_path(step))

    def _delete(self, path: str) -> None:
        """Remove a step's folder, _COMMIT first (a half-deleted checkpoint must read as incomplete, never as
        complete), and never through a link: one in its place is foreign, and only the link goes."""
        check_below(self.fs, self.root, self.run_path)
        was = retrying(lambda: remove(self.fs, path, first=COMMIT), self.url(path), "deleting")
        if was in ("link", "file"):
            log(
                f"{name_of(path)} was a {'symbolic link' if was == 'link' else 'file'}, not a checkpoint of this "
                f"run: removed it{' (the link itself, nothing it points to)' if was == 'link' else ''}"
            )

    def metric(self, step: int, name: str) -> float | None:
        """The value of metric `name` that the manifest of committed `step` records (None if absent)."""
        if step not in self._manifests:
            try:
                self._manifests[step] = self.read_manifest(step)
            except (CorruptCheckpoint, StorageError):
                return None
        return finite_metric((self._manifests[step].get("metrics") or {}).get(name))

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
                    entries = self.fs.ls(self.run_path, detail=True)
                except FileNotFoundError:
                    entries = []
            for e in entries:
                # Only real step folders: never a symlink (a deletion through it would reach outside
                # the run), never a name that is not step- and 8 ASCII digits.
                if e.get("islink") or e.get("type") != "directory":
                    continue
                s = step_of(name_of(e["name"]))
                if s is not None and s < newest and s not in committed:
                    self._delete(e["name"])
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
