"""Faults a retry can mend (trainer/faults.py): a periodic save that fails does not end the run, only a
bounded number in a row ends it with 75; a full disk (ENOSPC, injected through tests/faultfs) commits
nothing and leaves the previous checkpoint intact; an altered manifest.json is refused with a fall back.
Every test checks what was committed and what the resumed run computes (torch.equal)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.helpers import PY, REPO, base_env, run, run_and_sigterm, trainer_cmd
from trainer.checkpoint import load_flat
from trainer.checkpoint.layout import COMMIT
from trainer.config import ConfigError
from trainer.faults import FaultsConfig, SaveFailures

FAULTFS = REPO / "tests" / "faultfs"


def fault_env(**faults) -> dict[str, str]:
    env = base_env(BATON_TEST_FAULTS=json.dumps(faults))
    env["PYTHONPATH"] = os.pathsep.join([str(FAULTFS), env["PYTHONPATH"]])
    return env


def committed(root: Path) -> list[int]:
    return sorted(int(p.parent.name.removeprefix("step-")) for p in root.rglob(COMMIT))


def final_equal(a_root: Path, b_root: Path, step: int) -> bool:
    name = f"step-{step:08d}"
    a, b = load_flat(f"file://{next(a_root.rglob(name))}"), load_flat(f"file://{next(b_root.rglob(name))}")
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


COMMON = ("total_steps=10", "checkpoint.every_steps=2", "model.dropout=0.1", "checkpoint.keep_last=2")


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    rc, recs, err = run(trainer_cmd(tiny_model, f"file://{root}", *COMMON))
    assert rc == 0, err[-2000:]
    return root


def test_config_names_the_key_and_the_counter_counts_in_a_row():
    with pytest.raises(ConfigError, match="faults.max_failed_saves"):
        FaultsConfig(max_failed_saves=0)
    with pytest.raises(ConfigError, match="faults.collective_timeout_s"):
        FaultsConfig(collective_timeout_s=0.5)
    assert FaultsConfig().collective_timeout(30).total_seconds() == 15
    assert FaultsConfig().collective_timeout(4).total_seconds() == 5
    assert FaultsConfig(collective_timeout_s=7).collective_timeout(30).total_seconds() == 7
    c = SaveFailures(2)
    assert c.failed() is False
    c.committed()
    assert c.failed() is False and c.failed() is True


@pytest.mark.slow
def test_a_periodic_save_that_meets_a_full_disk_commits_nothing_and_the_run_goes_on(
    tiny_model, tmp_path, reference
):
    root = tmp_path / "ckpt"
    rc, recs, err = run(trainer_cmd(tiny_model, f"faulty://{root}", *COMMON), env=fault_env(enospc_steps=[4]))
    assert rc == 0, err[-3000:]
    failed = [r for r in recs if r["event"] == "checkpoint_failed"]
    assert [(r["step"], r["in_a_row"], r["limit"]) for r in failed] == [(4, 1, 3)]
    assert "No space left on device" in failed[0]["error"] and failed[0]["checkpoint"].endswith(
        "step-00000002"
    )
    assert "No space left on device" in err
    # Step 4 committed nothing; the saves before and after it did, and the run ended as the reference did.
    assert 4 not in committed(root) and committed(root)[-1] == 10
    assert [r["step"] for r in recs if r["event"] == "checkpoint"] == [2, 6, 8, 10]
    assert final_equal(root, reference, 10)


@pytest.mark.slow
def test_saves_failing_in_a_row_end_the_pod_with_75_and_the_retry_resumes_bit_identically(
    tiny_model, tmp_path, reference
):
    root = tmp_path / "ckpt"
    # Through steps.train (the pod's PID 1): the worker's 75 reaches the pod as 75, not torchrun's 1.
    cmd = [
        PY,
        "-m",
        "steps.train",
        "--nproc",
        "1",
        "--config",
        str(REPO / "trainer/configs/tiny.yaml"),
        "--set",
        f"model.path={tiny_model}",
        "--set",
        f"checkpoint.uri=faulty://{root}",
        "--set",
        f"data.uri={REPO / 'trainer/assets/tiny_corpus.txt'}",
    ]
    for s in COMMON:
        cmd += ["--set", s]
    rc, recs, err = run(cmd, env=fault_env(enospc_steps=[4, 6, 8]))
    assert rc == 75, err[-3000:]
    assert [(r["step"], r["in_a_row"]) for r in recs if r["event"] == "checkpoint_failed"] == [
        (4, 1),
        (6, 2),
        (8, 3),
    ]
    stop = [r for r in recs if r["event"] == "retry_later"]
    assert len(stop) == 1 and stop[0]["exit"] == 75 and stop[0]["reason"] == "saves_failing"
    assert not any(r["event"] == "done" for r in recs)
    # Only step 2 is committed, and retention never touched it: it loads, and the retry resumes from it.
    assert committed(root) == [2]
    rc, recs, err = run(cmd, env=fault_env())
    assert rc == 0, err[-3000:]
    assert [r["from_step"] for r in recs if r["event"] == "resume"] == [2]
    assert final_equal(root, reference, 10)


@pytest.mark.slow
def test_a_manifest_altered_after_its_commit_is_refused_and_the_resume_falls_back(
    tiny_model, tmp_path, reference
):
    # Planted bug this catches: a resume that trusts manifest.json without checking it against _COMMIT.
    root = tmp_path / "ckpt"
    rc, recs, err = run_and_sigterm(trainer_cmd(tiny_model, f"file://{root}", *COMMON), at_step=6)
    assert rc == 75 and committed(root)[-1] == 6, err[-2000:]
    newest = next(root.rglob("step-00000006"))
    manifest = json.loads((newest / "manifest.json").read_text())
    manifest["epoch"] += 1  # still valid JSON, still lists the same files with the same hashes
    (newest / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    rc, recs, err = run(trainer_cmd(tiny_model, f"file://{root}", *COMMON))
    assert rc == 0, err[-2000:]
    refused = [r for r in recs if r["event"] == "checkpoint_refused"]
    assert len(refused) == 1 and refused[0]["path"].endswith("step-00000006")
    assert "checksum" in refused[0]["reason"]
    assert [r["from_step"] for r in recs if r["event"] == "resume"] == [4]
    # The fall back replays 5 and 6 and ends where the reference ended, tensor for tensor.
    assert final_equal(root, reference, 10)


@pytest.fixture
def preempted_at_6(tiny_model, tmp_path):
    """A run on faulty:// (no faults yet) preempted after step 6: steps 2, 4 and 6 committed."""
    root = tmp_path / "ckpt"
    cmd = trainer_cmd(tiny_model, f"faulty://{root}", *COMMON)
    rc, recs, err = run_and_sigterm(cmd, at_step=6, env=fault_env())
    assert rc == 75 and committed(root)[-1] == 6, err[-2000:]
    return root, cmd


