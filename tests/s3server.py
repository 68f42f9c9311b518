"""A live S3 API for the tests, and a loopback proxy that counts, delays, breaks and intercepts requests
(in front of this S3 API or of tests/gcsserver.py's GCS API alike).

- `S3Endpoint.start()`: moto's threaded server on 127.0.0.1 and a free port, or, when
  `BATON_S3_ENDPOINT` is already set (a real MinIO, say), that endpoint instead, with the
  credentials from the environment. Either way one bucket exists afterwards; `stop()` stops moto.
- `FaultProxy(upstream)`: a threaded HTTP/1.1 proxy between s3fs and the endpoint. It logs every
  request it forwards (what reached the server), and per test it can add latency, answer 5xx
  instead of forwarding, or reset the connection, a bounded number of times. A `hook` sees every
  request before and after forwarding (the SIGKILL tests use it to kill a trainer at an exact
  request). It shuts itself down after `lifetime_s` whatever happens to the test.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing-key-id",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-key",
    "AWS_DEFAULT_REGION": "us-east-1",
}
_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "content-length",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def boto3_client(endpoint: str, env: dict[str, str]):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=env.get("AWS_DEFAULT_REGION", "us-east-1"),
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
        aws_session_token=env.get("AWS_SESSION_TOKEN"),
    )


class CheckpointLayout:
    """Where a trainer's checkpoints lie in a bucket, read through the endpoint's own `keys(root)`
    (object keys under a root, relative to it): shared by S3Endpoint and tests/gcsserver.GCSEndpoint."""

    def keys(self, uri: str) -> list[str]:
        raise NotImplementedError

    def step_uri(self, root: str, step: int) -> str:
        """The one `runs/<run_id>/step-<step>` folder under a checkpoint root."""
        hits = {k.split("/step-")[0] for k in self.keys(root) if f"/step-{step:08d}/" in k}
        assert len(hits) == 1, f"expected one step-{step:08d} under {root}, found {hits}"
        return f"{root.rstrip('/')}/{hits.pop()}/step-{step:08d}"

    def steps(self, root: str) -> dict[int, set[str]]:
        """step -> the file names in its folder, for every step folder under a root."""
        out: dict[int, set[str]] = {}
        for k in self.keys(root):
            parts = k.split("/")
            if len(parts) == 4 and parts[0] == "runs" and parts[2].startswith("step-"):
                out.setdefault(int(parts[2].removeprefix("step-")), set()).add(parts[3])
        return out


class S3Endpoint(CheckpointLayout):
    """moto on loopback (stopped by `stop`), or the external endpoint named by `BATON_S3_ENDPOINT`."""

    scheme = "s3"
    max_attempts_var = "BATON_S3_MAX_ATTEMPTS"

    def __init__(self) -> None:
        self.external = os.environ.get("BATON_S3_ENDPOINT") or None
        self.server = None
        self.url = ""
        self.bucket = os.environ.get("BATON_TEST_S3_BUCKET", "baton-test")
        if self.external:
            keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION")
            self.credentials = {k: os.environ[k] for k in keys if k in os.environ}
            self.credentials.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        else:
            self.credentials = dict(DUMMY_CREDENTIALS)
        self.secret = self.credentials.get("AWS_SECRET_ACCESS_KEY", "")  # what no message may show

    def start(self) -> S3Endpoint:
        if self.external:
            self.url = self.external.rstrip("/")
        else:
            import logging

            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.ERROR)

            port = free_port()
            self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
            self.server.start()
            self.url = f"http://127.0.0.1:{port}"
        client = self.client()
        try:
            client.head_bucket(Bucket=self.bucket)
        except Exception:
            client.create_bucket(Bucket=self.bucket)
        return self

    def client(self, endpoint: str | None = None):
        return boto3_client(endpoint or self.url, self.credentials)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def new_prefix(self, name: str) -> str:
        """A fresh `s3://bucket/<name>-<random>` root, so tests never see each other's objects."""
        return f"s3://{self.bucket}/{name}-{uuid.uuid4().hex[:8]}"

    def env(self, endpoint: str | None = None, **extra: str) -> dict[str, str]:
        """A trainer subprocess's environment: this endpoint (or a proxy's) and the credentials."""
        from tests.helpers import base_env

        return base_env(**self.credentials, BATON_S3_ENDPOINT=endpoint or self.url, **extra)

    def endpoint_env(self, endpoint: str) -> dict[str, str]:
        """The variables that point this process's s3fs at `endpoint` (for monkeypatch.setenv)."""
        return {"BATON_S3_ENDPOINT": endpoint}

    @staticmethod
    def without_credentials(env: dict[str, str], tmp_path) -> dict[str, str]:
        """`env` with no usable S3 credentials anywhere (and no instance-metadata lookup)."""
        env = {k: v for k, v in env.items() if not k.startswith("AWS_")}
        return env | {
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
            "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    # -- what a request through the proxy does --
    @staticmethod
    def op(method: str, path: str, body: bytes) -> tuple[str, str]:
        """(list | put | get | head | delete | other, object key or "") of an S3 request (path-style).
        A multi-object delete gives its XML body in place of a key."""
        u = urlsplit(path)
        bucket, _, key = u.path.lstrip("/").partition("/")
        key = unquote(key)
        if method == "GET" and not key and "list-type=2" in u.query:
            return "list", unquote(
                dict(kv.partition("=")[::2] for kv in u.query.split("&")).get("prefix", "")
            )
        if method == "POST" and "delete" in u.query.split("&"):
            return "delete", unquote(body.decode(errors="replace"))
        if method in ("PUT", "POST") and key:
            return "put", key
        return {"GET": "get", "HEAD": "head", "DELETE": "delete"}.get(method, "other"), key

    # -- objects, through boto3 (not through the code under test) --
    @staticmethod
    def split(uri: str) -> tuple[str, str]:
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        return bucket, key

    def keys(self, uri: str) -> list[str]:
        """Every key under `uri` (a prefix), relative to it."""
        bucket, prefix = self.split(uri.rstrip("/") + "/")
        out = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out += [o["Key"].removeprefix(prefix) for o in page.get("Contents", [])]
        return sorted(out)

    def copy(self, src: str, dst: str) -> None:
        client = self.client()
        sb, sp = self.split(src.rstrip("/") + "/")
        db, dp = self.split(dst.rstrip("/") + "/")
        for k in self.keys(src):
            client.copy_object(Bucket=db, Key=dp + k, CopySource={"Bucket": sb, "Key": sp + k})

    def download(self, src: str, dst) -> None:
        from pathlib import Path

        client = self.client()
        sb, sp = self.split(src.rstrip("/") + "/")
        for k in self.keys(src):
            target = Path(dst) / k
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(client.get_object(Bucket=sb, Key=sp + k)["Body"].read())

    def read(self, uri: str) -> bytes:
        bucket, key = self.split(uri)
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def write(self, uri: str, data: bytes) -> None:
        bucket, key = self.split(uri)
        self.client().put_object(Bucket=bucket, Key=key, Body=data)


@dataclass
class Faults:
    """What the proxy does to matching requests. Everything is bounded by `max_faults`.

    Every `every`-th matching request is broken (5xx and resets alternate through `kinds`); every
    forwarded request waits `delay_s` first. `match(method, path, body)` picks the requests (all by
    default); an endpoint's `op(method, path, body)` tells which object a request touches.
    """

    every: int = 0
    kinds: tuple[str, ...] = ("503", "reset")
    max_faults: int = 0
    delay_s: float = 0.0  # at most 5 s per request
    match: Callable[[str, str, bytes], bool] | None = None
    seen: int = 0
    injected: list[tuple[str, str, str, bytes]] = field(default_factory=list)  # kind, method, path, body


class FaultProxy:
    def __init__(self, upstream: str, lifetime_s: float = 600.0) -> None:
        u = urlsplit(upstream)
        self.up_host, self.up_port = u.hostname or "127.0.0.1", u.port or 80
        # (method, path?query, the body's first 4 KiB) of every request forwarded upstream
        self.log: list[tuple[str, str, bytes]] = []
        self.lock = threading.Lock()
        self.faults = Faults()
        # hook(phase, method, path, body) with phase "before" (not yet forwarded) or "after" (the server
        # has answered, the client not yet); returning "drop" resets the client's connection instead.
        self.hook: Callable[[str, str, str, bytes], str | None] | None = None
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as separate writes

            def log_message(self, *args) -> None:  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    parts = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(parts)
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _reset(self) -> None:
                # RST instead of FIN: the client sees "connection reset by peer".
                with contextlib.suppress(OSError):
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.close()

            def _handle(self) -> None:
                method, path = self.command, self.path
                body = self._body()
                if proxy.hook and proxy.hook("before", method, path, body) == "drop":
                    return self._reset()
                verdict = proxy._decide(method, path, body)
                if verdict == "reset":
                    return self._reset()
                if verdict is not None:
                    payload = (
                        f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>ServiceUnavailable</Code>"
                        f"<Message>injected {verdict}</Message></Error>"
                    ).encode()
                    if method == "HEAD":
                        payload = b""
                    self.send_response(int(verdict))
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                delay = proxy.faults.delay_s
                if delay and (proxy.faults.match is None or proxy.faults.match(method, path, body)):
                    time.sleep(min(delay, 5.0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                if method not in ("GET", "HEAD", "DELETE") or body:
                    headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(proxy.up_host, proxy.up_port, timeout=60)
                try:
                    conn.request(method, path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    with proxy.lock:
                        proxy.log.append((method, path, body[:4096]))
                    if proxy.hook and proxy.hook("after", method, path, body) == "drop":
                        return self._reset()
                    self.send_response_only(resp.status, resp.reason)
                    for k, v in resp.getheaders():
                        if k.lower() not in _HOP:
                            self.send_header(k, v)
                    if method == "HEAD":
                        if resp.getheader("Content-Length") is not None:
                            self.send_header("Content-Length", resp.getheader("Content-Length"))
                    else:
                        self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if method != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._timer = threading.Timer(lifetime_s, self.stop)
        self._timer.daemon = True
        self._stopped = False

    def _decide(self, method: str, path: str, body: bytes) -> str | None:
        f = self.faults
        with self.lock:
            if (
                not f.every
                or len(f.injected) >= f.max_faults
                or (f.match and not f.match(method, path, body))
            ):
                return None
            f.seen += 1
            if f.seen % f.every:
                return None
            kind = f.kinds[len(f.injected) % len(f.kinds)]
            f.injected.append((kind, method, path, body[:4096]))
            return kind

    def start(self) -> FaultProxy:
        self._thread.start()
        self._timer.start()
        return self

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._timer.cancel()
            self.server.shutdown()
            self.server.server_close()

    def set_faults(self, **kw) -> Faults:
        with self.lock:
            self.faults = Faults(**kw)
        return self.faults

    def requests(self) -> list[tuple[str, str, bytes]]:
        with self.lock:
            return list(self.log)

    def clear(self) -> None:
        with self.lock:
            self.log.clear()
