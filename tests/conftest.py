from __future__ import annotations

import contextlib
import os

import pytest

from tests.helpers import CORPUS


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny Qwen2 built from a config and saved with save_pretrained, once per session."""
    from trainer.data import read_documents
    from trainer.tiny import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("model") / "tiny-qwen2", read_documents(str(CORPUS)))


@contextlib.contextmanager
def _environment_restored(keys: tuple[str, ...]):
    """These variables of this process's environment as they were, once the block ends."""
    saved = {k: os.environ.get(k) for k in keys}
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_S3_ENV = (
    "BATON_S3_ENDPOINT",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
)


@pytest.fixture(scope="module")
def s3():
    """A live S3 API with one bucket: moto's threaded server on 127.0.0.1 and a free port, stopped
    after the module; or, when BATON_S3_ENDPOINT is already set (a real MinIO), that endpoint with the
    credentials from the environment. While it lives, this process's environment points s3fs at it
    (dummy keys for moto); `s3.env()` gives the same to a trainer subprocess."""
    from tests.s3server import S3Endpoint

    with _environment_restored(_S3_ENV):
        endpoint = S3Endpoint().start()
        os.environ.update(endpoint.credentials)
        os.environ["BATON_S3_ENDPOINT"] = endpoint.url
        try:
            yield endpoint
        finally:
            endpoint.stop()


@pytest.fixture
def s3_proxy(s3):
    """A FaultProxy in front of the S3 endpoint, stopped after the test."""
    from tests.s3server import FaultProxy

    proxy = FaultProxy(s3.url).start()
    try:
        yield proxy
    finally:
        proxy.stop()


_GCS_ENV = (
    "STORAGE_EMULATOR_HOST",
    "GCE_METADATA_HOST",
    "GCE_METADATA_IP",
    "NO_GCE_CHECK",
    "BATON_GCS_TOKEN",
    "BATON_GCS_HNS",
    "GOOGLE_APPLICATION_CREDENTIALS",
)


@pytest.fixture(scope="module")
def gcs():
    """A live GCS API with one bucket: fake-gcs-server (in memory, plain HTTP) on 127.0.0.1 and a free
    port, stopped after the module. While it lives, this process's gcsfs goes to it
    (STORAGE_EMULATOR_HOST, so anonymous access) and google-auth's metadata lookups go to a closed
    loopback port; `gcs.env()` gives the same to a subprocess."""
    from tests.gcsserver import GCSEndpoint, no_metadata_server

    with _environment_restored(_GCS_ENV):
        endpoint = GCSEndpoint().start()
        for k in ("BATON_GCS_TOKEN", "BATON_GCS_HNS", "GOOGLE_APPLICATION_CREDENTIALS"):
            os.environ.pop(k, None)
        os.environ.update(no_metadata_server(), STORAGE_EMULATOR_HOST=endpoint.url)
        try:
            yield endpoint
        finally:
            endpoint.stop()


@pytest.fixture(scope="module", params=["s3", "gs"])
def store_server(request):
    """Each object store in turn, with one interface (tests/s3server.py's S3Endpoint and
    tests/gcsserver.py's GCSEndpoint): the storage tests that are about the store run on both."""
    return request.getfixturevalue("s3" if request.param == "s3" else "gcs")


@pytest.fixture
def store_proxy(store_server):
    """A FaultProxy in front of the store's server, stopped after the test."""
    from tests.s3server import FaultProxy

    proxy = FaultProxy(store_server.url).start()
    try:
        yield proxy
    finally:
        proxy.stop()
