"""Credentials never reach a message, a record or a report: `redact` takes them out of any text.
No imports of the project's own but trainer.env (which has none), so that every module can use it
(records, storage, reports)."""

from __future__ import annotations

import os
import re

from trainer import env

_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "GOOGLE_OAUTH_ACCESS_TOKEN")


def redact(text: str) -> str:
    """`text` with `user:secret@` in URLs, signatures and the values of credential variables removed."""
    text = re.sub(r"(://)[^/@\s]+@", r"\1***@", text)
    text = re.sub(
        r"(?i)(signature|credential|x-amz-security-token|access_?key(_?id)?|access_?token|secret[a-z_]*)"
        r"=[^&\s'\"]+",
        r"\1=***",
        text,
    )
    text = re.sub(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+", r"\1***", text)
    for name in _SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    token = env.text("BATON_GCS_TOKEN")
    if len(token) >= 8 and token not in ("google_default", "anon"):  # a raw token or a key file's path
        text = text.replace(token, "***")
    return text
