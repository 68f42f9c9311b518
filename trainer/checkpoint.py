"""Checkpoints: save, commit, resolve, verify, fall back, retain, fence.

Layout under any fsspec root (file://, s3://, gs://, or a local path):

    <root>/runs/<run_id>/step-<step:08d>/.metadata, __<rank>_0.distcp   DCP, one writer per rank
                                         manifest.json                  step, fingerprint, files + sha256
                                         _COMMIT                        written last; absent = incomplete
    <root>/runs/<run_id>/attempts/<n:08d>-<token>.json                  one per process start (fencing)

The state handed to DCP holds tensors only, and `.metadata` is read through an unpickler that admits
DCP's own metadata classes and nothing else, so loading never runs code from the bucket.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

from trainer.storage import full_url, storage_options, url_to_fs

COMMIT = "_COMMIT"
MANIFEST = "manifest.json"
_HASH_CHUNK = 8 << 20


class CheckpointRefused(RuntimeError):
    """A checkpoint that must never be loaded and must not be passed over silently (foreign run)."""


class CorruptCheckpoint(RuntimeError):
    """Torn, truncated or altered: refused, and the loader falls back to the previous one."""


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


# ---- .metadata without arbitrary unpickling ---------------------------------------------------------

_ALLOWED_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", n) for n in (
        "Metadata", "TensorStorageMetadata", "ChunkStorageMetadata", "TensorProperties", "MetadataIndex",
        "StorageMeta", "_MEM_FORMAT_ENCODING", "BytesStorageMetadata")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.filesystem", "_StoragePrefix"),
    ("torch.distributed.checkpoint.planner", "WriteItemType"),
    ("torch.distributed.checkpoint._extension", "ExtensionRegistry"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"), ("torch", "device"), ("torch", "layout"), ("torch", "memory_format"),
    ("torch", "strided"), ("torch", "contiguous_format"),
    ("collections", "OrderedDict"), ("builtins", "getattr"), ("builtins", "set"), ("builtins", "frozenset"),
    ("pathlib", "PosixPath"),
} | {("torch", n) for n in ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16",
                            "int8", "uint8", "bool", "complex64", "complex128")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise CorruptCheckpoint(f".metadata references {module}.{name}, which a DCP checkpoint never needs")
        return super().find_class(module, name)


class SafeReader(FsspecReader):
    """DCP's fsspec reader, with `.metadata` read under an allowlist instead of plain `pickle.load`."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        from torch.distributed.checkpoint.metadata import StorageMeta

        with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as f:
            try:
                metadata = _MetadataUnpickler(io.BytesIO(f.read())).load()
            except CorruptCheckpoint:
                raise
            except Exception as e:
                raise CorruptCheckpoint(f".metadata does not parse: {e}") from e
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


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


