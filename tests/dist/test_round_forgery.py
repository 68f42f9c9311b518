"""No code from a peer: a node joins only a round that its own drill signed, and baton's collectives carry
no pickles.

The attacker has write access to the bucket (the rounds folder) and runs a listener on loopback where a
"store" of theirs would be. Each attack has its control: signed with the drill's key, the same round file
does send node 1 to the attacker; torch's object collectives do run the attacker's pickle."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest

from steps.lib import group
from tests.helpers import REPO, base_env

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

KEY = "this-drill-workflow-uid-0001"
PY = sys.executable


class Listener:
    """A TCP listener on loopback that counts the connections it gets (the attacker's store)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def listener():
    ln = Listener()
    yield ln
    ln.close()


def node1(rounds, timeout_s: float = 4) -> subprocess.CompletedProcess:
    """Node 1 of a 2-node group, alone: it waits for node 0's round in `rounds` and tries to join it.
    Nothing trains (the trainer starts only after the rendezvous), so no config is needed."""
    cmd = [
        PY,
        "-m",
        "steps.train",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--rendezvous",
        str(rounds),
        "--rendezvous-timeout",
        str(timeout_s),
        "--nproc",
        "1",
        "--name",
        "node-1-0",
        "--evidence",
        str(rounds.parent / "evidence"),
    ]
    return subprocess.run(
        cmd, capture_output=True, text=True, env=base_env(BATON_ROUND_KEY=KEY), cwd=REPO, timeout=120
    )


def plant(rounds, port: int, key: str | None, state: str = "running") -> None:
    doc = {
        "round": "attacker-1",
        "addr": "127.0.0.1",
        "port": port,
        "pod": "evil",
        "state": state,
        "time": time.time(),
    }
    rounds.mkdir(parents=True, exist_ok=True)
    if key is None:
        (rounds / "node-0.json").write_text(json.dumps(doc))
    else:
        group._write(str(rounds), "node-0.json", doc, key.encode())


@contextmanager
def acked(rounds, port: int):
    """What a node 0 holding the drill's key does while its round forms: acknowledge the nonce node 1 waits
    with (steps/lib/group.py), so that node 1 may join the planted round."""
    stop = threading.Event()
    rnd = group.Round("attacker-1", "127.0.0.1", port)

    def loop() -> None:
        while not stop.wait(0.05):
            group.acknowledge(str(rounds), rnd, "evil", 2, KEY.encode())

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


@pytest.mark.parametrize("forgery", ["unsigned", "signed with another key", "signed for another folder"])
def test_a_forged_round_file_sends_node_1_nowhere(tmp_path, listener, forgery):
    rounds = tmp_path / "trial" / "rounds"
    if forgery == "unsigned":
        plant(rounds, listener.port, None)
    elif forgery == "signed with another key":
        plant(rounds, listener.port, "another-drill-uid-000000")
    else:  # a valid file of this drill, copied from another role's rounds folder
        other = tmp_path / "reference" / "rounds"
        plant(other, listener.port, KEY)
        rounds.mkdir(parents=True)
        (rounds / "node-0.json").write_text((other / "node-0.json").read_text())
    p = node1(rounds)
    assert p.returncode == 75 and "no round of node 0 to join (timeout)" in p.stderr, p.stderr[-2000:]
    assert listener.connections == 0, "node 1 reached the attacker's store"


def test_control_the_signed_file_does_reach_the_store_and_the_wait_is_bounded(tmp_path, listener):
    """The same file signed with the drill's key: node 1 joins it and connects to the listener. Nothing
    there answers as a store, so torchrun's rendezvous fails, and steps.train writes the retry_later
    record itself and exits 75."""
    rounds = tmp_path / "trial" / "rounds"
    plant(rounds, listener.port, KEY)
    with acked(rounds, listener.port):
        p = node1(rounds, timeout_s=3)
    assert listener.connections >= 1, p.stderr[-2000:]
    assert p.returncode == 75 and "the group did not form" in p.stderr, p.stderr[-3000:]
    rec = next(json.loads(line) for line in p.stdout.splitlines() if '"retry_later"' in line)
    assert rec["reason"] == "round_not_formed" and rec["round"] == "attacker-1" and rec["attempt"] is None
    assert (
        json.loads((tmp_path / "trial" / "evidence" / "node-1-0.jsonl").read_text().splitlines()[-1]) == rec
    )


def test_a_replayed_round_of_this_drill_is_ignored_and_the_node_waits_for_a_fresh_one(tmp_path, listener):
    """A valid round file of an earlier attempt of this drill (signed with its key, for this folder, node 1's
    nonce of that attempt acknowledged), copied back over node 0's file: node 1's next attempt ignores it,
    as a foreign one, and never reaches that round's store. Controls: the replayed file passes the MAC check
    and names a round node 1 never joined, which is all the join rule used to ask; and the same round,
    acknowledging the new attempt's nonce, is joined."""
    rounds = tmp_path / "trial" / "rounds"
    plant(rounds, listener.port, KEY)
    with acked(rounds, listener.port):
        first = node1(rounds, timeout_s=2)  # the earlier attempt: joined, reached the store, ended 75
    assert listener.connections >= 1 and first.returncode == 75, first.stderr[-2000:]
    earlier = (rounds / "node-0.json").read_text()
    assert len(json.loads(earlier)["acks"]["1"]) == group.NONCE_LEN  # it acknowledged that attempt's nonce
    (
        rounds / "node-1.json"
    ).unlink()  # node 1 as if it had never joined: only the nonce can refuse the replay
    reached = listener.connections
    (rounds / "node-0.json").write_text(earlier)  # the replay
    assert group._read(str(rounds), "node-0.json", KEY.encode()) is not None  # control: its MAC is valid
    p = node1(rounds, timeout_s=2)
    assert p.returncode == 75 and "no round of node 0 to join (timeout)" in p.stderr, p.stderr[-2000:]
    assert listener.connections == reached, "node 1 joined the replayed round"
    (rounds / "node-0.json").write_text(earlier)
    with acked(rounds, listener.port):  # control: acknowledged afresh, the same round is joined
        p = node1(rounds, timeout_s=2)
    assert listener.connections > reached, p.stderr[-2000:]


def test_a_round_at_an_address_where_nothing_listens_ends_with_75_after_the_rendezvous_timeout(tmp_path):
    """torchrun's static rendezvous retries the connection for its `timeout`: --rendezvous-timeout, not its
    own default of 600 s (the store's client names the bound it gave up after)."""
    with socket.socket() as s:  # a loopback port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rounds = tmp_path / "trial" / "rounds"
    plant(rounds, port, KEY)
    with acked(rounds, port):
        p = node1(rounds, timeout_s=3)
    assert p.returncode == 75 and "round_not_formed" in p.stdout, p.stderr[-3000:]
    assert f"joins round attacker-1 at 127.0.0.1:{port}" in p.stderr  # control: it did try that address
    assert "timed out after 3000ms" in p.stderr, p.stderr[-2000:]


def test_a_planted_failed_state_is_ignored_unless_signed(tmp_path):
    rounds = tmp_path / "trial" / "rounds"
    plant(rounds, 1, None, state="failed")
    p = node1(rounds, timeout_s=2)
    assert p.returncode == 75, p.stderr[-2000:]  # not 1, which nothing retries
    plant(rounds, 1, KEY, state="failed")  # control: node 0's own `failed` ends the node with 1
    p = node1(rounds, timeout_s=2)
    assert p.returncode == 1 and "nothing retries" in p.stderr, p.stderr[-2000:]


def test_a_rendezvous_without_the_key_is_a_config_error(tmp_path):
    cmd = [
        PY,
        "-m",
        "steps.train",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--rendezvous",
        str(tmp_path),
        "--nproc",
        "1",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=base_env(), cwd=REPO, timeout=60)
    assert p.returncode == 1 and "BATON_ROUND_KEY must hold the drill's secret" in p.stderr, p.stderr


@pytest.mark.parametrize("mode", ["torch", "baton"])
def test_a_peers_pickle_runs_under_torchs_object_collectives_and_never_under_batons(tmp_path, mode):
    marker = tmp_path / "marker"
    cmd = [
        PY,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(REPO / "tests" / "dist" / "peer_pickle.py"),
        str(marker),
        mode,
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=base_env(), cwd=REPO, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    if mode == "torch":
        assert marker.exists(), "control: torch's broadcast_object_list unpickled the gadget"
    else:
        assert not marker.exists(), "a peer's pickle ran"
        assert "REFUSED broadcast" in p.stdout and "REFUSED gather" in p.stdout, p.stdout


def _node1_workflow(rounds, key_value: str) -> dict:
    """One pod under the local runner: node 1 of a group, its key from the container's env as the drill
    renders it (`{{workflow.uid}}`), waiting for node 0's round in `rounds`."""
    args = [
        "-m",
        "steps.train",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--rendezvous",
        str(rounds),
        "--rendezvous-timeout",
        "3",
        "--nproc",
        "1",
    ]
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "forged-"},
        "spec": {
            "entrypoint": "main",
            "templates": [
                {"name": "main", "dag": {"tasks": [{"name": "trial", "template": "node1"}]}},
                {
                    "name": "node1",
                    "container": {
                        "image": "baton:test",
                        "command": [PY],
                        "args": args,
                        "env": [{"name": "BATON_ROUND_KEY", "value": key_value}],
                    },
                },
            ],
        },
    }


