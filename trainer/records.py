"""The JSON Lines records on stdout: the evidence that the drill verifies.

Every record has `event`, `run_id`, `attempt`, `rank`, `time` and `step`; each is one line, flushed.
Human-readable logs go to stderr through `log`.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


class Records:
    def __init__(self, run_id: str, attempt: int, rank: int) -> None:
        self.run_id, self.attempt, self.rank = run_id, attempt, rank

    def emit(self, event: str, step: int, **fields: Any) -> dict[str, Any]:
        rec = {"event": event, "run_id": self.run_id, "attempt": self.attempt, "rank": self.rank,
               "time": round(time.time(), 3), "step": step, **fields}
        sys.stdout.write(json.dumps(rec) + "\n")
        sys.stdout.flush()
        return rec


def log(msg: str) -> None:
    sys.stderr.write(f"[baton {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


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
