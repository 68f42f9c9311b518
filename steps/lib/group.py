"""The rounds of a job that spans several pods: where node 0's rendezvous store listens this round,
published in the bucket, and the rule that keeps a pod from joining a round that is already over.

Argo retries each pod of a group on its own, so rounds overlap: node 1's next attempt can start while
node 0's previous attempt still runs (waiting out the collective timeout after node 1 was lost, say).
torchrun's static rendezvous has no notion of a round (its workers use the agent's store with no prefix:
torch/distributed/rendezvous.py, _create_c10d_store), so a pod that reached the previous round's store
would join a group that is over. Here:

- node 0, at each start, picks a port (never the previous round's) and publishes
  `<folder>/node-0.json` = {round, addr, port, pod, acks}; `round` is new at every start;
- node I > 0, at each start, writes a fresh nonce into `<folder>/node-I.json` (`waiting`), beside the round
  it joined last; node 0 acknowledges each waiting nonce in its round file (`acks`: node -> nonce) when it
  publishes the round and while the round forms (steps.train's RoundWatch);
- node I joins only a round that acknowledges this attempt's nonce and is newer than the one it joined last:
  an attempt of node 0 that started after node I's previous group ended, and that knew of this attempt.

Argo never runs two attempts of one pod at once, so a newer round of node 0 means the node 0 that
hosted the previous round has ended. A node 0 that finished the run (`done` in node-0.json) ends the
wait with nothing to do; one that ended with 1 (`failed`: nothing retries it) ends it with 1.

While torchrun forms a round, and until the trainer's first record, every node watches the round files
(steps.train, RoundWatch): node 0 its peers' marks (below), a node other than 0 node 0's file. A node
other than 0 whose round was abandoned (node 0 published a newer one, or ended) before its first record
stops its torchrun and ends with 75 and a `retry_later` record (`round_superseded`): its retry joins the
newer round, instead of waiting in the old one until its rendezvous timeout and missing the new one. Node 0
whose round did not form before its trainer wrote any record (torchrun's rendezvous timed out: a node
never came) ends with 75 and a `retry_later` record (`round_not_formed`, `missing`: the nodes whose files
do not name the round), as a node other than 0 does: a slow replacement (a new Spot VM, an image pull) is
retried, not failed for good.

A node other than 0 that ends with 1 for good (steps.train decided 1 without a SIGTERM: Argo records
"Error (exit code 1)", which the drill's retry expression never retries) marks it in its own file
(`state: failed`, `fail`). Node 0 cannot learn it from torchrun: its next round's static rendezvous would
wait for that node until its timeout. So node 0's steps.train polls its peers' files while torchrun runs
and before the trainer's first record (`failed_peers`), and on a mark ends with 1 at once. A retry of
that node (Argo retries an exit 1 only when the pod was deleted, and then steps.train was signalled and
marks nothing) clears the mark when it joins.

Every round file is authenticated: an HMAC-SHA256 (`mac`) over the folder, the file's name and every
other field, keyed by a per-drill secret that is not in the bucket (BATON_ROUND_KEY; the drill passes
its Workflow's uid, which only the Workflow holds). Anyone who can write to the bucket could otherwise
plant a node-0.json that sends node 1 to a store of their own, and the ranks of a group exchange
pickles inside DCP and accelerate: code would run. A file that fails the check, is malformed, is not a
regular file or is larger than its cap (trainer/untrusted.py) counts as absent. The MAC alone would not stop
a valid file of an earlier round of this drill copied back over a newer one (a replay): the nonce does,
since no earlier round can acknowledge a nonce drawn after it; a replayed round is ignored like a foreign
one, and the node waits for a fresh round.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from steps.lib.evidence import write_json
from trainer.storage import url_to_fs
from trainer.untrusted import Refused, read_json

WAIT_REPORT_EVERY_S = 10.0
PEER_POLL_S = 0.5  # how often node 0 reads its peers' files while its round forms (failed_peers, acknowledge)
KEY_ENV = "BATON_ROUND_KEY"
MIN_KEY_LEN = 16
NONCE_LEN = 32  # uuid4().hex: drawn by each attempt of a node > 0


@dataclass(frozen=True)
class Round:
    """One round of the group: node 0's store address and port, and the round's id."""

    round_id: str
    addr: str
    port: int


def round_key(environ: dict[str, str] | None = None) -> bytes:
    """The drill's secret for its round files, from BATON_ROUND_KEY; ValueError naming the variable when
    it is unset or shorter than MIN_KEY_LEN characters."""
    value = (os.environ if environ is None else environ).get(KEY_ENV, "")
    if len(value) < MIN_KEY_LEN:
        raise ValueError(
            f"{KEY_ENV} must hold the drill's secret (at least {MIN_KEY_LEN} characters; the "
            f"drill passes its Workflow's uid), {'not set' if not value else 'too short'}: a round "
            "file in the bucket is trusted only when it carries this key's signature"
        )
    return value.encode()


def _mac(key: bytes, folder: str, name: str, doc: dict[str, Any]) -> str:
    body = json.dumps(
        {"folder": folder.rstrip("/"), "file": name, "doc": {k: v for k, v in doc.items() if k != "mac"}},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def _write(folder: str, name: str, doc: dict[str, Any], key: bytes) -> None:
    write_json(f"{folder.rstrip('/')}/{name}", {**doc, "mac": _mac(key, folder, name, doc)})


def _read(folder: str, name: str, key: bytes) -> dict[str, Any] | None:
    """The round file `name`, or None when it is absent, unreadable, malformed or not signed by `key`."""
    fs, base = url_to_fs(folder)
    try:
        fs.invalidate_cache()
        doc = read_json(fs, f"{base.rstrip('/')}/{name}", "round", what=name)
    except (OSError, Refused):
        return None
    mac = doc.get("mac")
    if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(key, folder, name, doc)):
        return None
    return doc


def _round_of(doc: dict[str, Any] | None) -> Round | None:
    if doc is None:
        return None
    rid, addr, port = doc.get("round"), doc.get("addr"), doc.get("port")
    if (
        not isinstance(rid, str)
        or not isinstance(addr, str)
        or not addr
        or len(addr) > 253
        or isinstance(port, bool)
        or not isinstance(port, int)
        or not 0 < port < 65536
    ):
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


def _publish(
    folder: str, rnd: Round, pod: str, state: str, key: bytes, acks: dict[str, str] | None = None
) -> None:
    _write(
        folder,
        "node-0.json",
        {
            "round": rnd.round_id,
            "addr": rnd.addr,
            "port": rnd.port,
            "pod": pod,
            "state": state,
            "acks": acks or {},
            "time": time.time(),
        },
        key,
    )


def host(folder: str, addr: str, pod: str, key: bytes, port: int = 0, count: int = 1) -> Round:
    """Node 0: publish a new round at `addr` (`port`, or 0: a free one other than the last round's),
    signed with `key`, acknowledging the nodes 1 .. count-1 already waiting."""
    last = _round_of(_read(folder, "node-0.json", key))
    if not port:
        port = free_port(last.port if last else None)
    rnd = Round(uuid.uuid4().hex[:12], addr, port)
    _publish(folder, rnd, pod, "running", key, waiting(folder, count, key))
    return rnd


def waiting(folder: str, count: int, key: bytes) -> dict[str, str]:
    """The nonces of the nodes 1 .. count-1 waiting for a round, by node (as a string), from their signed files."""
    found = {}
    for i in range(1, count):
        nonce = (_read(folder, f"node-{i}.json", key) or {}).get("waiting")
        if isinstance(nonce, str) and len(nonce) == NONCE_LEN and all(c in "0123456789abcdef" for c in nonce):
            found[str(i)] = nonce
    return found


def acknowledge(folder: str, rnd: Round, pod: str, count: int, key: bytes) -> None:
    """Node 0, while round `rnd` forms: publish it again, with the nonce of each node now waiting, where the
    round file (still `rnd`, still running) lacks one."""
    doc = _read(folder, "node-0.json", key) or {}
    acks = doc.get("acks")
    if doc.get("round") != rnd.round_id or doc.get("state") != "running" or not isinstance(acks, dict):
        return
    now = {**acks, **waiting(folder, count, key)}
    if now != acks:
        _publish(folder, rnd, pod, "running", key, now)


def end(folder: str, rnd: Round, pod: str, state: str, key: bytes) -> None:
    """Node 0 ended for good: `done` (it finished the run) or `failed` (it ended with 1, which nothing
    retries). A node that comes back after it has nothing to wait for."""
    if state not in ("done", "failed"):
        raise ValueError(f"a round ends done or failed, not {state!r}")
    _publish(folder, rnd, pod, state, key)


def join(
    folder: str,
    node: int,
    pod: str,
    key: bytes,
    timeout_s: float,
    stop: Callable[[], bool],
    poll_s: float = 0.2,
) -> Round | str:
    """Node `node` > 0: announce a fresh nonce, then wait for a round of node 0 (signed with `key`) that
    acknowledges it and is newer than the one this node joined last; record it as joined and return it. Or
    "done" (node 0 finished the run), "failed" (node 0 ended for good), "stopped" (`stop()` became true) or
    "timeout"."""
    mine = _read(folder, f"node-{node}.json", key) or {}
    last = mine.get("joined") if isinstance(mine.get("joined"), str) else None
    nonce = uuid.uuid4().hex
    _write(
        folder, f"node-{node}.json", {"joined": last, "waiting": nonce, "pod": pod, "time": time.time()}, key
    )
    start = reported = time.monotonic()
    while True:
        doc = _read(folder, "node-0.json", key)
        rnd = _round_of(doc)
        if rnd is not None and doc.get("state") in ("done", "failed"):
            return doc["state"]
        acks = doc.get("acks") if rnd is not None else None
        if (
            rnd is not None
            and rnd.round_id != last
            and isinstance(acks, dict)
            and acks.get(str(node)) == nonce
        ):
            _write(
                folder, f"node-{node}.json", {"joined": rnd.round_id, "pod": pod, "time": time.time()}, key
            )
            return rnd
        if stop():
            return "stopped"
        now = time.monotonic()
        if now - start > timeout_s:
            return "timeout"
        if now - reported >= WAIT_REPORT_EVERY_S:
            reported = now
            print(
                f"[steps.train] node {node}: waiting {now - start:.0f} s for node 0's next round "
                f"(last joined: {last or 'none'})",
                file=sys.stderr,
            )
        time.sleep(poll_s)


def fail(folder: str, node: int, pod: str, round_id: str, key: bytes) -> None:
    """Node `node` > 0 ended with 1 for good: mark it in its own file, signed with `key`, still naming the
    round it joined last (so the join rule holds for anything that comes after)."""
    if node < 1:
        raise ValueError("node 0 ends its rounds with end(); fail() is for the other nodes")
    _write(
        folder,
        f"node-{node}.json",
        {"joined": round_id, "pod": pod, "state": "failed", "time": time.time()},
        key,
    )


def failed_peers(folder: str, count: int, key: bytes) -> list[int]:
    """The nodes 1 .. count-1 whose own file (signed with `key`) says they ended with 1 for good."""
    return [
        i for i in range(1, count) if (_read(folder, f"node-{i}.json", key) or {}).get("state") == "failed"
    ]


def node0_round(folder: str, key: bytes) -> tuple[str | None, str | None]:
    """Node 0's newest round as its signed file says: (round id, state: running, done or failed); (None,
    None) when there is no valid file."""
    doc = _read(folder, "node-0.json", key)
    rnd = _round_of(doc)
    if rnd is None or doc is None:
        return None, None
    state = doc.get("state")
    return rnd.round_id, state if isinstance(state, str) else None


def joined_peers(folder: str, count: int, round_id: str, key: bytes) -> list[int]:
    """The nodes 1 .. count-1 whose own file (signed with `key`) says they joined round `round_id`."""
    return [
        i for i in range(1, count) if (_read(folder, f"node-{i}.json", key) or {}).get("joined") == round_id
    ]
