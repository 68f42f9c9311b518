"""The rounds of a job that spans several pods: where node 0's rendezvous store listens this round,
published in the bucket, and the rule that keeps a pod from joining a round that is already over.

Argo retries each pod of a group on its own, so rounds overlap: node 1's next attempt can start while
node 0's previous attempt still runs (waiting out the collective timeout after node 1 was lost, say).
torchrun's static rendezvous has no notion of a round (its workers use the agent's store with no prefix:
torch/distributed/rendezvous.py, _create_c10d_store), so a pod that reached the previous round's store
would join a group that is over. Here:

- node 0, at each start, picks a port (never the previous round's) and publishes
  `<folder>/node-0.json` = {round, addr, port, pod}; `round` is new at every start;
- node I > 0 remembers in `<folder>/node-I.json` the round it joined last, and joins only a round
  newer than that one: an attempt of node 0 that started after node I's previous group ended.

Argo never runs two attempts of one pod at once, so a newer round of node 0 means the node 0 that
hosted the previous round has ended. A node 0 that finished the run (`done` in node-0.json) ends the
wait with nothing to do; one that ended with 1 (`failed`: nothing retries it) ends it with 1. Every file here is read as untrusted: a malformed one counts as absent.
"""

from __future__ import annotations

import json
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from steps.evidence import write_json
from trainer.storage import url_to_fs

WAIT_REPORT_EVERY_S = 10.0


@dataclass(frozen=True)
class Round:
    """One round of the group: node 0's store address and port, and the round's id."""

    round_id: str
    addr: str
    port: int


def _read(folder: str, name: str) -> dict[str, Any] | None:
    fs, base = url_to_fs(folder)
    try:
        fs.invalidate_cache()
        with fs.open(f"{base.rstrip('/')}/{name}", "r") as f:
            doc = json.loads(f.read(65536))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _round_of(doc: dict[str, Any] | None) -> Round | None:
    if doc is None:
        return None
    rid, addr, port = doc.get("round"), doc.get("addr"), doc.get("port")
    if (not isinstance(rid, str) or not isinstance(addr, str) or not addr or len(addr) > 253
            or isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
        return None
    return Round(rid, addr, port)


def free_port(avoid: int | None = None) -> int:
    """A port free on this host now (the kernel's pick), never `avoid`."""
    while True:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        if port != avoid:
            return port


def _publish(folder: str, rnd: Round, pod: str, state: str) -> None:
    write_json(f"{folder.rstrip('/')}/node-0.json", {"round": rnd.round_id, "addr": rnd.addr, "port": rnd.port,
                                                     "pod": pod, "state": state, "time": time.time()})


def host(folder: str, addr: str, pod: str, port: int = 0) -> Round:
    """Node 0: publish a new round at `addr` (`port`, or 0: a free one other than the last round's)."""
    last = _round_of(_read(folder, "node-0.json"))
    if not port:
        port = free_port(last.port if last else None)
    rnd = Round(uuid.uuid4().hex[:12], addr, port)
    _publish(folder, rnd, pod, "running")
    return rnd


def end(folder: str, rnd: Round, pod: str, state: str) -> None:
    """Node 0 ended for good: `done` (it finished the run) or `failed` (it ended with 1, which nothing
    retries). A node that comes back after it has nothing to wait for."""
    if state not in ("done", "failed"):
        raise ValueError(f"a round ends done or failed, not {state!r}")
    _publish(folder, rnd, pod, state)


def join(folder: str, node: int, pod: str, timeout_s: float, stop: Callable[[], bool],
         poll_s: float = 0.2) -> Round | str:
    """Node `node` > 0: wait for a round of node 0 newer than the one this node joined last, record it
    as joined and return it; or "done" (node 0 finished the run), "failed" (node 0 ended for good),
    "stopped" (`stop()` became true) or "timeout"."""
    mine = _read(folder, f"node-{node}.json") or {}
    last = mine.get("joined") if isinstance(mine.get("joined"), str) else None
    start = reported = time.monotonic()
    while True:
        doc = _read(folder, "node-0.json")
        rnd = _round_of(doc)
        if rnd is not None and doc.get("state") in ("done", "failed"):
            return doc["state"]
        if rnd is not None and rnd.round_id != last:
            write_json(f"{folder.rstrip('/')}/node-{node}.json", {"joined": rnd.round_id, "pod": pod, "time": time.time()})
            return rnd
        if stop():
            return "stopped"
        now = time.monotonic()
        if now - start > timeout_s:
            return "timeout"
        if now - reported >= WAIT_REPORT_EVERY_S:
            reported = now
            print(f"[steps.train] node {node}: waiting {now - start:.0f} s for node 0's next round "
                  f"(last joined: {last or 'none'})", file=sys.stderr)
        time.sleep(poll_s)
