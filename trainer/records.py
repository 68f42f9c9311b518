"""The JSON Lines records on stdout: the evidence that the drill verifies.

Every record has `event`, `run_id`, `attempt`, `rank`, `time` and `step`; each is one line, flushed.
Human-readable logs go to stderr through `log`.
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any

from trainer.redaction import redact

# What a pod's PID 1 (steps.train) decides its exit code from. Global rank 0 writes every record; on a
# job of several nodes the first rank of each other node writes these too, with its own `rank`, so that
# every pod sees them. A reader of several pods' records counts each once: `once` below.
POD_EVENTS = frozenset({"step", "preempt", "retry_later", "done"})
UNCOMMITTED_FILE = "uncommitted_file"
"""The event of a file written into a committed checkpoint after its commit (the HF callback: `file`, `how`)."""
LOADER_WORKERS_KILLED = "loader_workers_killed"
"""The `reason` of a `failed` record whose trainer lost its data loader's workers in the middle of a step."""


class Records:
    def __init__(self, run_id: str, attempt: int, rank: int) -> None:
        self.run_id, self.attempt, self.rank = run_id, attempt, rank

    def emit(self, event: str, step: int, **fields: Any) -> dict[str, Any]:
        rec = _finite(
            {
                "event": event,
                "run_id": self.run_id,
                "attempt": self.attempt,
                "rank": self.rank,
                "time": round(time.time(), 3),
                "step": step,
                **fields,
            }
        )
        sys.stdout.write(json.dumps(rec, allow_nan=False) + "\n")
        sys.stdout.flush()
        return rec


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinite float replaced by its name as a string ("nan", "inf"), so a
    record is always valid JSON, which has no such numbers; and credentials in URLs redacted."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str) and "@" in value:  # a URL with user:secret@ in it
        return redact(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def log(msg: str) -> None:
    sys.stderr.write(f"[baton {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def once(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`records` with each pod event (POD_EVENTS) of an attempt and step kept once, in the copy that the
    lowest rank wrote: the copies that other nodes' first ranks wrote are dropped. Order is kept."""

    def key(r: dict[str, Any]) -> tuple:
        return r.get("run_id"), r.get("attempt"), r.get("event"), r.get("step")

    def rank(r: dict[str, Any]) -> int:
        return r["rank"] if isinstance(r.get("rank"), int) else 0

    lowest: dict[tuple, int] = {}
    for r in records:
        if r.get("event") in POD_EVENTS:
            lowest[key(r)] = min(lowest.get(key(r), rank(r)), rank(r))
    out, kept = [], set()
    for r in records:
        if r.get("event") in POD_EVENTS:
            if rank(r) != lowest[key(r)] or key(r) in kept:
                continue
            kept.add(key(r))
        out.append(r)
    return out


def read_records(text: str) -> list[dict[str, Any]]:
    """Records from a stream that may also hold other lines (a launcher's output)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and '"event"' in line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out
