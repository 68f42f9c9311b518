"""A small Kubernetes REST client for the local cluster: the node agent's and the cluster script's calls.

Plain HTTPS with `requests` (already installed as a dependency of the pinned `kubernetes` client), rather
than the `kubernetes` package's generated models: the node agent handles pods as the JSON the API server
sends, fields it does not know included, and writes status back as JSON merge patches.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import requests


class ApiError(Exception):
    """An API call that answered an HTTP error: the status code and the server's own message."""

    def __init__(self, code: int, message: str, reason: str = ""):
        super().__init__(f"{code} {reason}: {message}".strip())
        self.code = code
        self.reason = reason
        self.message = message


class Kube:
    """Calls one API server with a bearer token, checking its certificate against the cluster's CA."""

    def __init__(self, server: str, token: str, ca_file: str, timeout: float = 30.0):
        self.server = server.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.session.verify = ca_file
        # Not the environment's: REQUESTS_CA_BUNDLE would override `verify`, and a proxy variable would send
        # loopback calls elsewhere.
        self.session.trust_env = False

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                params: dict[str, Any] | None = None, ok404: bool = False) -> dict[str, Any] | None:
        data = None if body is None else json.dumps(body)
        r = self.session.request(method, self.server + path, data=data, params=params,
                                 headers={"Content-Type": content_type}, timeout=self.timeout)
        if r.status_code == 404 and ok404:
            return None
        if r.status_code >= 400:
            raise _error(r)
        return r.json() if r.content else {}

    def get(self, path: str, params: dict[str, Any] | None = None, ok404: bool = False) -> dict[str, Any] | None:
        return self.request("GET", path, params=params, ok404=ok404)

    def post(self, path: str, body: Any) -> dict[str, Any]:
        return self.request("POST", path, body) or {}

    def merge_patch(self, path: str, body: Any) -> dict[str, Any]:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json") or {}

    def delete(self, path: str, body: Any = None) -> dict[str, Any] | None:
        return self.request("DELETE", path, body, ok404=True)

    def watch(self, path: str, params: dict[str, Any], timeout_seconds: int = 300) -> Iterator[dict[str, Any]]:
        """The events of one watch call (JSON lines), until the server ends it after timeout_seconds."""
        p = dict(params, watch="true", timeoutSeconds=str(timeout_seconds), allowWatchBookmarks="true")
        with self.session.get(self.server + path, params=p, stream=True,
                              timeout=(self.timeout, timeout_seconds + 30)) as r:
            if r.status_code >= 400:
                raise _error(r)
            for line in r.iter_lines():
                if line:
                    yield json.loads(line)


def _error(r: requests.Response) -> ApiError:
    try:
        status = r.json()
        return ApiError(r.status_code, status.get("message", r.text[:300]), status.get("reason", ""))
    except ValueError:
        return ApiError(r.status_code, r.text[:300])