def test_under_run_a_forged_round_file_is_refused_and_the_signed_one_is_joined(tmp_path, listener):
    """The local runner gives the pod the Workflow's uid as its key, as Argo does: a file planted in the
    bucket beforehand, which cannot know that uid, is refused (the pod joins nothing and ends with 75).
    Control: the same runner with a key the planter knows joins the planted round."""
    import io

    from workflows.local import run_workflow

    rounds = tmp_path / "bucket" / "rounds" / "trial"
    plant(rounds, listener.port, None)  # unsigned
    forged = rounds / "node-0.json"
    guess = group._mac(KEY.encode(), str(rounds), "node-0.json", json.loads(forged.read_text()))
    forged.write_text(
        json.dumps({**json.loads(forged.read_text()), "mac": guess})
    )  # signed with a guessed key
    res = run_workflow(
        _node1_workflow(rounds, "{{workflow.uid}}"),
        tmp_path / "out",
        progress=io.StringIO(),
        cwd=REPO,
        env={"PYTHONPATH": str(REPO)},
    )
    assert res.phase == "Failed" and listener.connections == 0
    log = next((tmp_path / "out").rglob("*.log")).read_text()
    assert "no round of node 0 to join (timeout)" in log, log[-2000:]
    with acked(rounds, listener.port):
        res = run_workflow(
            _node1_workflow(rounds, KEY),
            tmp_path / "out2",
            progress=io.StringIO(),
            cwd=REPO,
            env={"PYTHONPATH": str(REPO)},
        )
    assert listener.connections >= 1, "control: with the planter's key the pod joins the planted round"
