"""Two nodes: two `steps.train` pods, one gloo rank each, on loopback, through torchrun's static
rendezvous (`--nnodes 2 --node-rank I --master-addr 127.0.0.1`). A SIGTERM to either pod stops both
ranks at the same step, both pods exit 75, and the retry of the group is bit-identical to an
uninterrupted run of the same two ranks in one pod. A pod SIGKILLed (a lost VM) mid-step or mid-save
leaves the survivor to exit 75 with `peer_lost` within the collective timeout, nothing partial is
committed, and the retry is bit-identical.

What loopback cannot show: a wrong store host on a cluster (every pod here reaches 127.0.0.1), and a
rank-to-node mapping that matters (every rank's state is in the shared checkpoint under its global
rank, so two identical pods on one host cannot tell their node ranks apart). The retries start node 1
before node 0; with the static rendezvous node 1's records say rank 1 on every start."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.dist.test_multirank import entry_cmd, run_entry
from tests.dist.test_peer_faults import SETS, committed, equal_to
from tests.helpers import REPO, base_env, records, workers_of

pytestmark = [pytest.mark.dist, pytest.mark.timeout(900)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_cmd(model, root, node: int, port: int) -> list[str]:
    cmd = entry_cmd(model, root, *SETS, nproc=1)
    return [
        *cmd,
        "--nnodes",
        "2",
        "--node-rank",
        str(node),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
    ]


class Pod:
    """One node's PID 1, its stdout and stderr read as they come; `wait_for` waits for a record."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.p = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.err = ""
        self.eof = False
        self.seen = threading.Condition()
        self.readers = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for t in self.readers:
            t.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            with self.seen:
                self.lines.append(line)
                self.seen.notify_all()
        with self.seen:
            self.eof = True
            self.seen.notify_all()

    def _read_err(self) -> None:
        assert self.p.stderr is not None
        self.err = self.p.stderr.read()

    @property
    def records(self) -> list[dict]:
        with self.seen:
            return records("".join(self.lines))

    def wait_for(self, event: str, step: int, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        with self.seen:
            while not any(r["event"] == event and r["step"] == step for r in records("".join(self.lines))):
                assert not self.eof, f"the pod ended before a {event} record for step {step}"
                left = deadline - time.monotonic()
                assert left > 0, f"no {event} record for step {step} in {timeout} s"
                self.seen.wait(min(left, 1.0))

    def kill_all(self) -> None:
        """SIGKILL the pod whole: PID 1, torchrun and its worker (a lost VM)."""
        worker = workers_of(self.p.pid)
        os.killpg(self.p.pid, signal.SIGKILL)
        for pid in worker.values():  # torchrun's workers run in sessions of their own
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float = 300) -> int:
        rc = self.p.wait(timeout=timeout)
        for t in self.readers:
            t.join(timeout=30)
        return rc


def start_group(cmd_of, env_of, first: int = 0) -> list[Pod]:
    """The two pods of one attempt of a group, on a fresh port, started in the order `first`, then the
    other: `cmd_of(node, port)` and `env_of(node)` give each its command and environment."""
    port = free_port()
    pods = {node: Pod(cmd_of(node, port), env_of(node)) for node in (first, 1 - first)}
    return [pods[0], pods[1]]


def group(model, root, env: dict[str, str], first: int = 0) -> list[Pod]:
    """Baton's trainer on two nodes, both pods with the same environment."""
    return start_group(lambda node, port: node_cmd(model, root, node, port), lambda node: env, first)


def finish(pods: list[Pod]) -> list[int]:
    return [p.wait() for p in pods]


def retry_is_exact(model, root, reference, from_step: int, env=None, uri=None) -> None:
    """The group's next attempt (node 1 started first) runs to the end, resumes from `from_step` on both
    nodes, each node's records carry its own global rank, and the run ends equal to the reference.
    `uri`: the store as the pods name it (a faulty:// one), when it is not the folder `root`."""
    pods = group(model, uri or root, env or base_env(BATON_GRACE="20"), first=1)
    rcs = finish(pods)
    assert rcs == [0, 0], [p.err[-2000:] for p in pods]
    for node, pod in enumerate(pods):
        recs = pod.records
        assert {r["rank"] for r in recs} == {node}, (
            f"node {node} wrote records as {sorted({r['rank'] for r in recs})}"
        )
        assert [r["event"] for r in recs if r["event"] == "done"] == ["done"]
    assert [r["from_step"] for r in pods[0].records if r["event"] == "resume"] == [from_step]
    assert equal_to(reference, root)


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory):
    """The same two ranks, uninterrupted, in one pod."""
    root = tmp_path_factory.mktemp("ref-nodes")
    rc, recs, err = run_entry(entry_cmd(tiny_model, root, *SETS))
    assert rc == 0, err[-3000:]
    return root


