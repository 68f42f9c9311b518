"""Model weights by content: a manifest that names them, a copy from a bucket made once per machine.

A model folder may hold `baton-weights.json`, written by `python -m trainer.weights manifest FOLDER`:

    {"format": "baton-weights/1", "files": {"model.safetensors": {"bytes": N, "sha256": HEX}, ...}}

With it, the weights are known by the hash of that list (`identity`), not by where they lie: the same
weights baked into an image and staged into a bucket give one fingerprint, so one run_id, and either
can resume the other. `model.path` may then be a bucket URI (s3://, gs://): each machine copies the
files to local disk once (`materialize`), each checked against its size and SHA-256 as it streams, and
loads that copy. Nothing is fetched from the Hugging Face hub.

The manifest is read from a bucket, so it is untrusted: a name is a plain file name (no folder, no
`..`) with a suffix from `SAFE_SUFFIXES` (no pickle formats: `.bin`, `.pt`, `.pkl` run code when
loaded, and no `.py`: remote code is not run), the JSON is strict and small, and a file that does not
match is refused with one line that names it, leaving nothing behind.

    python -m trainer.weights manifest FOLDER          # write FOLDER/baton-weights.json
    python -m trainer.weights stage FOLDER URI         # the manifest, then the files to URI, manifest last
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.redaction import redact
from trainer.storage import local_path, retrying, url_to_fs
from trainer.untrusted import Refused, open_regular, parse_json, read_bytes
from trainer.validation import ConfigError

MANIFEST = "baton-weights.json"
FORMAT = "baton-weights/1"
# What a Hugging Face model folder holds besides pickles and code: tensors, configs, tokenizers, templates.
SAFE_SUFFIXES = (".safetensors", ".json", ".txt", ".model", ".tiktoken", ".jinja", ".md")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
MAX_MANIFEST_BYTES = 1 << 20
MAX_FILES = 10_000
CHUNK = 8 << 20
KEY = "config key 'model.path'"


class WeightsRefused(ConfigError):
    """Weights that cannot be used: a manifest that is malformed or names an unsafe file, or a file that
    does not match it. A retry cannot help (exit 1)."""


@dataclass(frozen=True)
class Weights:
    """The model folder to load, and where it came from (the trainer's `weights` record)."""

    path: Path
    source: str
    identity: str | None
    copied_bytes: int = 0
    cached: bool = False
    seconds: float = 0.0

    def record(self) -> dict[str, Any]:
        return {
            "source": redact(self.source),
            "identity": self.identity,
            "copied_bytes": self.copied_bytes,
            "cached": self.cached,
            "seconds": round(self.seconds, 3),
            "hub": False,
        }


def is_remote(path: str) -> bool:
    return local_path(path) is None


def check_name(name: Any) -> str:
    """A file name from a manifest: plain, never a path, and of a safe format."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise WeightsRefused(f"{KEY}: {MANIFEST} names {str(name)[:80]!r}, which is not a plain file name")
    if not name.endswith(SAFE_SUFFIXES):
        raise WeightsRefused(
            f"{KEY}: {MANIFEST} names {name!r}, whose format is not accepted (only "
            f"{', '.join(SAFE_SUFFIXES)}: pickles and code run when loaded; convert "
            "weights to safetensors)"
        )
    return name


def parse_manifest(raw: bytes, where: str) -> dict[str, dict[str, Any]]:
    """The `files` of a manifest, every field checked; WeightsRefused names what is wrong."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise WeightsRefused(f"{KEY}: {where} is larger than {MAX_MANIFEST_BYTES} bytes")

    try:
        doc = parse_json(raw, where)
    except Refused as e:
        raise WeightsRefused(f"{KEY}: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("files"), dict):
        raise WeightsRefused(f"{KEY}: {where} is not a {FORMAT} manifest (format, files)")
    files = doc["files"]
    if not files or len(files) > MAX_FILES:
        raise WeightsRefused(f"{KEY}: {where} must list 1 to {MAX_FILES} files, lists {len(files)}")
    for name, entry in files.items():
        check_name(name)
        if (
            not isinstance(entry, dict)
            or set(entry) != {"bytes", "sha256"}
            or type(entry["bytes"]) is not int
            or entry["bytes"] < 0
            or not isinstance(entry["sha256"], str)
            or not _HEX64.fullmatch(entry["sha256"])
        ):
            raise WeightsRefused(
                f'{KEY}: {where}: the entry of {name!r} must be {{"bytes": a size, "sha256": 64 hex digits}}'
            )
    if "config.json" not in files:
        raise WeightsRefused(f"{KEY}: {where} lists no config.json: not a Hugging Face model folder")
    return files


def identity_of(files: dict[str, dict[str, Any]]) -> str:
    """What the weights are: the SHA-256 of the canonical file list, wherever the files lie."""
    canonical = json.dumps(files, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def _sha256_file(path: Path) -> str:
    # A file's checksum has one definition, trainer/checkpoint/digest.py. Imported here, not at the top:
    # the config reads this module (the fingerprint), and the package's __init__ would bring torch into
    # every config load; only hashing the files needs it.
    from trainer.checkpoint import digest

    return digest.file_hexdigest(None, str(path), "sha256")


def write_manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """Hash every file of a local model folder into its manifest. Refuses a folder with a file it would
    not load from a bucket (a pickle, code, a subfolder), so that what is staged is what was hashed."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{folder} is not a Hugging Face model folder (no config.json)")
    files = {}
    for p in sorted(folder.iterdir()):
        if p.name == MANIFEST or p.name.startswith("."):
            continue
        if not p.is_file() or p.is_symlink():
            raise ConfigError(f"{p}: only plain files can be listed (no folders or links)")
        check_name(p.name)
        files[p.name] = {"bytes": p.stat().st_size, "sha256": _sha256_file(p)}
    doc = {"format": FORMAT, "files": files}
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, folder / MANIFEST)
    return files


# Remote identities read in this process: the fingerprint is asked for more than once.
_REMOTE_IDENTITIES: dict[str, str] = {}


def _read_remote_manifest(uri: str) -> dict[str, dict[str, Any]]:
    fs, root = url_to_fs(uri)
    path = f"{root.rstrip('/')}/{MANIFEST}"

    def read() -> bytes:
        try:
            return read_bytes(
                fs, path, "weights_manifest", f"{redact(uri)}/{MANIFEST}", cap=MAX_MANIFEST_BYTES
            )
        except Refused as e:
            raise WeightsRefused(f"{KEY}: {e}") from None
        except FileNotFoundError:  # raised here, past retrying(): a missing manifest is not transient
            raise WeightsRefused(
                f"{KEY}: {redact(uri)} has no {MANIFEST}: stage the weights with "
                f"`python -m trainer.weights stage FOLDER {redact(uri)}`"
            ) from None

    raw = retrying(read, uri, f"{KEY}: reading {MANIFEST} under")
    return parse_manifest(raw, f"{redact(uri)}/{MANIFEST}")


def identity(path: str) -> str | None:
    """The weights' identity for the fingerprint: from the manifest, in a bucket (required there) or in
    a local folder (None without one: the folder's path stands for the weights, as before manifests)."""
    if is_remote(path):
        if path not in _REMOTE_IDENTITIES:
            _REMOTE_IDENTITIES[path] = identity_of(_read_remote_manifest(path))
        return _REMOTE_IDENTITIES[path]
    manifest = Path(local_path(path) or path) / MANIFEST
    if not manifest.is_file():
        return None
    return identity_of(parse_manifest(manifest.read_bytes(), str(manifest)))


def default_cache() -> Path:
    return Path(tempfile.gettempdir()) / "baton-weights"


def _copy_checked(fs: Any, src: str, dst: Path, name: str, entry: dict[str, Any], uri: str) -> None:
    from trainer.checkpoint import digest  # why here, not at the top: see _sha256_file

    h, n = digest.new("sha256"), 0

    def copy() -> None:
        nonlocal h, n
        h, n = digest.new("sha256"), 0
        with open_regular(fs, src, f"{redact(uri)}/{name}") as fin, open(dst, "wb") as fout:
            while chunk := fin.read(CHUNK):
                n += len(chunk)
                if n > entry["bytes"]:
                    break
                h.update(chunk)
                fout.write(chunk)

    try:
        retrying(copy, uri, f"{KEY}: copying {name} from")
    except Refused as e:  # not a regular file (a FIFO would block the copy for ever)
        raise WeightsRefused(f"{KEY}: {e}") from None
    if n != entry["bytes"] or h.hexdigest() != entry["sha256"]:
        got = f"more than {entry['bytes']}" if n > entry["bytes"] else str(n)
        raise WeightsRefused(
            f"{KEY}: {redact(uri)}/{name} does not match {MANIFEST} "
            f"({got} bytes, sha256 {h.hexdigest()[:12]}; the manifest says {entry['bytes']} "
            f"bytes, sha256 {entry['sha256'][:12]}): refused"
        )


def materialize(path: str, cache: str = "") -> Weights:
    """The model folder to load for `model.path`. A local folder is used where it lies. A bucket's
    weights are copied into `cache` once per machine: under a lock, into a folder beside the final one,
    every file checked, then renamed into place, so a copy is whole or absent and ranks that share the
    machine wait for the first one's copy instead of making their own."""
    t0 = time.perf_counter()
    if not is_remote(path):
        folder = Path(local_path(path) or path)
        return Weights(folder, str(folder), identity(path))
    files = _read_remote_manifest(path)
    ident = identity_of(files)
    root = Path(cache) if cache else default_cache()
    root.mkdir(parents=True, exist_ok=True)
    final = root / ident.removeprefix("sha256:")[:32]
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / MANIFEST).is_file() and identity_of(
            parse_manifest((final / MANIFEST).read_bytes(), str(final / MANIFEST))
        ) == ident:
            return Weights(final, path, ident, cached=True, seconds=time.perf_counter() - t0)
        shutil.rmtree(final, ignore_errors=True)  # a copy from another manifest under a colliding prefix
        partial = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        try:
            fs, base = url_to_fs(path)
            base = base.rstrip("/")
            copied = 0
            for i, (name, entry) in enumerate(sorted(files.items()), 1):
                _copy_checked(fs, f"{base}/{name}", partial / name, name, entry, path)
                copied += entry["bytes"]
                print(
                    f"[baton] weights {i}/{len(files)}: {name} ({entry['bytes']} bytes) from {redact(path)}",
                    file=sys.stderr,
                    flush=True,
                )
            (partial / MANIFEST).write_text(json.dumps({"format": FORMAT, "files": files}, sort_keys=True))
            os.replace(partial, final)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    return Weights(final, path, ident, copied_bytes=copied, seconds=time.perf_counter() - t0)


def stage(folder: Path, uri: str) -> str:
    """Copy a local model folder to a bucket for `model.path`: its manifest (written if missing, or
    checked against the files), every file, and the manifest last, so a reader sees all or nothing."""
    folder = Path(folder)
    manifest = folder / MANIFEST
    files = (
        write_manifest(folder)
        if not manifest.is_file()
        else parse_manifest(manifest.read_bytes(), str(manifest))
    )
    for name, entry in files.items():
        p = folder / name
        if not p.is_file() or p.stat().st_size != entry["bytes"] or _sha256_file(p) != entry["sha256"]:
            raise ConfigError(
                f"{p} does not match {manifest}: run `python -m trainer.weights manifest {folder}`"
            )
    fs, base = url_to_fs(uri)
    base = base.rstrip("/")
    for i, name in enumerate(sorted(files), 1):
        retrying(lambda n=name: fs.put_file(str(folder / n), f"{base}/{n}"), uri, f"staging {name} to")
        print(f"staged {i}/{len(files)}: {name}", file=sys.stderr, flush=True)
    body = json.dumps({"format": FORMAT, "files": files}, indent=1, sort_keys=True).encode() + b"\n"
    retrying(lambda: fs.pipe_file(f"{base}/{MANIFEST}", body), uri, f"staging {MANIFEST} to")
    return identity_of(files)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m trainer.weights",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manifest", help="write FOLDER/baton-weights.json")
    m.add_argument("folder", type=Path)
    s = sub.add_parser("stage", help="copy FOLDER (with its manifest) to a bucket URI")
    s.add_argument("folder", type=Path)
    s.add_argument("uri")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "manifest":
            print(identity_of(write_manifest(args.folder)))
        else:
            print(stage(args.folder, args.uri))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
