"""A preemption warning in the podinfo folder: an early save at the next step boundary, training goes
on, and the SIGTERM that follows on that step exits 75 at once. Garbage in the other file is ignored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from tests.helpers import REPO, base_env, records, trainer_cmd


def test_warning_saves_early_and_the_later_sigterm_exits_at_once(tiny_model, tmp_path):
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir()
    (podinfo / "guaranteed-until").write_text("not a time")  # garbage: ignored with a warning
    (podinfo / "termination-warning-at").write_text("")  # empty: absent
    env = base_env(BATON_PODINFO=str(podinfo), BATON_PAUSE_AFTER_STEP="12,13")
    p = subprocess.Popen(
        trainer_cmd(tiny_model, tmp_path / "ck", "notice.poll_s=1", "model.dropout=0.1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    out = []
    for line in p.stdout:
        out.append(line)
        rec = json.loads(line) if line.startswith("{") else {}
        if rec.get("event") == "step" and rec["step"] == 12:
            # A warning that reached the pod late: its time has already passed.
            (podinfo / "termination-warning-at").write_text(str(int(time.time()) - 30))
        if rec.get("event") == "step" and rec["step"] == 13:
            time.sleep(0.2)
            os.kill(p.pid, signal.SIGTERM)
    rc = p.wait(timeout=120)
    err = p.stderr.read()
    recs = records("".join(out))
    assert rc == 75, err
    warning = [r for r in recs if r["event"] == "checkpoint" and r["reason"] == "warning"]
    assert [w["step"] for w in warning] == [13], "one early save, at the boundary after the warning"
    steps = [r["step"] for r in recs if r["event"] == "step"]
    assert 13 in steps, "training went on after the warning"
    pre = [r for r in recs if r["event"] == "preempt"][0]
    assert pre["step"] == 13 and pre["outcome"] == "already_committed" and pre["save_ms"] == 0
    assert "guaranteed-until" in err and err.count("does not parse") <= 1