@pytest.mark.slow
def test_a_transient_read_error_is_retried_not_taken_for_corruption(preempted_at_6, reference):
    root, cmd = preempted_at_6
    rc, recs, err = run(cmd, env=fault_env(read_errors=3))
    assert rc == 0, err[-3000:]
    assert "injected read error" in err and "again in" in err
    assert not [r for r in recs if r["event"] == "checkpoint_refused"]  # not passed over
    assert [r["from_step"] for r in recs if r["event"] == "resume"] == [6]
    assert final_equal(root, reference, 10)


@pytest.mark.slow
def test_a_store_that_stays_unreachable_ends_with_75_after_the_bound_and_passes_over_nothing(
    preempted_at_6, reference
):
    root, cmd = preempted_at_6
    rc, recs, err = run([*cmd, "--set", "faults.read_retry_s=2"], env=fault_env(read_errors=-1))
    assert rc == 75, err[-3000:]
    stop = [r for r in recs if r["event"] == "retry_later"]
    assert [(r["reason"], r["exit"]) for r in stop] == [("store_unreachable", 75)]
    assert not [r for r in recs if r["event"] in ("checkpoint_refused", "resume", "step")]
    assert committed(root)[-1] == 6  # the good checkpoint is still there, and the next start takes it
    rc, recs, err = run(cmd, env=fault_env())
    assert rc == 0 and [r["from_step"] for r in recs if r["event"] == "resume"] == [6], err[-3000:]
    assert final_equal(root, reference, 10)


@pytest.mark.slow
def test_a_missing_bucket_is_still_1_at_once(tiny_model, tmp_path):
    # Not a fault to wait out: the bucket (here a root whose parent is a file) cannot be written at all.
    (tmp_path / "file").write_text("x")
    rc, recs, err = run(trainer_cmd(tiny_model, f"file://{tmp_path / 'file' / 'ckpt'}", *COMMON))
    assert rc == 1 and not [r for r in recs if r["event"] == "retry_later"], err[-2000:]


