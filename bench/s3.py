"""A local S3 API for the bench: moto's ThreadedMotoServer on 127.0.0.1, in a child process of its own
(so that the server's request handling does not share the measuring process's GIL).

    with LocalS3() as s3:        # sets BATON_S3_ENDPOINT and dummy AWS keys in os.environ
        s3.uri("flush")          # -> s3://baton-bench/flush
    python -m bench.s3 PORT      # the child: serve until stdin closes
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from types import TracebackType

from bench.common import PY, REPO, child_env, free_port, log

BUCKET = "baton-bench"
DUMMY = {
    "AWS_ACCESS_KEY_ID": "bench-key-id",
    "AWS_SECRET_ACCESS_KEY": "bench-secret-key",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class LocalS3:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._saved_env: dict[str, str | None] = {}

    def __enter__(self) -> LocalS3:
        self.proc = subprocess.Popen(
            [PY, "-m", "bench.s3", str(self.port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=REPO,
            env=child_env(),
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("the local moto S3 server did not start") from None
                time.sleep(0.2)
        for k, v in {**DUMMY, "BATON_S3_ENDPOINT": self.url}.items():
            self._saved_env[k] = os.environ.get(k)
            os.environ[k] = v
        import boto3

        boto3.client("s3", endpoint_url=self.url, region_name="us-east-1").create_bucket(Bucket=BUCKET)
        log(f"moto S3 on {self.url} (pid {self.proc.pid})")
        return self

    def uri(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def serve(port: int) -> None:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        sys.stdin.read()  # until the parent closes our stdin (or dies)
    finally:
        server.stop()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
