"""Rounds that overlap (steps/lib/group.py): Argo retries each pod of a group on its own, so a lost node's
next attempt starts while the survivor still waits out the collective timeout. With `--rendezvous`,
the new attempt waits for node 0's next round instead of joining the one that is over; then the group
forms again and the run ends bit-identical to the same two ranks in one pod."""

from __future__ import annotations

import json
import threading

import pytest

from steps.lib import group
from tests.dist.test_multinode import Pod, equal_to, finish
from tests.dist.test_multinode import reference as reference  # noqa: F401 - the 2-rank fixture
from tests.dist.test_multirank import entry_cmd
from tests.dist.test_peer_faults import SETS, committed
from tests.helpers import base_env as _base_env

pytestmark = [pytest.mark.dist, pytest.mark.timeout(900)]


KEY = "k" * 8 + "this-drill-uid"
BKEY = KEY.encode()


def base_env(**extra: str) -> dict[str, str]:
    return _base_env(BATON_ROUND_KEY=KEY, **extra)


def rdzv_cmd(model, root, rdzv, node: int, attempt: int = 0) -> list[str]:
    return [
        *entry_cmd(model, root, *SETS, nproc=1),
        "--nnodes",
        "2",
        "--node-rank",
        str(node),
        "--rendezvous",
        str(rdzv),
        "--master-port",
        "0",
        "--name",
        f"node-{node}-{attempt}",
    ]


@pytest.fixture
def pods():
    """Every pod a test starts; whatever is still running at its end (a failed assertion) is killed."""
    started: list[Pod] = []
    yield started
    for pod in started:
        if pod.p.poll() is None:
            pod.kill_all()
            pod.wait()


def test_a_lost_nodes_retry_waits_for_node_0s_next_round_and_the_run_is_exact(
    tiny_model, reference, tmp_path, pods
):
    root, rdzv = tmp_path / "ckpt", tmp_path / "rounds"
    env = base_env(BATON_GRACE="5", BATON_PAUSE_AFTER_STEP="6")

    def start(node: int, attempt: int, env: dict[str, str]) -> Pod:
        pods.append(Pod(rdzv_cmd(tiny_model, root, rdzv, node, attempt), env))
        return pods[-1]

    first = [start(node, 0, env) for node in (0, 1)]
    first[0].wait_for("step", 6)
    old_round = json.loads((rdzv / "node-0.json").read_text())["round"]
    assert json.loads((rdzv / "node-1.json").read_text())["joined"] == old_round
    first[1].kill_all()  # node 1's VM is lost; Argo starts its retry at once
    retry1 = start(1, 1, base_env(BATON_GRACE="20"))
    assert first[0].wait() == 75, first[0].err[-3000:]  # peer_lost, after the collective timeout
    first[1].wait()
    # All that time node 1's retry waited: it joined no round and trained nothing.
    assert retry1.p.poll() is None and not retry1.records, retry1.err[-2000:]
    waiting = json.loads((rdzv / "node-1.json").read_text())
    assert (waiting["joined"], waiting["pod"], len(waiting["waiting"])) == (
        old_round,
        "node-1-1",
        group.NONCE_LEN,
    )
    assert committed(root) == [4]
    retry0 = start(0, 1, base_env(BATON_GRACE="20"))
    rcs = finish([retry0, retry1])
    assert rcs == [0, 0], [p.err[-2000:] for p in (retry0, retry1)]
    new_round = json.loads((rdzv / "node-0.json").read_text())
    assert new_round["round"] != old_round and new_round["state"] == "done"
    assert json.loads((rdzv / "node-1.json").read_text())["joined"] == new_round["round"]
    assert [r["from_step"] for r in retry0.records if r["event"] == "resume"] == [4]
    assert equal_to(reference, root)


def joined(folder: str, rnd: group.Round, pod: str, timeout_s: float = 5, stop=lambda: False):
    """group.join of node 1, with node 0 (round `rnd`, as steps.train's RoundWatch does) acknowledging the
    nonce it waits with."""
    result: list = []
    thread = threading.Thread(
        target=lambda: result.append(group.join(folder, 1, pod, BKEY, timeout_s, stop, poll_s=0.05)),
        daemon=True,
    )
    thread.start()
    while thread.is_alive():
        group.acknowledge(folder, rnd, "node-0", 2, BKEY)
        thread.join(0.05)
    return result[0]