@pytest.mark.slow
def test_an_async_save_that_fails_as_sigterm_arrives_still_commits_the_preemption_save_and_exits_75(
    tiny_model, tmp_path, reference
):
    # Step 6's async periodic save meets ENOSPC in the background; SIGTERM lands at that very step. The
    # stop drains the failed save (reporting it), saves step 6 synchronously, commits it and exits 75.
    # Planted bug this catches: a stop that lets the in-flight save's failure end the run (exit 1).
    root = tmp_path / "ckpt"
    cmd = trainer_cmd(tiny_model, f"faulty://{root}", *COMMON, "checkpoint.async_save=true")
    rc, recs, err = run_and_sigterm(cmd, at_step=6, env=fault_env(enospc_first={"6": 1}))
    assert rc == 75, err[-3000:]
    assert "the checkpoint in flight failed" in err and "No space left on device" in err
    pre = [r for r in recs if r["event"] == "preempt"]
    assert [(r["step"], r["outcome"], r["exit"]) for r in pre] == [(6, "saved", 75)]
    assert committed(root)[-1] == 6
    rc, recs, err = run(
        trainer_cmd(tiny_model, f"faulty://{root}", *COMMON, "checkpoint.async_save=true"), env=fault_env()
    )
    assert rc == 0 and [r["from_step"] for r in recs if r["event"] == "resume"] == [6], err[-3000:]
    assert final_equal(root, reference, 10)


@pytest.mark.slow
def test_a_read_error_inside_the_load_itself_is_retried_not_a_fall_back(preempted_at_6, reference):
    # The manifest reads fine; DCP's own reads of the data files fail twice (EIO). Planted bug this
    # catches: a load failure taken for corruption, which passes over step 6 and replays steps 5 and 6.
    root, cmd = preempted_at_6
    rc, recs, err = run(cmd, env=fault_env(read_errors=2, read_match=".distcp"))
    assert rc == 0, err[-3000:]
    assert "injected read error" in err
    assert not [r for r in recs if r["event"] == "checkpoint_refused"]
    assert [r["from_step"] for r in recs if r["event"] == "resume"] == [6]
    assert final_equal(root, reference, 10)


def sigterm_on_marker(cmd: list[str], env: dict[str, str], marker: Path) -> tuple[int, list[dict], str]:
    """Run `cmd`; SIGTERM it as soon as `marker` exists (faultfs creates it at the first slowed read or
    write), and collect everything."""
    import signal
    import subprocess
    import time

    from tests.helpers import records

    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    deadline = time.monotonic() + 120
    while not marker.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=300)
    return p.returncode, records(out), err


@pytest.mark.slow
def test_sigterms_inside_a_restore_and_inside_a_save_lose_nothing_and_the_record_says_where_they_landed(
    preempted_at_6, reference, tmp_path
):
    root, cmd = preempted_at_6
    # 1. Inside the restore: step 6's files read slowly, the signal comes as the first one is read. The
    # restore completes, step 6 is already committed, nothing is trained: 75.
    marker = tmp_path / "restoring"
    rc, recs, err = sigterm_on_marker(cmd, fault_env(slow_reads={"6": 0.3}, marker=str(marker)), marker)
    assert rc == 75, err[-3000:]
    (pre,) = [r for r in recs if r["event"] == "preempt"]
    assert (pre["step"], pre["during"], pre["outcome"]) == (6, "restore", "already_committed")
    assert not [r for r in recs if r["event"] == "step"] and committed(root)[-1] == 6
    # 2. Inside a save: step 8's periodic save writes slowly, the signal comes as its first file is
    # written. The save completes and commits; the stop finds step 8 committed: 75.
    marker = tmp_path / "saving"
    rc, recs, err = sigterm_on_marker(cmd, fault_env(slow_writes={"8": 0.3}, marker=str(marker)), marker)
    assert rc == 75, err[-3000:]
    (pre,) = [r for r in recs if r["event"] == "preempt"]
    assert (pre["step"], pre["during"], pre["outcome"]) == (8, "save", "already_committed")
    assert committed(root)[-1] == 8
    # 3. To the end: from step 8, equal to the uninterrupted run.
    rc, recs, err = run(cmd, env=fault_env())
    assert rc == 0 and [r["from_step"] for r in recs if r["event"] == "resume"] == [8], err[-3000:]
    assert final_equal(root, reference, 10)


def test_faultfs_slow_writes_once_spare_a_process_started_after_the_marker(tmp_path):
    """The seam the real-node test uses for a save slower than the pod's grace: "once" slows only a process that
    started before the marker existed, so the retried attempt saves at full speed. Control: without "once",
    or before the marker exists, the process is slowed."""
    import subprocess

    marker = tmp_path / "save-started"

    def slowed(**faults) -> str:
        code = "import sitecustomize; print(sitecustomize._SLOWED)"
        r = subprocess.run(
            [PY, "-c", code], env=fault_env(**faults), capture_output=True, text=True, check=True
        )
        return r.stdout.strip()

    faults = {"slow_writes": {"8": 60}, "marker": str(marker)}
    assert slowed(**faults, once=True) == "True"  # before the marker: the attempt that will be killed
    marker.touch()
    assert slowed(**faults, once=True) == "False"  # after it: the retry
    assert slowed(**faults) == "True"  # control: without "once", every process is slowed
