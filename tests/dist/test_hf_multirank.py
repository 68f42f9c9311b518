"""The HF Trainer example on two gloo ranks under torchrun, through the PID-1 entrypoint
(`steps.train --nproc 2 --trainer hf`): SIGTERM to one worker stops both at the same step, the pod
exits 75, and the resumed run's final checkpoint equals an uninterrupted two-rank run's, tensor for
tensor. A worker SIGKILLed mid-run (an OOM kill) ends the pod with 75 too (`peer_lost`), with nothing
after the last commit committed, and the retry ends equal to the same run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

import pytest

from tests.helpers import CORPUS, PY, REPO, base_env, workers_of
from trainer.records import read_records

pytestmark = pytest.mark.dist
HF_YAML = REPO / "examples" / "hf_trainer" / "config.yaml"
TOTAL = 14  # 10 steps per epoch on 2 ranks: the resume from step 6 crosses an epoch boundary


def entry_cmd(model, bucket):
    cmd = [PY, "-m", "steps.train", "--nproc", "2", "--trainer", "hf", "--config", str(HF_YAML)]
    for s in (
        f"model.path={model}",
        f"checkpoint.uri={bucket}",
        f"data.uri={CORPUS}",
        f"total_steps={TOTAL}",
        "checkpoint.every_steps=5",
        "model.dropout=0.1",
    ):
        cmd += ["--set", s]
    return cmd


def watchdog(p: subprocess.Popen, timeout: float) -> threading.Timer:
    """SIGKILL the whole process group (steps.train, torchrun, the workers) if it outlives `timeout`:
    ranks that disagree on where to stop hang in a collective, and that must fail, not block."""

    def kill() -> None:
        if p.poll() is not None:
            return
        workers = list(workers_of(p.pid).values())  # torchrun starts each in a session of its own
        os.killpg(p.pid, signal.SIGKILL)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    t = threading.Timer(timeout, kill)
    t.daemon = True
    t.start()
    return t


def run_entry(cmd, env, timeout=300):
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    t = watchdog(p, timeout)
    out, err = p.communicate()
    t.cancel()
    return p.returncode, read_records(out), err


def sigterm_one_worker(cmd, at_step, rank, timeout=300):
    env = base_env(BATON_GRACE="20", BATON_PAUSE_AFTER_STEP=str(at_step))
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    t = watchdog(p, timeout)
    out = []
    assert p.stdout is not None
    for line in p.stdout:
        out.append(line)
        recs = read_records(line)
        if recs and recs[0]["event"] == "step" and recs[0]["step"] == at_step:
            deadline = time.monotonic() + 20
            while (pid := workers_of(p.pid).get(rank)) is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert pid is not None, "worker not found"
            os.kill(pid, signal.SIGTERM)
    rc = p.wait()
    t.cancel()
    return rc, read_records("".join(out)), p.stderr.read() if p.stderr else ""


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory):
    ref_bucket = f"file://{tmp_path_factory.mktemp('hf-ref2')}/ref"
    rc, ref_recs, err = run_entry(entry_cmd(tiny_model, ref_bucket), base_env(BATON_GRACE="20"))
    assert rc == 0, err[-3000:]
    assert [r["step"] for r in ref_recs if r["event"] == "step"] == list(range(1, TOTAL + 1))
    return ref_bucket


def equal_to_reference(reference: str, bucket: str) -> None:
    from steps.lib.hf_checkpoint import compare_flat, final_hf_checkpoint, load_hf_checkpoint

    ref, parts = load_hf_checkpoint(final_hf_checkpoint(reference)[0])
    tri, _ = load_hf_checkpoint(final_hf_checkpoint(bucket)[0])
    assert parts["model"] > 0 and parts["optimizer"] > 0 and parts["rng"] > 0
    worst, differing = compare_flat(ref, tri)
    assert differing == [] and worst == 0.0


def test_two_ranks_sigterm_to_one_worker_stop_together_exit_75_and_resume_bit_identical(
    tmp_path, tiny_model, reference
):
    from steps.lib.hf_checkpoint import final_hf_checkpoint

    trial_bucket = f"file://{tmp_path}/trial"
    env = base_env(BATON_GRACE="20")
    rc, recs, err = sigterm_one_worker(entry_cmd(tiny_model, trial_bucket), at_step=6, rank=1)
    assert rc == 75, err[-3000:]
    (pre,) = [r for r in recs if r["event"] == "preempt"]
    assert (
        pre["step"] == 6 and pre["signal"] == "peer" and pre["outcome"] == "saved"
    )  # rank 0 was not signalled
    assert max(r["step"] for r in recs if r["event"] == "step") == 6
    # Both ranks decided at step 6: the signalled one and its peer.
    assert "preempted (SIGTERM) at step 6" in err and "preempted (peer) at step 6" in err
    url, manifest = final_hf_checkpoint(trial_bucket)
    assert manifest["step"] == 6 and manifest["world_size"] == 2
    assert {"rng_state_0.pth", "rng_state_1.pth", "optimizer.pt", "model.safetensors"} <= set(
        manifest["files"]
    )

    rc, recs, err = run_entry(entry_cmd(tiny_model, trial_bucket), env)
    assert rc == 0, err[-3000:]
    (res,) = [r for r in recs if r["event"] == "resume"]
    assert res["from_step"] == 6 and res["saved_world_size"] == 2
    assert [r["step"] for r in recs if r["event"] == "step"] == list(range(7, TOTAL + 1))
    equal_to_reference(reference, trial_bucket)


def test_a_worker_sigkilled_mid_run_ends_the_pod_with_75_and_the_retry_is_bit_identical(
    tmp_path, tiny_model, reference
):
    root = tmp_path / "trial"
    cmd = entry_cmd(tiny_model, f"file://{root}")
    # Both ranks hold after step 7 (the periodic save of 5 committed); rank 1 dies there, as an OOM kill
    # would take it. ddp_timeout is half the grace (faults.collective_timeout()): 5 s, not HF's 30 min.
    env = base_env(BATON_GRACE="10", BATON_PAUSE_AFTER_STEP="7")
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    t = watchdog(p, 300)
    out = []
    assert p.stdout is not None
    for line in p.stdout:
        out.append(line)
        recs = read_records(line)
        if recs and recs[0]["event"] == "step" and recs[0]["step"] == 7:
            deadline = time.monotonic() + 20
            while (pid := workers_of(p.pid).get(1)) is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert pid is not None, "worker not found"
            os.kill(pid, signal.SIGKILL)
    rc = p.wait()
    t.cancel()
    recs, err = read_records("".join(out)), p.stderr.read() if p.stderr else ""
    assert rc == 75, err[-3000:]
    assert [r["reason"] for r in recs if r["event"] == "retry_later"][:1] == ["peer_lost"]
    assert not [r for r in recs if r["event"] == "preempt"]  # no stop was decided: the peer was gone
    assert sorted(p.parent.name for p in root.glob("checkpoint-*/_COMMIT")) == ["checkpoint-5"]

    rc, recs, err = run_entry(cmd, base_env(BATON_GRACE="20"))
    assert rc == 0, err[-3000:]
    assert [r["from_step"] for r in recs if r["event"] == "resume"] == [5]
    equal_to_reference(reference, f"file://{root}")
