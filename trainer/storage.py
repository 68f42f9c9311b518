"""fsspec in one place: which filesystem a URI means, the options every opener gets, and the errors.

One code path for file://, s3:// and gs:// (and plain local paths): every reader and writer in the
project opens through `url_to_fs` / `storage_options`, and nothing branches on the scheme beyond
the options chosen here and `create_only_supported` (the conditional write only gs:// offers). The
one class defined here is gcsfs's, with baton's retries (below).

- s3://: `BATON_S3_ENDPOINT` points s3fs at any S3-compatible API (MinIO, a local moto server).
  Credentials come from the environment or botocore's usual chain (env, shared files, IMDS, IRSA),
  never from the URI and never into a log line or an error message. botocore retries throttling,
  5xx and connection errors in its "standard" mode, `BATON_S3_MAX_ATTEMPTS` times in all (default
  5); s3fs adds its own retries for dropped connections. The listings cache is off, and every
  filesystem is a fresh instance, so a `_COMMIT` written by another process is seen at once.
- gs://: gcsfs (the `gcs` extra), by default its plain JSON-API class `gcsfs.core.GCSFileSystem`, not the
  `ExtendedGcsFileSystem` that gcsfs makes the default (`GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT`): that
  class asks each bucket for its storage layout over gRPC, does not cache a failed lookup, and against
  a server that does not answer it (an emulator, a network that blocks gRPC) waits about 60 s per call
  -- never acceptable inside a preemption grace. `BATON_GCS_HNS=1` opts in to it (zonal buckets need
  it; the bucket infra/gke creates is a regional one). Credentials: Application Default Credentials
  (`token="google_default"`: Workload Identity on GKE, GOOGLE_APPLICATION_CREDENTIALS elsewhere),
  never gcsfs's silent fall back to anonymous access; `STORAGE_EMULATOR_HOST` (read by every GCS
  client) points gcsfs at an emulator and makes the access anonymous, as google-cloud-storage does;
  `BATON_GCS_TOKEN` overrides either (`anon`, `google_default`, or a service-account JSON file).
  Requests are tried `BATON_GCS_MAX_ATTEMPTS` times in all (default 6, gcsfs's own count), classified
  by gcsfs, with botocore's full-jitter backoff; the listings cache is off and instances are fresh.
- file:// and plain paths: parent folders are created on write (`auto_mkdir`).

`StorageError` is a `ConfigError`: the CLI prints it as `error: ...` and exits 1.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import fsspec
from fsspec import AbstractFileSystem

from trainer import env
from trainer.redaction import redact  # noqa: F401 - storage errors redact with it; callers import it from here
from trainer.validation import ConfigError

T = TypeVar("T")


class StorageError(ConfigError):
    """A store that cannot be used: unreachable, missing bucket, no or wrong credentials, or still
    failing after the retries. The message names the URI and holds no credentials."""


def _max_attempts(var: str) -> int:
    try:
        return int(env.number(var))
    except env.EnvError as e:  # a StorageError's parent: the CLI reports it as a config error, exit 1
        raise ConfigError(str(e)) from None


def _s3_max_attempts() -> int:
    return _max_attempts("BATON_S3_MAX_ATTEMPTS")


# Storage clients that draw from Python's global `random` (botocore's retry jitter, aiohttp's pool)
# would advance the training's Python RNG whenever a request is retried, so a run under storage
# faults would no longer be bit-identical. They get a generator of their own instead.
_LIBRARY_RANDOM = random.Random()
_LIBRARY_MODULES = (
    "botocore.retries.standard",
    "botocore.retryhandler",
    "botocore.utils",
    "aiohttp.connector",
    "gcsfs.retry",
)
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
        _LIBRARY_RANDOM.random if d == random.random else d for d in defaults
    )


def storage_options(uri: str) -> dict[str, Any]:
    if uri.startswith(("s3://", "s3a://")):
        isolate_library_randomness()
        opts: dict[str, Any] = {
            "use_listings_cache": False,
            "skip_instance_cache": True,
            "config_kwargs": {
                "retries": {"max_attempts": _s3_max_attempts(), "mode": "standard"},
                "connect_timeout": 10,
                "read_timeout": 60,
            },
        }
        endpoint = env.text("BATON_S3_ENDPOINT")
        if endpoint:
            opts["client_kwargs"] = {"endpoint_url": endpoint}
        return opts
    if uri.startswith(("gs://", "gcs://")):
        isolate_library_randomness()
        use_gcs_filesystem()
        return {
            "skip_instance_cache": True,
            "use_listings_cache": False,
            "token": gcs_token(),
            "requests_timeout": _gcs_timeout(),
        }
    if uri.startswith("file://") or "://" not in uri:
        return {"auto_mkdir": True}
    return {}


def url_to_fs(uri: str) -> tuple[AbstractFileSystem, str]:
    """(filesystem, path without scheme). Local paths become absolute. A client that cannot even be
    built (gcsfs resolves its credentials here) is a StorageError naming the URI."""
    if "://" not in uri:
        uri = os.path.abspath(uri)
    try:
        fs, path = fsspec.core.url_to_fs(uri, **storage_options(uri))
    except ImportError as e:
        raise StorageError(
            f"{redact(uri)}: this scheme needs a package that is not installed ({e}); "
            "gs:// needs gcsfs (pip install 'baton[gcs]')"
        ) from None
    except ConfigError:
        raise
    except Exception as e:
        raise storage_error(uri, "connecting to", e) from None
    return fs, path


# ---- gs:// --------------------------------------------------------------------------------------------

_gcs_class: type | None = None


def _flag(name: str) -> bool:
    try:
        return env.flag(name)
    except env.EnvError as e:
        raise ConfigError(str(e)) from None


def gcs_token() -> str:
    """gcsfs's `token`: BATON_GCS_TOKEN, else "anon" against an emulator (STORAGE_EMULATOR_HOST), else
    Application Default Credentials. Never None: gcsfs would then try ADC, its token cache and the GCE
    metadata server in turn and fall back to anonymous access without a word."""
    explicit = env.text("BATON_GCS_TOKEN")
    if explicit:
        return explicit
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
    return "anon" if emulator and emulator != "default" else "google_default"


def _gcs_timeout() -> Any:
    # As for s3://: a connection that cannot be made fails in 10 s, a stalled read in 60 s (aiohttp's
    # default is one 5-minute limit for the whole request).
    import aiohttp

    return aiohttp.ClientTimeout(sock_connect=10, sock_read=60)


def gcs_filesystem_class() -> type:
    """The class gs:// means here: gcsfs.core.GCSFileSystem (ExtendedGcsFileSystem with BATON_GCS_HNS=1),
    with its request retries counted by BATON_GCS_MAX_ATTEMPTS and its backoff jitter drawn from a
    private generator (gcsfs's own draws from the global `random`, which the training seeds)."""
    global _gcs_class
    if _gcs_class is not None:
        return _gcs_class
    import gcsfs.core
    from gcsfs.retry import is_retriable

    base: type = gcsfs.core.GCSFileSystem
    if _flag("BATON_GCS_HNS"):
        from gcsfs.extended_gcsfs import ExtendedGcsFileSystem

        base = ExtendedGcsFileSystem
    once = gcsfs.core.GCSFileSystem._request.__wrapped__  # one request, without gcsfs's retry_request

    async def _request(self, *args: Any, **kwargs: Any) -> Any:
        attempts = _max_attempts("BATON_GCS_MAX_ATTEMPTS")
        for i in range(attempts):
            if i:  # botocore's "standard" full jitter, as for s3:// (gcsfs's own waits 1-2 s at the first)
                await asyncio.sleep(_LIBRARY_RANDOM.random() * min(2 ** (i - 1), 20))
            try:
                return await once(self, *args, **kwargs)
            except Exception as e:
                if i == attempts - 1 or getattr(e, "status", None) == 404 or not is_retriable(e):
                    raise
        raise AssertionError("unreachable")

    async def _mv_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        # Copy, then delete (what gcsfs falls back to anyway): its objects.moveTo needs a permission
        # beyond create/get/list/delete (the Terraform grants just those), and an emulator refuses it.
        # The only rename here is DCP's small .metadata.tmp -> .metadata.
        await self._cp_file(path1, path2)
        await self._rm_file(path1)

    _gcs_class = type(
        "BatonGCSFileSystem", (base,), {"_request": _request, "_mv_file": _mv_file, "__module__": __name__}
    )
    return _gcs_class


def use_gcs_filesystem() -> None:
    """Register `gcs_filesystem_class()` for gs:// and gcs:// in fsspec (DCP's fsspec reader and writer
    resolve their filesystem there too)."""
    cls = gcs_filesystem_class()
    for proto in ("gs", "gcs"):
        if fsspec.registry.get(proto) is not cls:
            fsspec.register_implementation(proto, cls, clobber=True)


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
        type(e), type(e).__name__
    )
    text = str(e).splitlines()[0] if str(e) else ""
    name = type(e).__name__
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        kind = "no usable credentials (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a role)"
    elif name == "DefaultCredentialsError":  # google-auth: no Application Default Credentials
        kind = (
            "no usable credentials (Workload Identity on GKE, GOOGLE_APPLICATION_CREDENTIALS, "
            "or BATON_GCS_TOKEN)"
        )
    elif name in (
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ClientConnectorError",
        "ConnectionRefusedError",
        "ClientConnectorDNSError",
        "ServerTimeoutError",
    ):
        kind = "endpoint unreachable"
    elif (
        "InvalidAccessKeyId" in text
        or "SignatureDoesNotMatch" in text
        or (name == "HttpError" and getattr(e, "code", None) == 401)
        or name == "RefreshError"
    ):
        kind = "credentials refused"
    elif text.startswith("Forbidden:"):  # gcsfs's 403
        kind = "access denied"
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


def create_only_supported(fs: AbstractFileSystem) -> bool:
    """Whether `fs` can write an object only if none exists, in one request: GCS's
    `ifGenerationMatch=0`, which gcsfs sends for `pipe_file(..., mode="create")`. s3fs exposes no
    such write (S3's If-None-Match), and file:// keeps its list-then-write like s3://."""
    return _gcs_class is not None and isinstance(fs, _gcs_class)


def create_only(fs: AbstractFileSystem, path: str, data: bytes) -> bool:
    """Write `data` at `path` only if no object is there. True: written by this call, or found there
    with exactly these bytes (a retry after a lost answer: the first try had landed). False: someone
    else's object is there. Needs `create_only_supported(fs)`. The data must be small: one request
    (gcsfs's simple upload below 50 MB; fake-gcs-server honours the precondition only there)."""
    try:
        fs.pipe_file(path, data, mode="create")
        return True
    except FileExistsError:
        return fs.cat_file(path) == data


def local_path(uri: str) -> str | None:
    """The filesystem path of a file:// URI or plain path; None for remote stores."""
    if uri.startswith("file://"):
        return uri.removeprefix("file://")
    if "://" not in uri:
        return os.path.abspath(uri)
    return None