def test_join_takes_only_a_round_newer_than_the_last_one_joined(tmp_path):
    folder = str(tmp_path)
    old = group.host(folder, "127.0.0.1", "pod-a", BKEY, count=2)
    assert joined(folder, old, "pod-b") == old  # the first round: joined
    # node 1's next attempt, node 0 still the same: it waits (here until its timeout), acknowledged or not.
    assert joined(folder, old, "pod-c", 0.3) == "timeout"
    assert joined(folder, old, "pod-c", stop=lambda: True) == "stopped"
    new = group.host(folder, "127.0.0.1", "pod-d", BKEY, count=2)
    assert new.round_id != old.round_id and new.port != old.port
    assert joined(folder, new, "pod-c") == new
    group.end(folder, new, "pod-d", "done", BKEY)
    assert joined(folder, new, "pod-e") == "done"
    group.end(
        folder, new, "pod-d", "failed", BKEY
    )  # node 0 ended with 1: nothing to wait for, and the retry says so
    assert joined(folder, new, "pod-e") == "failed"
    # The control: a node that forgot which round it joined (no node-1.json) takes the old one back.
    (tmp_path / "node-1.json").unlink()
    again = group.host(folder, "127.0.0.1", "pod-f", BKEY, count=2)
    group._write(folder, "node-1.json", {"joined": again.round_id}, BKEY)
    assert joined(folder, again, "pod-g", 0.3) == "timeout"
    (tmp_path / "node-1.json").unlink()
    assert joined(folder, again, "pod-g").round_id == again.round_id


def test_a_round_that_does_not_acknowledge_this_attempts_nonce_is_not_joined(tmp_path):
    """A round node 1 never joined, valid under the key, but published before this attempt drew its nonce
    (a replay, or a round that never heard of it): node 1 waits. Control: acknowledged, it is joined; and
    a round published while node 1 waits acknowledges it at once (node 0's start)."""
    folder = str(tmp_path)
    rnd = group.host(folder, "127.0.0.1", "pod-a", BKEY, count=2)
    assert group.join(folder, 1, "pod-b", BKEY, 0.3, lambda: False, poll_s=0.05) == "timeout"
    assert joined(folder, rnd, "pod-b") == rnd
    result: list = []
    thread = threading.Thread(
        target=lambda: result.append(group.join(folder, 1, "pod-c", BKEY, 5, lambda: False, poll_s=0.05)),
        daemon=True,
    )
    thread.start()
    while "waiting" not in json.loads((tmp_path / "node-1.json").read_text()):
        thread.join(0.02)
    fresh = group.host(folder, "127.0.0.1", "pod-d", BKEY, count=2)  # sees the waiting nonce: acknowledges it
    thread.join(10)
    assert result == [fresh]


@pytest.mark.parametrize(
    "doc",
    [
        '{"round": 1, "addr": "h", "port": 5}',
        '{"round": "r", "addr": "", "port": 5}',
        '{"round": "r", "addr": "h", "port": 70000}',
        '{"round": "r", "addr": "h", "port": true}',
        "[1, 2]",
        "not json",
        '{"round": "r", "addr": "h"}',
    ],
)
def test_a_malformed_round_file_counts_as_absent(tmp_path, doc):
    (tmp_path / "node-0.json").write_text(doc)
    assert group.join(str(tmp_path), 1, "pod", BKEY, 0.2, lambda: False, poll_s=0.05) == "timeout"


def test_a_group_whose_trainer_fails_ends_with_1_on_every_node_after_one_retry(tiny_model, tmp_path, pods):
    # A config error fails every rank before any record: node 0 exits 1 and marks its round failed; node 1,
    # which saw no record of its own (the group might not have formed), exits 75, and its retry ends with 1.
    root, rdzv = tmp_path / "ckpt", tmp_path / "rounds"
    env = base_env(BATON_GRACE="5")

    def start(node: int, attempt: int) -> Pod:
        pods.append(Pod([*rdzv_cmd(tiny_model, root, rdzv, node, attempt), "--set", "no_such_key=1"], env))
        return pods[-1]

    first = [start(0, 0), start(1, 0)]
    assert [p.wait() for p in first] == [1, 75], [p.err[-2000:] for p in first]
    assert json.loads((rdzv / "node-0.json").read_text())["state"] == "failed"
    retry = start(1, 1)
    assert retry.wait() == 1 and "nothing retries" in retry.err, retry.err[-2000:]
