"""steps.train's launchers: one rank runs as the wrapper's own child (`--launcher direct`, the default for
one rank), with the environment torchrun gives rank 0 of 1; SIGTERM is forwarded to it, and a rank that
outlives `--shutdown-timeout` is SIGKILLed, as torchrun does. Real processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from tests.helpers import PY, REPO, base_env, children

# A rank that says who it is, then ignores SIGTERM (only SIGKILL ends it).
RANK = (
    "import json, os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print(json.dumps({'event': 'hello', 'pid': os.getpid(), 'ppid': os.getppid(), 'env': {k: os.environ.get(k) for k in "
    "('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', "
    "'TORCHELASTIC_RUN_ID')}}), flush=True); time.sleep(120)"
)


@pytest.mark.parametrize("launcher", ["auto", "torchrun"])
def test_one_rank_runs_directly_with_torchruns_environment_and_is_killed_after_the_grace(launcher, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    cmd = [
        PY,
        "-m",
        "steps.train",
        "--nproc",
        "1",
        "--launcher",
        launcher,
        "--shutdown-timeout",
        "2",
        "--trainer",
        str(script),
    ]
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=base_env(), cwd=REPO
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    while line and not line.startswith("{"):
        line = p.stdout.readline()
    assert line, p.communicate(timeout=60)[1][-2000:]
    hello = json.loads(line)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 75, err[-2000:]  # signalled before any step: nothing a retry would replay
    env = hello["env"]
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (
        "0",
        "0",
        "1",
        "1",
    )
    assert env["MASTER_ADDR"] and int(env["MASTER_PORT"]) > 0 and env["TORCHELASTIC_RUN_ID"]
    if launcher == "auto":
        assert hello["ppid"] == p.pid  # no torchrun in between
        assert "the rank outlived its 2 s of grace: SIGKILL" in err and "the rank exited -9" in err
    else:  # the control: torchrun sits between the wrapper and the rank, and kills it itself
        assert hello["ppid"] != p.pid and "torchrun exited" in err
    with pytest.raises(ProcessLookupError):  # the rank is gone (it ignored SIGTERM: SIGKILL took it)
        os.kill(hello["pid"], 0)


def test_direct_refuses_several_ranks():
    p = subprocess.run(
        [PY, "-m", "steps.train", "--nproc", "2", "--launcher", "direct", "--trainer", "-c pass"],
        capture_output=True,
        text=True,
        env=base_env(),
        cwd=REPO,
        timeout=60,
    )
    assert p.returncode == 1 and "--launcher direct runs one rank" in p.stderr


def test_a_trainer_that_ends_before_any_record_is_named_by_its_own_error(tmp_path):
    """A trainer that exits 1 before its first record (a bad config, say): steps.train writes a `failed`
    record of its own (reason trainer_error, attempt null) carrying the trainer's last `error:` line, and
    still passes the trainer's stderr through. Control: a trainer that wrote a record gets none."""
    from steps.lib.evidence import check_record

    script = tmp_path / "bad.py"
    script.write_text(
        "import sys\nprint('loading', file=sys.stderr)\n"
        "print(\"error: config key 'seed': must be >= 0, got -1\", file=sys.stderr)\nsys.exit(1)\n"
    )
    p = subprocess.run(
        [PY, "-m", "steps.train", "--trainer", str(script)],
        capture_output=True,
        text=True,
        env=base_env(),
        cwd=REPO,
        timeout=120,
    )
    assert p.returncode == 1 and "loading" in p.stderr
    (rec,) = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    assert (rec["event"], rec["reason"], rec["attempt"], rec["source"]) == (
        "failed",
        "trainer_error",
        None,
        "steps.train",
    )
    assert rec["error"] == "error: config key 'seed': must be >= 0, got -1" and rec["launcher_exit"] == 1
    assert check_record(rec) is None
    script.write_text(
        "import json, sys\nprint(json.dumps({'event': 'resume', 'step': 0, 'attempt': 1}))\nsys.exit(1)\n"
    )
    p = subprocess.run(
        [PY, "-m", "steps.train", "--trainer", str(script)],
        capture_output=True,
        text=True,
        env=base_env(),
        cwd=REPO,
        timeout=120,
    )
    assert p.returncode == 1 and '"trainer_error"' not in p.stdout


