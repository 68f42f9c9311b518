"""What a checkpoint root holds, by name, and the checks that everything read from it passes first.

Everything read from a bucket is untrusted: a bucket is shared by every run and every drill, and many
people and jobs can write to it. So a name read from a listing, a manifest or a `_COMMIT` is data,
never a path: it must be a plain file name (`plain_name`) before it is joined to anything. A
`_COMMIT` or `manifest.json` must be a JSON object of the expected shape (`parse_commit`,
`parse_manifest`), and a step folder's name must be `step-` and exactly 8 ASCII digits (HF's:
`checkpoint-` and ASCII digits). Anything else is a corrupt checkpoint: refused, and passed over.
"""

from __future__ import annotations

import math
import re
from typing import Any

import trainer.checkpoint.digest as digest
from trainer.untrusted import Refused, parse_json

COMMIT = "_COMMIT"
MANIFEST = "manifest.json"
STEP_PREFIX = "step-"
MAX_NAME_LEN = 255  # a file name on ext4, xfs and GCS/S3 keys' practical limit per segment
# The most files a manifest may list: DCP writes one per rank and I/O thread (plus .metadata), HF a few
# dozen per checkpoint. Each listed file costs a request to the store; a planted manifest of millions
# would hold a restart for hours before anything could be refused.
MAX_MANIFEST_FILES = 16384
_STEP_DIGITS = re.compile(r"[0-9]{8}")  # ASCII only: str.isdigit() and \d accept other scripts' digits
_HF_STEP = re.compile(r"checkpoint-([0-9]{1,12})")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class CorruptCheckpoint(RuntimeError):
    """Torn, truncated, altered or malformed: refused, and the loader falls back to the previous one."""


def name_of(p: str) -> str:
    """The last component of a path or key."""
    return p.rstrip("/").split("/")[-1]


def run_path(root: str, run_id: str) -> str:
    """A run's folder under a store's root path (no scheme): its steps, attempts and packed corpus."""
    return f"{root.rstrip('/')}/runs/{run_id}"


def corpus_path(root: str, run_id: str) -> str:
    """Where a run keeps its packed corpus (trainer/packed.py)."""
    return f"{run_path(root, run_id)}/corpus"


def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def hf_step_name(step: int) -> str:
    """The Hugging Face Trainer's folder of `step` (its PREFIX_CHECKPOINT_DIR)."""
    return f"checkpoint-{step}"


def step_of(name: str) -> int | None:
    """The step of a folder named `step-` and exactly 8 ASCII digits; None for any other name."""
    digits = name.removeprefix(STEP_PREFIX)
    return int(digits) if name.startswith(STEP_PREFIX) and _STEP_DIGITS.fullmatch(digits) else None


def hf_step_of(name: str) -> int | None:
    """The step of an HF folder named `checkpoint-` and ASCII digits; None for any other name."""
    m = _HF_STEP.fullmatch(name)
    return int(m.group(1)) if m else None


def plain_name(name: Any, where: str = "the manifest") -> str:
    """`name` if it is a plain file name: a printable ASCII string of at most MAX_NAME_LEN characters,
    with no `/` or `\\`, not `.` or `..`. Raises CorruptCheckpoint otherwise (a name from a bucket
    that could walk out of its folder, or into an absolute path)."""
    if (
        not isinstance(name, str)
        or not name
        or len(name) > MAX_NAME_LEN
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or not name.isascii()
        or not name.isprintable()
    ):
        shown = repr(name)[:80]
        raise CorruptCheckpoint(f"{where} names a file {shown}, which is not a plain file name")
    return name


def _object(text: str | bytes, what: str) -> dict[str, Any]:
    """A JSON object, nested at most untrusted.MAX_DEPTH deep (CorruptCheckpoint otherwise, never a
    RecursionError)."""
    try:
        return parse_json(text, what, expect=dict)
    except Refused as e:
        raise CorruptCheckpoint(str(e)) from None