@pytest.mark.parametrize("signalled", [0, 1])
def test_a_sigterm_to_either_node_stops_both_at_the_same_step_both_exit_75_and_the_retry_is_bit_identical(
    tiny_model, reference, tmp_path, signalled
):
    root = tmp_path / "ckpt"
    pods = group(tiny_model, root, base_env(BATON_GRACE="20", BATON_PAUSE_AFTER_STEP="6"))
    pods[signalled].wait_for("step", 6)
    os.kill(pods[signalled].p.pid, signal.SIGTERM)  # the kubelet signals one pod's PID 1
    rcs = finish(pods)
    assert rcs == [75, 75], [p.err[-2000:] for p in pods]
    stops = [
        [(r["rank"], r["step"], r["outcome"]) for r in p.records if r["event"] == "preempt"] for p in pods
    ]
    assert stops == [[(0, 6, "saved")], [(1, 6, "saved")]]  # each pod's own record, one step for both
    assert committed(root) == [4, 6]
    retry_is_exact(tiny_model, root, reference, 6)


@pytest.mark.parametrize("lost", [0, 1])
def test_a_node_lost_mid_step_leaves_the_survivor_to_exit_75_commits_nothing_and_the_retry_is_exact(
    tiny_model, reference, tmp_path, lost
):
    # Node `lost` goes whole (PID 1, torchrun, the rank) while both ranks hold after step 6; node 0 is also
    # the rendezvous store's host, so lost=0 takes the store with it.
    root = tmp_path / "ckpt"
    pods = group(tiny_model, root, base_env(BATON_GRACE="5", BATON_PAUSE_AFTER_STEP="6"))
    survivor = pods[1 - lost]
    survivor.wait_for("step", 6)
    pods[lost].kill_all()
    assert survivor.wait() == 75, survivor.err[-3000:]
    pods[lost].wait()
    recs = survivor.records
    assert [(r["reason"], r["rank"]) for r in recs if r["event"] == "retry_later"] == [
        ("peer_lost", 1 - lost)
    ]
    assert not any(r["event"] in ("preempt", "done") for r in recs)
    assert committed(root) == [4]
    retry_is_exact(tiny_model, root, reference, 4)


def test_a_node_lost_mid_save_commits_nothing_and_the_retry_is_exact(tiny_model, reference, tmp_path):
    from tests.unit.test_faults import fault_env

    root = tmp_path / "ckpt"
    marker = tmp_path / "saving"
    # Step 8's periodic save writes slowly (0.5 s a file); node 1 goes once the first of its files is being written.
    env = {**fault_env(slow_writes={"8": 0.5}, marker=str(marker)), "BATON_GRACE": "5"}
    pods = group(tiny_model, f"faulty://{root}", env)
    deadline = time.monotonic() + 240
    while not marker.exists():
        assert time.monotonic() < deadline and pods[0].p.poll() is None, pods[0].err[-3000:]
        time.sleep(0.05)
    pods[1].kill_all()
    assert pods[0].wait() == 75, pods[0].err[-3000:]
    pods[1].wait()
    recs = pods[0].records
    assert [r["reason"] for r in recs if r["event"] == "retry_later"] == ["peer_lost"]
    assert not any(r["event"] == "checkpoint" and r["step"] == 8 for r in recs)
    assert committed(root) == [4]  # step 8's files may be there, its _COMMIT is not
    retry_is_exact(
        tiny_model, root, reference, 4, env={**fault_env(), "BATON_GRACE": "20"}, uri=f"faulty://{root}"
    )


def test_the_evidence_of_two_nodes_counts_each_pod_event_once(tmp_path):
    from steps.lib.evidence import read_evidence

    rec = {"run_id": "r", "attempt": 2, "time": 1.0}
    lines = {
        "node-0": [
            {**rec, "event": "step", "step": 6, "rank": 0},
            {**rec, "event": "checkpoint", "step": 6, "rank": 0},
            {**rec, "event": "preempt", "step": 6, "rank": 0},
        ],
        "node-1": [
            {**rec, "event": "step", "step": 6, "rank": 1},
            {**rec, "event": "preempt", "step": 6, "rank": 1},
        ],
    }
    for name, recs in lines.items():
        Path(tmp_path, f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    got = [(r["event"], r["rank"]) for r in read_evidence(str(tmp_path))]
    assert got == [("step", 0), ("checkpoint", 0), ("preempt", 0)]
    # The control: node 1's file alone keeps its copies (a pod's own evidence is whole).
    os.remove(tmp_path / "node-0.jsonl")
    assert [(r["event"], r["rank"]) for r in read_evidence(str(tmp_path))] == [("step", 1), ("preempt", 1)]
