"""Reading the evidence: the record lines that `steps.train --evidence` copies into the bucket."""

from __future__ import annotations

import json
from typing import Any

from trainer.storage import is_local, url_to_fs


def read_evidence(uri: str) -> list[dict[str, Any]]:
    """Every record under an evidence folder (all `*.jsonl`), in file then line order."""
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
    return out


def write_json(uri: str, obj: Any) -> None:
    fs, path = url_to_fs(uri)
    if is_local(fs):  # on object stores, makedirs would create a missing bucket instead of failing
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "w") as f:
        f.write(json.dumps(obj, indent=1, sort_keys=True))


def read_json(uri: str) -> Any:
    fs, path = url_to_fs(uri)
    with fs.open(path, "r") as f:
        return json.loads(f.read())
