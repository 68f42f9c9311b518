"""Reading the evidence: the record lines that `steps.train --evidence` copies into the bucket."""

from __future__ import annotations

import json
import os
from typing import Any

from trainer.records import once
from trainer.storage import is_local, url_to_fs


def read_evidence(uri: str) -> list[dict[str, Any]]:
    """Every record under an evidence folder (all `*.jsonl`), in file then line order; a pod event that
    several nodes of one job wrote is kept once (trainer.records.once)."""
    fs, base = url_to_fs(uri)
    fs.invalidate_cache()
    try:
        paths = sorted(p for p in fs.ls(base, detail=False) if p.endswith(".jsonl"))
    except FileNotFoundError:
        return []
    out: list[dict[str, Any]] = []
    for p in paths:
        with fs.open(p, "r") as f:
            for line in f.read().splitlines():
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line cut by a kill mid-write
    return once(out)


def write_json(uri: str, obj: Any) -> None:
    """Write ``obj`` so that a reader (or a step's next attempt) sees the old document or the new one, never
    half of one: a local file is written aside and renamed over; an object store's PUT is already whole."""
    fs, path = url_to_fs(uri)
    text = json.dumps(obj, indent=1, sort_keys=True)
    if is_local(fs):  # on object stores, makedirs would create a missing bucket instead of failing
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        write_local_atomic(path, text.encode())
        return
    with fs.open(path, "w") as f:
        f.write(text)


def write_local_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write a local file aside (same folder), flush it to disk and rename it over ``path``."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def put_atomic(fs: Any, local: str | os.PathLike, path: str) -> None:
    """Copy a local file to ``path`` on ``fs`` whole or not at all (see write_json)."""
    if is_local(fs):
        with open(local, "rb") as f:
            write_local_atomic(path, f.read())
    else:
        fs.put_file(os.fspath(local), path)


def read_json(uri: str) -> Any:
    fs, path = url_to_fs(uri)
    with fs.open(path, "r") as f:
        return json.loads(f.read())
