"""A node other than 0 that ends with 1 for good marks it (steps/lib/group.py, fail), and node 0's next round
stops waiting for it at once, instead of waiting out torchrun's static rendezvous (--rendezvous-timeout).

Real steps.train and real torchrun (static rendezvous on loopback), 2 pods x 1 rank. The trainer of the
first round is a stand-in that writes one record and exits 1 (what a crash leaves): node 1's steps.train
decides 1 with no SIGTERM, node 0's (whose stand-in wrote `retry_later` `peer_lost`, as baton's trainer does
when its peer is gone) decides 75 and is retried. The retry hosts a new round, which node 1 never joins.
Controls: the mark removed, or present but not signed with the drill's key: node 0 waits until its
rendezvous timeout (20 s here), and ends with 1 from torchrun's timeout instead."""

from __future__ import annotations

import json
import time

import pytest

from steps.lib import group
from tests.dist.test_group_rounds import pods as pods  # noqa: F401 - every pod a test starts, killed at its end
from tests.dist.test_multinode import Pod
from tests.helpers import PY
from tests.helpers import base_env as _base_env

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

KEY = "k" * 8 + "this-drill-uid"
TIMEOUT_S = "20"

STAND_IN = """
import json, os, sys
rank = int(os.environ["RANK"])
print(json.dumps({"event": "step", "step": 1, "rank": rank, "attempt": 1, "time": 0}), flush=True)
if rank == 0:
    print(json.dumps({"event": "retry_later", "reason": "peer_lost", "step": 1, "rank": 0, "attempt": 1,
                      "time": 0}), flush=True)
sys.exit(1)
"""


def cmd(trainer, rdzv, node: int, attempt: int) -> list[str]:
    return [
        PY,
        "-m",
        "steps.train",
        "--nproc",
        "1",
        "--trainer",
        str(trainer),
        "--nnodes",
        "2",
        "--node-rank",
        str(node),
        "--rendezvous",
        str(rdzv),
        "--master-port",
        "0",
        "--rendezvous-timeout",
        TIMEOUT_S,
        "--name",
        f"node-{node}-{attempt}",
    ]


@pytest.mark.parametrize("mark", ["kept", "removed", "forged"])
def test_node_0_stops_waiting_for_a_node_that_failed_for_good(tmp_path, pods, mark):
    rdzv, trainer = tmp_path / "rounds", tmp_path / "stand_in.py"
    trainer.write_text(STAND_IN)
    env = _base_env(BATON_ROUND_KEY=KEY, BATON_GRACE="5")

    def start(node: int, attempt: int) -> Pod:
        pods.append(Pod(cmd(trainer, rdzv, node, attempt), env))
        return pods[-1]

    first = [start(0, 0), start(1, 0)]
    assert [p.wait(timeout=180) for p in first] == [75, 1], [p.err[-3000:] for p in first]
    old_round = json.loads((rdzv / "node-0.json").read_text())["round"]
    marked = json.loads((rdzv / "node-1.json").read_text())
    assert (marked["state"], marked["joined"], marked["pod"]) == ("failed", old_round, "node-1-0")
    assert group.failed_peers(str(rdzv), 2, KEY.encode()) == [1]
    if mark == "removed":  # node 1's file as a join leaves it: no mark
        (rdzv / "node-1.json").unlink()
        group._write(
            str(rdzv), "node-1.json", {"joined": old_round, "pod": "node-1-0", "time": 0}, KEY.encode()
        )
    elif mark == "forged":  # the mark, signed with another key: counts as absent
        (rdzv / "node-1.json").unlink()
        group._write(
            str(rdzv),
            "node-1.json",
            {**{k: v for k, v in marked.items() if k != "mac"}},
            b"another-drills-key-0123",
        )
    retry0 = start(0, 1)
    rc = retry0.wait(timeout=240)
    new = json.loads((rdzv / "node-0.json").read_text())
    assert new["round"] != old_round
    if mark == "kept":
        assert rc == 1, retry0.err[-3000:]
        assert new["state"] == "failed"  # node 1's retries, if any, stop at once too
        (failed,) = [r for r in retry0.records if r["event"] == "failed"]
        assert failed["reason"] == "peer_failed" and failed["node"] == 1 and failed["round"] == new["round"]
        assert "node 1 ended with 1 for good" in retry0.err
        assert "clients joined" not in retry0.err, retry0.err[-3000:]  # torchrun did not wait out its timeout
    else:  # the control: the wait ran to torchrun's rendezvous timeout, no trainer ran, and the round that did
        # not form is retried (75, `round_not_formed` naming node 1), as a slow replacement must be
        assert rc == 75, retry0.err[-3000:]
        assert new["state"] == "running"
        (later,) = [r for r in retry0.records if r["event"] == "retry_later"]
        assert (later["reason"], later["missing"], later["round"], later["node"]) == (
            "round_not_formed",
            [1],
            new["round"],
            0,
        ), later
        assert later["attempt"] is None and later["source"] == "steps.train" and later["step"] == 0
        assert not [r for r in retry0.records if r["event"] == "failed"]
        assert "ended with 1 for good" not in retry0.err
        # torch 2.13's static rendezvous: "Timed out after 21 seconds waiting for clients. 1/2 clients joined."
        assert "1/2 clients joined" in retry0.err, retry0.err[-3000:]


@pytest.mark.parametrize("newer", [True, False])
def test_a_node_leaves_a_round_that_node_0_gave_up_before_it_formed(tmp_path, pods, newer):
    """Node 1 joins a round whose store never answers (node 0's pod gone before its torchrun listened). Node 0
    comes back with a newer round: node 1 stops its torchrun at once and ends with 75 (`round_superseded`,
    naming the newer round), so its retry joins that one instead of missing it. Control: no newer round, and
    node 1 waits out its rendezvous timeout (20 s), ending with 75 `round_not_formed`."""
    rdzv, trainer = tmp_path / "rounds", tmp_path / "stand_in.py"
    trainer.write_text(STAND_IN)
    key = KEY.encode()
    old = group.host(str(rdzv), "127.0.0.1", "node-0-0", key, port=group.free_port())
    pods.append(Pod(cmd(trainer, rdzv, 1, 0), _base_env(BATON_ROUND_KEY=KEY, BATON_GRACE="5")))
    node1 = pods[-1]
    deadline = time.monotonic() + 120
    while (
        json.loads((rdzv / "node-1.json").read_text()).get("joined")
        if (rdzv / "node-1.json").exists()
        else None
    ) != old.round_id:
        assert node1.p.poll() is None and time.monotonic() < deadline, node1.err[-3000:]
        group.acknowledge(
            str(rdzv), old, "node-0-0", 2, key
        )  # what node 0's watch does while its round forms
        time.sleep(0.1)
    if newer:
        new = group.host(str(rdzv), "127.0.0.1", "node-0-1", key)
    rc = node1.wait(timeout=180)
    assert rc == 75, node1.err[-3000:]
    (later,) = [r for r in node1.records if r["event"] == "retry_later"]
    assert later["round"] == old.round_id and later["node"] == 1 and later["step"] == 0
    if newer:
        assert (later["reason"], later["by"]) == ("round_superseded", new.round_id), later
        assert f"node 0 published round {new.round_id} before round {old.round_id} formed" in node1.err
    else:
        assert later["reason"] == "round_not_formed" and "by" not in later, later
        assert "leaving it" not in node1.err
