"""Reading the evidence: the record lines that `steps.train --evidence` copies into the bucket."""

from __future__ import annotations

import json
import math
import os
from typing import Any

from trainer.records import once
from trainer.storage import is_local, url_to_fs
from trainer.untrusted import Refused, read_json_lines
from trainer.untrusted import read_json as untrusted_read_json

# What a reader relies on in a record, by type (trainer/records.py writes every one of these; the contract
# in docs/records.md). Fields not named here are accepted as they are: a trainer may add its own.
_COUNT = "a non-negative integer"
_NUMBER = "a number"
_TEXT = "a string"


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_number(v: Any) -> bool:
    # records.py writes a non-finite float as its name ("nan", "inf"), so that the line stays JSON
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)) or v in NONFINITE


NONFINITE = ("nan", "inf", "-inf")
_RULES: dict[str, tuple[Any, str]] = {
    "event": (lambda v: isinstance(v, str) and 0 < len(v) <= 64, _TEXT),
    "step": (_is_count, _COUNT),
    "attempt": (_is_count, _COUNT),
    "rank": (_is_count, _COUNT),
    "time": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v), _NUMBER),
}
_REQUIRED = ("event", "step", "attempt")
_DIGEST = "a digest (a string of at most 128 characters, or an integer)"


def _is_digest(v: Any) -> bool:
    return (isinstance(v, str) and 0 < len(v) <= 128) or (isinstance(v, int) and not isinstance(v, bool))


_BY_EVENT: dict[str, dict[str, tuple[Any, str]]] = {
    # The trajectory's fields (steps/lib/trajectory.py) are compared with ==: a list or a dict there would compare
    # too, but nothing a trainer is meant to write.
    "step": {
        "loss": (_is_number, _NUMBER),
        "lr": (lambda v: v is None or _is_number(v), _NUMBER),
        "batch_sha": (_is_digest, _DIGEST),
        "rng_sha": (_is_digest, _DIGEST),
        "batch_rng_sha": (_is_digest, _DIGEST),
    },
    "resume": {"from_step": (_is_count, _COUNT), "fresh": (lambda v: isinstance(v, bool), "true or false")},
    "preempt": {
        "during": (lambda v: v is None or isinstance(v, str), _TEXT),
        "save_ms": (lambda v: v is None or _is_number(v), _NUMBER),
        "grace_left_s": (lambda v: v is None or _is_number(v), _NUMBER),
    },
    "start": {
        "weights_sha": (lambda v: isinstance(v, str) and 0 < len(v) <= 128, _TEXT),
        "optim_sha": (lambda v: isinstance(v, str) and 0 < len(v) <= 128, _TEXT),
    },
}
_REQUIRED_BY_EVENT = {
    "start": ("weights_sha",),
    "resume": ("time",),
    "preempt": ("time",),
}  # verify orders them by (attempt, time)


def check_record(rec: dict[str, Any]) -> str | None:
    """Why `rec` cannot be used as a record (the first field that is missing or of the wrong type), or
    None. A `retry_later` or `failed` record that steps.train wrote itself (`source: steps.train`: its round
    never formed, or its trainer exited before writing a record) has `attempt: null`: no trainer claimed one."""
    event = rec.get("event")
    rules = {**_RULES, **_BY_EVENT.get(event if isinstance(event, str) else "", {})}
    required = (*_REQUIRED, *_REQUIRED_BY_EVENT.get(event if isinstance(event, str) else "", ()))
    own = rec.get("source") == "steps.train" and event in ("retry_later", "failed")
    for field, (ok, kind) in rules.items():
        if field == "attempt" and own and rec.get("attempt") is None:
            continue
        if field == "from_step" and rec.get("fresh") is True and "from_step" not in rec:
            continue
        if field not in rec:
            if field in required or (field == "from_step" and event == "resume"):
                return f"field {field!r} is missing"
            continue
        if not ok(rec[field]):
            return f"field {field!r} must be {kind}, not {shown(rec[field])}"
    return None


def shown(value: Any, limit: int = 40) -> str:
    """A value from a record, for a message: its JSON, cut to `limit` characters, control characters escaped."""
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= limit else text[:limit] + "..."


def read_evidence(
    uri: str, problems: list[str] | None = None, role: str | None = None
) -> list[dict[str, Any]]:
    """Every record under an evidence folder (all `*.jsonl`), in file then line order, each checked
    (`check_record`) before anything keys on its fields; a pod event that several nodes of one job wrote
    is kept once (trainer.records.once). A record or file that is refused is left out, and says why in
    `problems` (naming `role`, the file, the attempt and the field): untrusted input gives a report, never
    a traceback (trainer/untrusted.py)."""

    def refused(msg: str) -> None:
        if problems is not None:
            problems.append(f"{role + ': ' if role else ''}{msg}")

    fs, base = url_to_fs(uri)
    fs.invalidate_cache()
    try:
        paths = sorted(p for p in fs.ls(base, detail=False) if p.endswith(".jsonl"))
    except FileNotFoundError:
        return []
    out: list[dict[str, Any]] = []
    for p in paths:
        name = p.rsplit("/", 1)[-1]
        try:
            recs, cut = read_json_lines(fs, p, name)
        except FileNotFoundError:
            continue
        except Refused as e:
            refused(f"evidence refused: {e}")
            continue
        if cut:
            refused(f"{name}: {cut} line(s) are not JSON records (cut by a kill mid-write, or planted)")
        for rec in recs:
            why = check_record(rec)
            if why is None:
                out.append(rec)
            else:
                attempt = rec.get("attempt")
                refused(
                    f"{name}: a {shown(rec.get('event'), 20)} record"
                    f"{f' of attempt {attempt}' if _is_count(attempt) else ''} is refused: {why}"
                )
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


def read_json(uri: str, kind: str = "step_json") -> dict[str, Any]:
    """A JSON object that a step wrote to the bucket (evictions.json, verify.json), read under its cap
    (trainer/untrusted.py): FileNotFoundError when absent, Refused when it is not such an object."""
    fs, path = url_to_fs(uri)
    return untrusted_read_json(fs, path, kind, what=uri.rsplit("/", 1)[-1])
