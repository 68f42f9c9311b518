"""A dead or hung rank never hangs the pod (trainer/faults.py): two gloo ranks under torchrun, through
the pod's PID 1 (steps.train). A rank that hangs for good, ranks that disagree on the stop (one saves
alone while the other trains on), and a rank SIGKILLed (an OOM kill) mid-step, mid-save, mid-restore:
each time the pod exits with 75, nothing after the last commit is committed, and the retry resumes from
that commit and ends bit-identical to an uninterrupted 2-rank run. A hang that the collective timeout
did not bound would fail by pytest's own per-test timeout (pytest-timeout) and the subprocess timeout."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest

from tests.dist.test_multirank import entry_cmd, run_entry, workers_of
from tests.helpers import REPO, base_env, records, tensors
from trainer.checkpoint.layout import COMMIT

pytestmark = [pytest.mark.dist, pytest.mark.timeout(900)]
TOTAL = 24
SETS = ("checkpoint.every_steps=4", "faults.collective_timeout_s=5")


def committed(root) -> list[int]:
    return sorted(int(p.parent.name.removeprefix("step-")) for p in root.rglob(COMMIT))


def equal_to(reference, root) -> bool:
    import torch

    a, b = tensors(reference, TOTAL), tensors(root, TOTAL)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def ends_with_peer_lost(cmd, env) -> tuple[list[dict], str]:
    """Run the pod to its end: exit 75, and every `retry_later` record says `peer_lost`. Returns the
    records and stderr."""
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    recs = records(p.stdout)
    assert p.returncode == 75, p.stderr[-3000:]
    lost = [r for r in recs if r["event"] == "retry_later"]
    assert lost and {(r["reason"], r["exit"]) for r in lost} == {("peer_lost", 75)}
    return recs, p.stderr


def retry_is_exact(cmd, reference, root, from_step: int, env=None) -> None:
    """The retry runs to the end, resumes from `from_step`, and ends equal to the uninterrupted run."""
    rc, recs, err = run_entry(cmd, env=env)
    assert rc == 0, err[-3000:]
    assert [r["from_step"] for r in recs if r["event"] == "resume"] == [from_step]
    assert equal_to(reference, root)


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("ref-peer")
    rc, recs, err = run_entry(entry_cmd(tiny_model, root, *SETS))
    assert rc == 0, err[-3000:]
    return root


def test_a_hung_rank_ends_the_pod_with_75_within_the_collective_timeout_and_the_retry_is_bit_identical(
    tiny_model, reference, tmp_path
):
    root = tmp_path / "ckpt"
    cmd = entry_cmd(tiny_model, root, *SETS)
    # Rank 1 hangs after step 6, ignoring SIGTERM: rank 0 waits 5 s in the step's collective, not 30 min;
    # torchrun then SIGKILLs the hung worker after its shutdown timeout (the grace, 5 s here).
    recs, _ = ends_with_peer_lost(cmd, base_env(BATON_GRACE="5", BATON_TEST_HANG_AFTER_STEP="1:6"))
    assert max(r["step"] for r in recs if r["event"] == "step") == 5  # step 6's record needs rank 1 too
    assert committed(root) == [4]  # nothing after the last commit, nothing partial
    retry_is_exact(cmd, reference, root, 4)


def test_ranks_that_disagree_on_the_stop_end_the_pod_within_the_bound_commit_nothing_and_the_retry_is_exact(
    tiny_model, reference, tmp_path
):
    # The bug that once left the 2-rank tests waiting on gloo's 30 minutes: rank 1 decides alone to stop
    # after step 6 and goes to save, while rank 0 trains on. Each waits in a collective the other never
    # joins, until the collective timeout (5 s) ends it; the save of rank 1 alone can commit nothing.
    root = tmp_path / "ckpt"
    cmd = entry_cmd(tiny_model, root, *SETS)
    recs, err = ends_with_peer_lost(cmd, base_env(BATON_GRACE="5", BATON_TEST_DISAGREE_AFTER_STEP="1:6"))
    assert "preempted (peer) at step 6" in err  # rank 1 went to save alone
    assert err.count("error: a peer rank is gone") == 2  # both ranks timed out, neither waited on
    assert not any(r["event"] in ("preempt", "done") for r in recs)
    assert committed(root) == [4]
    retry_is_exact(cmd, reference, root, 4)


def test_planted_no_collective_timeout_leaves_the_hang_to_the_outer_timeouts(tiny_model, tmp_path):
    # Negative control: with gloo's default timeout the same hang outlives any bound this test can wait;
    # the subprocess timeout (standing in for pytest-timeout) is what ends it.
    cmd = [
        c
        for c in entry_cmd(
            tiny_model, tmp_path / "ckpt", "checkpoint.every_steps=4", "faults.collective_timeout_s=1800"
        )
    ]
    env = base_env(BATON_GRACE="5", BATON_TEST_HANG_AFTER_STEP="1:6")
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=60)
    finally:
        workers = workers_of(p.pid)  # torchrun's workers run in sessions of their own: the group misses them
        os.killpg(p.pid, signal.SIGKILL)
        for pid in workers.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        p.wait()


def test_a_rank_sigkilled_mid_step_ends_the_pod_with_75_and_the_retry_is_bit_identical(
    tiny_model, reference, tmp_path
):
    root = tmp_path / "ckpt"
    cmd = entry_cmd(tiny_model, root, *SETS)
    # Both ranks hold after 2 micro-batches... of step 7 is not possible with grad_accum 1: they hold after
    # step 6 (inside the next step's stop checks), and rank 1 dies there, as an OOM kill would take it.
    env = base_env(BATON_GRACE="5", BATON_PAUSE_AFTER_STEP="6")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    out = []
    assert p.stdout is not None
    for line in p.stdout:
        out.append(line)
        if line.startswith("{") and json.loads(line).get("event") == "step" and json.loads(line)["step"] == 6:
            deadline = time.monotonic() + 20
            while len(w := workers_of(p.pid)) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            os.kill(w[1], signal.SIGKILL)
    rc = p.wait(timeout=300)
    recs, err = records("".join(out)), p.stderr.read()
    assert rc == 75, err[-3000:]
    assert any(r["event"] == "retry_later" and r["reason"] == "peer_lost" for r in recs)
    assert committed(root) == [4]
    retry_is_exact(cmd, reference, root, 4)


def test_a_rank_sigkilled_mid_save_commits_nothing_ends_the_pod_with_75_and_the_retry_is_bit_identical(
    tiny_model, reference, tmp_path
):
    from tests.unit.test_faults import fault_env

    root = tmp_path / "ckpt"
    cmd = entry_cmd(tiny_model, f"faulty://{root}", *SETS)
    # Step 8's periodic save writes slowly (0.5 s a file): rank 1 is killed while both ranks write it.
    env = {**fault_env(slow_writes={"8": 0.5}), "BATON_GRACE": "5"}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    out = []
    assert p.stdout is not None
    for line in p.stdout:
        out.append(line)
        if line.startswith("{") and json.loads(line).get("event") == "step" and json.loads(line)["step"] == 8:
            w = workers_of(p.pid)
            time.sleep(0.2)  # inside the save: its first file takes 0.5 s
            os.kill(w[1], signal.SIGKILL)
    rc = p.wait(timeout=300)
    recs, err = records("".join(out)), p.stderr.read()
    assert rc == 75, err[-3000:]
    assert any(r["event"] == "retry_later" and r["reason"] == "peer_lost" for r in recs)
    assert not any(r["event"] == "checkpoint" and r["step"] == 8 for r in recs)
    assert committed(root) == [4]  # step 8's files may be there, its _COMMIT is not
    retry_is_exact(cmd, reference, root, 4, env={**fault_env(), "BATON_GRACE": "20"})


def test_a_rank_sigkilled_mid_restore_ends_the_pod_with_75_and_the_retry_is_bit_identical(
    tiny_model, reference, tmp_path
):
    from tests.unit.test_faults import fault_env

    root = tmp_path / "ckpt"
    cmd = entry_cmd(tiny_model, f"faulty://{root}", *SETS)
    # faulty:// needs tests/faultfs on the path of every process (fault_env), preempted after step 6 first.
    cmd_env = fault_env()
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**cmd_env, "BATON_GRACE": "20", "BATON_PAUSE_AFTER_STEP": "6"},
    )
    out = []
    assert p.stdout is not None
    for line in p.stdout:
        out.append(line)
        if line.startswith("{") and json.loads(line).get("event") == "step" and json.loads(line)["step"] == 6:
            os.kill(p.pid, signal.SIGTERM)
    assert p.wait(timeout=300) == 75 and committed(root) == [4, 6]
    # The resume reads step 6 slowly (1 s a file); rank 1 dies while both ranks restore it.
    marker = tmp_path / "restoring"
    env = {**fault_env(slow_reads={"6": 1.0}, marker=str(marker)), "BATON_GRACE": "5"}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    deadline = time.monotonic() + 240
    while not marker.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    w = workers_of(p.pid)
    os.kill(w[1], signal.SIGKILL)
    stdout, err = p.communicate(timeout=300)
    recs = records(stdout)
    assert p.returncode == 75, err[-3000:]
    assert any(r["event"] == "retry_later" and r["reason"] == "peer_lost" for r in recs)
    assert not any(r["event"] == "step" for r in recs) and committed(root) == [4, 6]
    retry_is_exact(cmd, reference, root, 6, env={**fault_env(), "BATON_GRACE": "20"})
