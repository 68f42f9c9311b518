"""fsspec in one place: which filesystem a URI means, and the options every opener gets.

One code path for file://, s3:// and gs://. `BATON_S3_ENDPOINT` points s3:// at any S3-compatible
API (MinIO, a local moto server); credentials come from the environment or the cloud's usual chain.
"""

from __future__ import annotations

import os
from typing import Any

import fsspec
from fsspec import AbstractFileSystem


def storage_options(uri: str) -> dict[str, Any]:
    if uri.startswith(("s3://", "s3a://")):
        opts: dict[str, Any] = {"use_listings_cache": False, "skip_instance_cache": True}
        endpoint = os.environ.get("BATON_S3_ENDPOINT")
        if endpoint:
            opts["client_kwargs"] = {"endpoint_url": endpoint}
        return opts
    if uri.startswith("gs://"):
        return {"skip_instance_cache": True}
    return {}


def url_to_fs(uri: str) -> tuple[AbstractFileSystem, str]:
    """(filesystem, path without scheme). Local paths become absolute."""
    if "://" not in uri:
        uri = os.path.abspath(uri)
    fs, path = fsspec.core.url_to_fs(uri, **storage_options(uri))
    return fs, path


def full_url(fs: AbstractFileSystem, path: str) -> str:
    """A path that fsspec listed (no scheme) turned back into a URL that DCP's fsspec writer accepts."""
    proto = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
    if proto in ("file", "local"):
        return "file://" + path
    return f"{proto}://{path}"
