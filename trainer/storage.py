"""fsspec in one place: which filesystem a URI means, the options every opener gets, and the errors.

One code path for file://, s3:// and gs:// (and plain local paths): every reader and writer in the
project opens through `url_to_fs` / `storage_options`, and nothing branches on the scheme beyond
the options chosen here. There is no storage class hierarchy.

- s3://: `BATON_S3_ENDPOINT` points s3fs at any S3-compatible API (MinIO, a local moto server).
  Credentials come from the environment or botocore's usual chain (env, shared files, IMDS, IRSA),
  never from the URI and never into a log line or an error message. botocore retries throttling,
  5xx and connection errors in its "standard" mode, `BATON_S3_MAX_ATTEMPTS` times in all (default
  5); s3fs adds its own retries for dropped connections. The listings cache is off, and every
  filesystem is a fresh instance, so a `_COMMIT` written by another process is seen at once.
- gs://: gcsfs (the `gcs` extra), credentials from Application Default Credentials / Workload Identity.
- file:// and plain paths: parent folders are created on write (`auto_mkdir`).

`StorageError` is a `ConfigError`: the CLI prints it as `error: ...` and exits 1.
"""

from __future__ import annotations

import importlib
import os
import random
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

import fsspec
from fsspec import AbstractFileSystem

from trainer.config import ConfigError

T = TypeVar("T")
DEFAULT_S3_MAX_ATTEMPTS = 5
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "GOOGLE_OAUTH_ACCESS_TOKEN")


class StorageError(ConfigError):
    """A store that cannot be used: unreachable, missing bucket, no or wrong credentials, or still
    failing after the retries. The message names the URI and holds no credentials."""


def redact(text: str) -> str:
    """`text` with `user:secret@` in URLs, signatures and the values of credential variables removed."""
    text = re.sub(r"(://)[^/@\s]+@", r"\1***@", text)
    text = re.sub(r"(?i)(signature|credential|x-amz-security-token|access_?key(_?id)?|secret[a-z_]*)=[^&\s'\"]+",
                  r"\1=***", text)
    for name in _SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def _s3_max_attempts() -> int:
    raw = os.environ.get("BATON_S3_MAX_ATTEMPTS", "")
    try:
        n = int(raw) if raw else DEFAULT_S3_MAX_ATTEMPTS
    except ValueError:
        raise ConfigError(f"BATON_S3_MAX_ATTEMPTS must be a positive integer, got {raw!r}") from None
    if n < 1:
        raise ConfigError(f"BATON_S3_MAX_ATTEMPTS must be a positive integer, got {raw!r}")
    return n


# Storage clients that draw from Python's global `random` (botocore's retry jitter, aiohttp's pool)
# would advance the training's Python RNG whenever a request is retried, so a run under storage
# faults would no longer be bit-identical. They get a generator of their own instead.
_LIBRARY_RANDOM = random.Random()
_LIBRARY_MODULES = ("botocore.retries.standard", "botocore.retryhandler", "botocore.utils", "aiohttp.connector")
_isolated = False


def isolate_library_randomness() -> None:
    """Point the storage libraries' module-level `random` (and botocore's bound default for its
    backoff jitter) at a private generator. Idempotent; a module that is not installed is skipped."""
    global _isolated
    if _isolated:
        return
    _isolated = True
    for name in _LIBRARY_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(module, "random", None) is random:
            module.random = _LIBRARY_RANDOM
    try:
        from botocore.retries.standard import ExponentialBackoff
    except ImportError:
        return
    defaults = ExponentialBackoff.__init__.__defaults__ or ()
    ExponentialBackoff.__init__.__defaults__ = tuple(
        _LIBRARY_RANDOM.random if d == random.random else d for d in defaults)


def storage_options(uri: str) -> dict[str, Any]:
    if uri.startswith(("s3://", "s3a://")):
        isolate_library_randomness()
        opts: dict[str, Any] = {
            "use_listings_cache": False,
            "skip_instance_cache": True,
            "config_kwargs": {"retries": {"max_attempts": _s3_max_attempts(), "mode": "standard"},
                              "connect_timeout": 10, "read_timeout": 60},
        }
        endpoint = os.environ.get("BATON_S3_ENDPOINT")
        if endpoint:
            opts["client_kwargs"] = {"endpoint_url": endpoint}
        return opts
    if uri.startswith(("gs://", "gcs://")):
        return {"skip_instance_cache": True}
    if uri.startswith("file://") or "://" not in uri:
        return {"auto_mkdir": True}
    return {}


def url_to_fs(uri: str) -> tuple[AbstractFileSystem, str]:
    """(filesystem, path without scheme). Local paths become absolute."""
    if "://" not in uri:
        uri = os.path.abspath(uri)
    try:
        fs, path = fsspec.core.url_to_fs(uri, **storage_options(uri))
    except ImportError as e:
        raise StorageError(f"{redact(uri)}: this scheme needs a package that is not installed ({e}); "
                           "gs:// needs gcsfs (pip install 'baton[gcs]')") from None
    return fs, path


def is_local(fs: AbstractFileSystem) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "file" in protocols or "local" in protocols


def full_url(fs: AbstractFileSystem, path: str) -> str:
    """A path that fsspec listed (no scheme) turned back into a URL that DCP's fsspec writer accepts."""
    if is_local(fs):
        return "file://" + path
    proto = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
    return f"{proto}://{path}"


def describe(e: BaseException) -> str:
    """One line about a storage failure, for an error message: the kind and the server's words."""
    failures = getattr(e, "failures", None)  # DCP's CheckpointException: {rank: (exception, traceback)}
    if isinstance(failures, dict) and failures:
        rank, wrapped = min(failures.items(), key=lambda kv: kv[0])
        inner = wrapped[0] if isinstance(wrapped, tuple) and wrapped else wrapped
        if isinstance(inner, BaseException):
            return f"rank {rank}: {describe(inner)}"
    kind = {FileNotFoundError: "not found (a missing bucket or path)", PermissionError: "access denied"}.get(
        type(e), type(e).__name__)
    text = str(e).splitlines()[0] if str(e) else ""
    name = type(e).__name__
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        kind = "no usable credentials (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a role)"
    elif name in ("EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError", "ConnectionRefusedError"):
        kind = "endpoint unreachable"
    elif "InvalidAccessKeyId" in text or "SignatureDoesNotMatch" in text:
        kind = "credentials refused"
    return redact(f"{kind}: {text}"[:400])


def storage_error(uri: str, what: str, e: BaseException) -> StorageError:
    return StorageError(f"{what} {redact(uri)} failed: {describe(e)}")


_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)


def retrying(fn: Callable[[], T], uri: str, what: str, attempts: int = 4, base_s: float = 0.25) -> T:
    """`fn()`, retried with exponential backoff on transient errors: a layer above botocore's own
    retries, for the small writes and deletes that decide what counts as committed. Permanent errors
    (not found, access denied) and the last failure become a StorageError naming `uri`; the
    project's own exceptions pass through."""
    for i in range(attempts):
        try:
            return fn()
        except Exception as e:
            if type(e).__module__.startswith("trainer."):
                raise
            if isinstance(e, _PERMANENT) or i == attempts - 1:
                raise storage_error(uri, what, e) from None
        time.sleep(base_s * 2**i)
    raise AssertionError("unreachable")