def _sha256(fs, path: str) -> str:
    h = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class Store:
    """One run's checkpoints under `<root>/runs/<run_id>`."""

    def __init__(self, root_uri: str, run_id: str) -> None:
        self.root_uri = root_uri
        self.fs, root = url_to_fs(root_uri)
        self.run_path = f"{root.rstrip('/')}/runs/{run_id}"
        self.run_id = run_id

    def step_path(self, step: int) -> str:
        return f"{self.run_path}/step-{step:08d}"

    def url(self, path: str) -> str:
        return full_url(self.fs, path)

    def _fresh(self) -> None:
        # s3fs and gcsfs cache listings per instance; another process's _COMMIT must be seen.
        self.fs.invalidate_cache()

    def committed_steps(self) -> list[int]:
        """Steps with a _COMMIT, newest first: one listing (a single glob)."""
        self._fresh()
        steps = []
        for p in self.fs.glob(f"{self.run_path}/step-*/{COMMIT}"):
            name = p.rstrip("/").split("/")[-2]
            try:
                steps.append(int(name.removeprefix("step-")))
            except ValueError:
                continue
        return sorted(steps, reverse=True)

    # -- attempts and fencing --
    def _attempts(self) -> list[tuple[int, str]]:
        self._fresh()
        out = []
        try:
            names = self.fs.ls(f"{self.run_path}/attempts", detail=False)
        except FileNotFoundError:
            return []
        for p in names:
            base = p.rstrip("/").split("/")[-1].removesuffix(".json")
            num, _, token = base.partition("-")
            if num.isdigit():
                out.append((int(num), token))
        return sorted(out)

    def claim_attempt(self, info: dict[str, Any]) -> int:
        """Take the next attempt number. Two claimants of one number: the smaller token keeps it."""
        token = uuid.uuid4().hex[:12]
        for _ in range(20):
            existing = self._attempts()
            n = (existing[-1][0] + 1) if existing else 1
            path = f"{self.run_path}/attempts/{n:08d}-{token}.json"
            self.fs.makedirs(f"{self.run_path}/attempts", exist_ok=True)
            with self.fs.open(path, "w") as f:
                f.write(json.dumps({**info, "attempt": n, "token": token, "time": time.time()}))
            rivals = [t for m, t in self._attempts() if m == n]
            if min(rivals) == token:
                return n
            self.fs.rm(path)
        raise RuntimeError(f"could not claim an attempt number under {self.url(self.run_path)}")

    def newest_attempt(self) -> int:
        existing = self._attempts()
        return existing[-1][0] if existing else 0

    # -- save and commit (collective) --
    def save(self, step: int, state: dict[str, Any], manifest: dict[str, Any], attempt: int) -> SaveResult:
        assert_tensors_only(state)
        rank, world = _rank(), _world()
        path = self.step_path(step)
        t0 = time.perf_counter()
        if rank == 0 and self.fs.exists(path):
            self._delete(path)  # an uncommitted leftover of a crashed attempt at this step
        barrier()
        dcp.save(state, storage_writer=FsspecWriter(self.url(path), **storage_options(self.root_uri)))
        # Every rank hashes the shards it wrote; rank 0 also hashes .metadata.
        names = broadcast(sorted(p.rstrip("/").split("/")[-1] for p in self.fs.ls(path, detail=False))
                          if rank == 0 else None)
        mine = [n for n in names if n.startswith(f"__{rank}_") or (rank == 0 and not n.startswith("__"))]
        files = {}
        for n in mine:
            full = f"{path}/{n}"
            files[n] = {"size": self.fs.size(full), "sha256": _sha256(self.fs, full)}
        all_files = {k: v for part in gather(files) for k, v in part.items()}
        save_ms = (time.perf_counter() - t0) * 1000
        error = None
        if rank == 0:
            try:
                newest = self.newest_attempt()
                if newest > attempt:
                    raise FencedOut(f"attempt {attempt} may not commit step {step}: attempt {newest} of "
                                    f"{self.run_id} has started since")
                body = {**manifest, "step": step, "attempt": attempt, "world_size": world,
                        "files": all_files, "save_ms": round(save_ms, 1)}
                text = json.dumps(body, indent=1, sort_keys=True)
                with self.fs.open(f"{path}/{MANIFEST}", "w") as f:
                    f.write(text)
                with self.fs.open(f"{path}/{COMMIT}", "w") as f:
                    f.write(json.dumps({"step": step, "attempt": attempt,
                                        "manifest_sha256": hashlib.sha256(text.encode()).hexdigest()}))
            except FencedOut as e:
                error = str(e)
        error = broadcast(error)
        if error:
            raise FencedOut(error)
        return SaveResult(step, self.url(path), save_ms, sum(f["size"] for f in all_files.values()))

    # -- verify and load --
    def read_manifest(self, step: int) -> dict[str, Any]:
        path = self.step_path(step)
        try:
            with self.fs.open(f"{path}/{COMMIT}", "r") as f:
                commit = json.loads(f.read())
            with self.fs.open(f"{path}/{MANIFEST}", "r") as f:
                text = f.read()
        except (OSError, json.JSONDecodeError) as e:
            raise CorruptCheckpoint(f"commit or manifest unreadable: {e}") from e
        if hashlib.sha256(text.encode()).hexdigest() != commit.get("manifest_sha256"):
            raise CorruptCheckpoint("manifest.json does not match the checksum in _COMMIT")
        return json.loads(text)

    def verify_files(self, step: int, manifest: dict[str, Any]) -> None:
        path = self.step_path(step)
        files = manifest.get("files") or {}
        if ".metadata" not in files:
            raise CorruptCheckpoint("manifest lists no .metadata")
        for name, want in sorted(files.items()):
            full = f"{path}/{name}"
            try:
                size = self.fs.size(full)
            except FileNotFoundError:
                raise CorruptCheckpoint(f"{name} is missing") from None
            if size != want["size"]:
                raise CorruptCheckpoint(f"{name} has {size} bytes, the manifest says {want['size']}")
            if _sha256(self.fs, full) != want["sha256"]:
                raise CorruptCheckpoint(f"{name} fails its sha256 checksum")

    def shapes(self, step: int) -> dict[str, tuple[int, ...]]:
        """Saved tensor shapes by flattened key, read from .metadata (safely)."""
        md = SafeReader(self.url(self.step_path(step)), **storage_options(self.root_uri)).read_metadata()
        return {k: tuple(v.size) for k, v in md.state_dict_metadata.items() if hasattr(v, "size")}

    def load_into(self, step: int, state: dict[str, Any]) -> None:
        assert_tensors_only(state)
        dcp.load(state, storage_reader=SafeReader(self.url(self.step_path(step)),
                                                  **storage_options(self.root_uri)))

    # -- retention --
    def _delete(self, path: str) -> None:
        # _COMMIT goes first: a half-deleted checkpoint must read as incomplete, never as complete.
        try:
            self.fs.rm(f"{path}/{COMMIT}")
        except FileNotFoundError:
            pass
        try:
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass

    def retain(self, keep_last: int, newest: int) -> list[int]:
        """Delete committed checkpoints beyond the newest `keep_last`, and torn folders older than
        `newest`. Called after `newest` committed. Returns the deleted steps."""
        deleted = []
        for step in self.committed_steps()[keep_last:]:
            self._delete(self.step_path(step))
            deleted.append(step)
        committed = set(self.committed_steps())
        try:
            entries = self.fs.ls(self.run_path, detail=False)
        except FileNotFoundError:
            entries = []
        for p in entries:
            name = p.rstrip("/").split("/")[-1]
            if name.startswith("step-") and name.removeprefix("step-").isdigit():
                s = int(name.removeprefix("step-"))
                if s < newest and s not in committed:
                    self._delete(p)
                    deleted.append(s)
        return deleted