def _count(obj: dict[str, Any], key: str, what: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CorruptCheckpoint(
            f"{what} field {key!r} must be a non-negative integer, got {repr(value)[:60]}"
        )
    return value


def checksum(meta: dict[str, Any], what: str) -> tuple[str, str]:
    """(algorithm, hex) of a manifest entry (digest.py), or CorruptCheckpoint."""
    try:
        return digest.expected(meta, what)
    except digest.BadChecksum as e:
        raise CorruptCheckpoint(str(e)) from None


def _files(obj: dict[str, Any], what: str, algorithms: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    files = obj.get("files")
    if not isinstance(files, dict) or not files:
        raise CorruptCheckpoint(f"{what} field 'files' must be a non-empty object")
    if len(files) > MAX_MANIFEST_FILES:
        raise CorruptCheckpoint(
            f"{what} lists {len(files)} files, more than any checkpoint has (at most {MAX_MANIFEST_FILES})"
        )
    for name, meta in files.items():
        plain_name(name, what)
        if not isinstance(meta, dict):
            raise CorruptCheckpoint(f"{what}: the entry of {name!r} is not an object")
        _count(meta, "size", f"{what} entry {name!r}")
        algorithm, _ = checksum(meta, f"{what} entry {name!r}")
        allowed = digest.CRYPTOGRAPHIC if name == ".metadata" else algorithms
        if algorithm not in allowed:  # .metadata is unpickled: a forger must not be able to match its check
            raise CorruptCheckpoint(
                f"{what} entry {name!r}: {algorithm} is not accepted here (only {', '.join(allowed)})"
            )
    return files


def parse_commit(text: str | bytes, step: int) -> dict[str, Any]:
    """A DCP `_COMMIT`: {step, attempt, manifest_sha256}; its step must be the folder's."""
    commit = _object(text, COMMIT)
    if _count(commit, "step", COMMIT) != step:
        raise CorruptCheckpoint(f"{COMMIT} says step {commit['step']}, the folder is {step_name(step)}")
    if not isinstance(commit.get("manifest_sha256"), str) or not _SHA256.fullmatch(commit["manifest_sha256"]):
        raise CorruptCheckpoint(f"{COMMIT} field 'manifest_sha256' is not 64 lowercase hex digits")
    return commit


def parse_manifest(text: str | bytes, step: int) -> dict[str, Any]:
    """A DCP `manifest.json`: an object whose `step` is the folder's, `world_size` a positive integer,
    `fingerprint` (where present: the trainer's resume requires it) a string, and `files` {plain name:
    {size, sha256}} with `.metadata` among them."""
    manifest = _object(text, MANIFEST)
    if _count(manifest, "step", MANIFEST) != step:
        raise CorruptCheckpoint(f"{MANIFEST} says step {manifest['step']}, the folder is {step_name(step)}")
    if _count(manifest, "world_size", MANIFEST) < 1:
        raise CorruptCheckpoint(f"{MANIFEST} field 'world_size' must be >= 1")
    if not isinstance(manifest.get("fingerprint", ""), str):
        raise CorruptCheckpoint(f"{MANIFEST} field 'fingerprint' must be a string")
    if ".metadata" not in _files(manifest, MANIFEST, digest.ALGORITHMS):
        raise CorruptCheckpoint("manifest lists no .metadata")
    metrics = manifest.get("metrics", {})
    if not isinstance(metrics, dict):
        raise CorruptCheckpoint(f"{MANIFEST} field 'metrics' must be an object")
    return manifest


def parse_hf_commit(text: str | bytes, step: int) -> dict[str, Any]:
    """An HF `checkpoint-N/_COMMIT` (the manifest itself): `files` {plain name: {size, sha256}}, and a
    `step`, where present, equal to the folder's."""
    manifest = _object(text, COMMIT)
    if "step" in manifest and _count(manifest, "step", COMMIT) != step:
        raise CorruptCheckpoint(f"{COMMIT} says step {manifest['step']}, the folder is checkpoint-{step}")
    if "world_size" in manifest and _count(manifest, "world_size", COMMIT) < 1:
        raise CorruptCheckpoint(f"{COMMIT} field 'world_size' must be >= 1")
    _files(manifest, COMMIT, ("sha256",))  # HF roots: sha256 (trainer/checkpoint/hf_store.py)
    return manifest


def finite_metric(value: Any) -> float | None:
    """A metric from a manifest as a float, or None unless it is a finite real number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