def test_a_trainer_that_aborts_while_shutting_down_after_done_ends_the_pod_with_0(tmp_path):
    """Seen at nodes=2: the trainer wrote `done` (after the final commit) and then aborted in its teardown
    (SIGABRT, "terminate called without an active exception"). The run is complete: exit 0, and the message
    says so. Control: the same abort after a `step` record, with no `done`, is 1."""
    script = tmp_path / "abort.py"
    body = (
        "import json, os, sys\nprint(json.dumps({'event': 'step', 'step': 1, 'attempt': 1}), flush=True)\n"
        "DONE\nprint('terminate called without an active exception', file=sys.stderr, flush=True)\nos.abort()\n"
    )
    script.write_text(
        body.replace("DONE", "print(json.dumps({'event': 'done', 'step': 1, 'attempt': 1}), flush=True)")
    )
    p = subprocess.run(
        [PY, "-m", "steps.train", "--trainer", str(script)],
        capture_output=True,
        text=True,
        env=base_env(),
        cwd=REPO,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "wrote `done` and then exited -6 while shutting down" in p.stderr
    script.write_text(body.replace("DONE", ""))
    p = subprocess.run(
        [PY, "-m", "steps.train", "--trainer", str(script)],
        capture_output=True,
        text=True,
        env=base_env(),
        cwd=REPO,
        timeout=120,
    )
    assert p.returncode == 1 and "while shutting down" not in p.stderr, p.stderr[-2000:]


def test_a_launcher_that_lingers_after_done_is_ended_and_the_pod_ends_with_0(tmp_path):
    """torchrun's exit barrier can hold a finished pod 300 s (a peer's agent that failed): after the done
    record, steps.train gives the launcher --done-linger seconds, then ends it, and the pod ends with 0.
    Control: a trainer that hangs without a done record is not ended by it (SIGTERM from outside ends it)."""
    script = tmp_path / "linger.py"
    body = (
        "import json, time\nprint(json.dumps({'event': 'step', 'step': 1, 'attempt': 1}), flush=True)\n"
        "DONE\ntime.sleep(600)\n"
    )
    script.write_text(
        body.replace("DONE", "print(json.dumps({'event': 'done', 'step': 1, 'attempt': 1}), flush=True)")
    )
    p = subprocess.run(
        [PY, "-m", "steps.train", "--done-linger", "1", "--shutdown-timeout", "2", "--trainer", str(script)],
        capture_output=True,
        text=True,
        env=base_env(),
        cwd=REPO,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "still runs 1 s after the done record: SIGTERM" in p.stderr
    script.write_text(body.replace("DONE", ""))
    proc = subprocess.Popen(
        [PY, "-m", "steps.train", "--done-linger", "1", "--shutdown-timeout", "2", "--trainer", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=base_env(),
        cwd=REPO,
    )
    assert proc.stdout is not None
    while '"step"' not in proc.stdout.readline():
        pass
    try:
        proc.wait(timeout=5)  # five times the linger: it must still run
        raise AssertionError("steps.train ended a trainer that wrote no done record")
    except subprocess.TimeoutExpired:
        pass
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert "after the done record" not in err and proc.returncode != 0


def test_the_version_check_agrees_with_this_torchruns_own_parser():
    """steps.train reads --shutdown-timeout's presence from torch's version, to keep torch out of PID 1; the
    installed torchrun's parser is the truth it must agree with."""
    import importlib.metadata

    from torch.distributed.run import get_args_parser

    from steps.train import torchrun_has_shutdown_timeout

    parsed = any("--shutdown-timeout" in a.option_strings for a in get_args_parser()._actions)
    assert torchrun_has_shutdown_timeout() is parsed, importlib.metadata.version("torch")
    probe = (
        "import sys, steps.train; steps.train.torchrun_has_shutdown_timeout(); print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [PY, "-c", probe], cwd=REPO, env=base_env(), capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False", out.stdout + out.stderr[-2000:]
    # Control: the same probe sees torch once the parser itself is asked.
    probe = probe.replace("steps.train.torchrun_has_shutdown_timeout()", "import torch.distributed.run")
    out = subprocess.run(
        [PY, "-c", probe], cwd=REPO, env=base_env(), capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "True", out.stdout


# A rank that writes step records 1..STEPS, then ignores SIGTERM (only SIGKILL ends it).
STEPS = 20
RECORDS_THEN_HANG = (
    "import json, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    f"for s in range(1, {STEPS} + 1): print(json.dumps({{'event': 'step', 'step': s, 'attempt': 0}}), flush=True)\n"
    "time.sleep(120)\n"
)


def test_the_evidence_is_copied_at_sigterm_so_a_kill_at_the_grace_loses_none_of_it(tmp_path):
    """On an object store the evidence is rewritten at most every BATON_EVIDENCE_FLUSH_S (here an hour), so a
    pod SIGKILLed at its grace lost the records since the last copy, and the drill placed the kill and counted
    the replayed steps from a stale copy (tests/e2e/test_real_node.py). At SIGTERM the wrapper copies every
    line it has at once, and every line after it as it comes (the wrapper may pass a record on to its
    stdout, where this test reads it, just before it adds it to the copy): the copy holds the last step while
    the rank still runs, and the SIGKILL loses nothing. Control: before the SIGTERM, the throttled copy does
    not hold it."""
    import time

    script = tmp_path / "rank.py"
    script.write_text(RECORDS_THEN_HANG)
    copy = tmp_path / "evidence" / "attempt.jsonl"
    cmd = [PY, "-m", "steps.train", "--nproc", "1", "--shutdown-timeout", "600"]
    cmd += ["--evidence", f"faulty://{tmp_path}/evidence", "--name", "attempt"]
    cmd += ["--trainer", str(script)]
    env = {**base_env(), "BATON_EVIDENCE_FLUSH_S": "3600"}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)

    def steps_in_copy() -> list[int]:
        text = copy.read_text() if copy.exists() else ""
        return [json.loads(line)["step"] for line in text.splitlines() if '"step"' in line]

    try:
        assert p.stdout is not None
        seen = 0
        while seen < STEPS:  # the wrapper has passed on (and so read) every record
            line = p.stdout.readline()
            assert line, p.communicate(timeout=60)[1][-2000:]
            seen += line.startswith("{")
        assert STEPS not in steps_in_copy(), steps_in_copy()  # the control: throttled, the tail is not copied
        p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while STEPS not in steps_in_copy():
            assert time.monotonic() < deadline, f"the copy never got step {STEPS}: {steps_in_copy()}"
            time.sleep(0.05)
    finally:
        for pid in children(p.pid):
            os.kill(pid, signal.SIGKILL)
        p.kill()
        p.communicate(timeout=60)
    assert steps_in_copy() == list(range(1, STEPS + 1))