def resolve_and_load(store: Store, fingerprint: str, build_state: Callable[[int, dict], dict],
                     on_refused: Callable[[int, str], None]) -> tuple[int, dict, dict] | None:
    """Load the newest complete, intact checkpoint; fall back past torn or corrupt ones.

    `build_state(step, manifest)` returns the tensor-only state to load into. Returns
    (step, manifest, state), or None when no usable checkpoint exists. Raises CheckpointRefused for a
    checkpoint of another run (a different fingerprint): that is a mistake to stop on, not to skip.
    """
    steps = broadcast(store.committed_steps() if _rank() == 0 else None)
    for step in steps:
        verdict: str | None = None
        manifest: dict = {}
        if _rank() == 0:
            try:
                manifest = store.read_manifest(step)
                if manifest.get("fingerprint") != fingerprint:
                    verdict = (f"foreign:{store.url(store.step_path(step))} has fingerprint "
                               f"{str(manifest.get('fingerprint'))[:12]}, this run has {fingerprint[:12]}")
                else:
                    store.verify_files(step, manifest)
            except CorruptCheckpoint as e:
                verdict = str(e)
        verdict, manifest = broadcast((verdict, manifest))
        if verdict and verdict.startswith("foreign:"):
            raise CheckpointRefused(f"refusing checkpoint {verdict.removeprefix('foreign:')}; "
                                    "it belongs to another run")
        if verdict is None:
            try:
                state = build_state(step, manifest)
                store.load_into(step, state)
                return step, manifest, state
            except Exception as e:  # DCP raises CheckpointException on every rank together
                verdict = f"load failed: {type(e).__name__}: {e}".splitlines()[0][:500]
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
