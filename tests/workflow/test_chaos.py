"""Chaos: pods of any drill step deleted at random moments (workflows/local/chaos.py), and the pieces that make
every step come through it: evict's pending record, compare's whole-or-nothing report, steps.train's
exit code for a SIGTERM at a pod's edges."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from steps import evict as evict_step
from steps.lib import report as report_mod
from steps.lib.contract import TASKS, TRAINING_TASKS
from steps.lib.evidence import read_evidence
from tests.helpers import PY, REPO, base_env
from trainer.checkpoint import load_flat
from workflows.local import Chaos


# ------------------------------------------------------------------------------------------------ the plan
def test_the_plan_is_a_function_of_the_seed_and_draws_steps_and_startups():
    a = Chaos(10, 7, TASKS, TRAINING_TASKS, 200, long_tasks={"evict": 20.0})
    b = Chaos(10, 7, TASKS, TRAINING_TASKS, 200, long_tasks={"evict": 20.0})
    c = Chaos(10, 8, TASKS, TRAINING_TASKS, 200, long_tasks={"evict": 20.0})
    plan = [(d.task, d.trigger, d.value) for d in a.deletions]
    assert plan == [(d.task, d.trigger, d.value) for d in b.deletions]
    assert plan != [(d.task, d.trigger, d.value) for d in c.deletions]
    for d in a.deletions:
        if d.trigger == "step":
            assert d.task in TRAINING_TASKS and 1 <= d.value <= 199
        else:
            assert 0 <= d.value <= (20.0 if d.task == "evict" else 4.0 if d.task in TRAINING_TASKS else 2.0)
    many = Chaos(400, 1, TASKS, TRAINING_TASKS, 200)
    assert {d.task for d in many.deletions} == set(TASKS)
    assert {d.trigger for d in many.deletions if d.task == "trial"} == {"step", "after_s", "restore"}
    assert {d.trigger for d in many.deletions if d.task not in TRAINING_TASKS} == {"after_s"}


def test_a_restore_deletion_lands_while_the_pod_restores_or_at_its_first_step():
    ch = Chaos(1, 0, ["a"], {"a"}, 50)
    ch.deletions[0].trigger, ch.deletions[0].value = "restore", 0.0
    assert ch.due("a", 100.0, None) is None  # not by age: only the restore record (or a step) arms it
    assert ch.due("a", 0.1, None, restoring=True) is ch.deletions[0]
    assert ch.due("a", 0.1, 3) is ch.deletions[0]  # a fresh pod has nothing to restore: its first step


def test_a_deletion_that_reaches_a_pod_as_it_succeeds_deleted_nothing_and_moves_on():
    """The pod's exit 0 came before the SIGTERM took (a race no test can order): it is not counted as a
    deletion, and moves to another task like one whose task finished first."""
    ch = Chaos(1, 0, ["a", "b"], {"a"}, 50)
    d = ch.deletions[0]
    d.task, d.trigger, d.value = "b", "after_s", 0.5
    ch.landed(d, "pod-b-0", 0, 3.0, None)
    ch.ended("pod-b-0", "Succeeded", 0, "")
    assert (d.outcome, d.pod, d.moved_from) == ("planned", None, ["b"])
    ch.unavailable("b", ["a", "b"])
    assert d.task == "a" and ch.record()["deleted"] == 0
    # Control: a pod that the deletion ended is a deletion.
    ch.landed(d, "pod-a-0", 0, 4.0, 7)
    ch.ended("pod-a-0", "Failed", 75, "main: Error (exit code 75)")
    assert ch.record()["deleted"] == 1 and d.ended["exit_code"] == 75


def test_a_deletion_waits_for_its_moment_moves_when_its_task_is_done_and_is_missed_when_none_is_left():
    ch = Chaos(2, 0, ["a", "b"], {"a"}, 50)
    ch.deletions[0].task, ch.deletions[0].trigger, ch.deletions[0].value = "a", "step", 10
    ch.deletions[1].task, ch.deletions[1].trigger, ch.deletions[1].value = "b", "after_s", 1.0
    assert ch.due("a", 100.0, None) is None and ch.due("a", 0.0, 9) is None
    assert ch.due("a", 0.0, 12) is ch.deletions[0]  # a resumed attempt already past the step: at once
    assert ch.due("b", 0.5, None) is None and ch.due("b", 1.0, None) is ch.deletions[1]
    ch.landed(ch.deletions[0], "pod-a-0", 0, 3.0, 12)
    ch.ended("pod-a-0", "Failed", 75, "main: Error (exit code 75)")
    ch.unavailable("b", ["a", "b"])  # b finished before its moment: its deletion goes to a
    assert ch.deletions[1].task == "a" and ch.deletions[1].moved_from == ["b"]
    ch.unavailable("a", [])
    rec = ch.record()
    assert (rec["seed"], rec["planned"], rec["deleted"]) == (0, 2, 1)
    assert rec["deletions"][0]["ended"] == {
        "status": "Failed",
        "exit_code": 75,
        "message": "main: Error (exit code 75)",
    }
    assert (rec["deletions"][0]["attempt"], rec["deletions"][1]["outcome"]) == (0, "missed")


def test_run_refuses_a_chaos_value_that_is_not_a_count(tmp_path):
    p = subprocess.run(
        [PY, "workflows/equivalence.py", "run", "--out", str(tmp_path / "d"), "-p", "chaos=x"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=base_env(),
        timeout=120,
    )
    assert p.returncode != 0 and "chaos must be an integer >= 0 and <= 1000, got 'x'" in p.stderr
    p = subprocess.run(
        [PY, "workflows/equivalence.py", "render", "-p", "chaos=1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=base_env(),
        timeout=120,
    )
    assert p.returncode != 0 and "unknown parameter" in p.stderr  # the runner's option, not the workflow's


# ---------------------------------------------------------------------------------------------------- evict
class FakePods:
    """steps.evict's pod backend, in memory: which pods run, what was asked of them."""

    def __init__(self, running: set[str]) -> None:
        self.run, self.asked = set(running), []

    def running(self, node=None):
        return next(iter(sorted(self.run)), None)

    def alive(self):
        return bool(self.run)

    def evict(self, name, how="evict"):
        self.asked.append(name)
        self.run.discard(name)

    def gone(self, name):
        return name not in self.run

    def ended(self, name):
        return {
            "phase": "Failed",
            "status": "Failed",
            "exit_code": 75,
            "message": "main: Error (exit code 75)",
        }


def _args(tmp_path, out):
    return type(
        "A",
        (),
        dict(
            evidence=str(tmp_path / "ev"),
            timeout=30.0,
            poll=0.01,
            every_steps=0,
            how="evict",
            task="trial",
            out=out,
        ),
    )()


def _write_steps(folder: Path, attempt: int, steps: range) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"pod-{attempt}.jsonl", "a") as f:
        for s in steps:
            f.write(json.dumps({"event": "step", "step": s, "attempt": attempt}) + "\n")


@pytest.mark.parametrize("pod_still_running", [True, False])
def test_a_restarted_evict_finishes_a_pending_eviction_on_the_same_pod_and_never_evicts_twice(
    tmp_path, pod_still_running
):
    # An earlier evict wrote its intent for point 5 (pod trial-1) and was deleted before it saw the pod end.
    out = str(tmp_path / "evictions.json")
    points = [5, 10]
    pending = {
        "event": "evict",
        "point": 5,
        "observed_step": 5,
        "attempt": 1,
        "pod": "trial-1",
        "how": "evict",
        "time": 0.0,
        "ended": None,
    }
    Path(out).write_text(json.dumps({"points": points, "evictions": [pending]}))
    _write_steps(tmp_path / "ev", 1, range(1, 7))
    pods = FakePods({"trial-1"} if pod_still_running else set())
    done = evict_step._resume(out, points)
    result = {"points": points, "evictions": done, "planned": 2, "problem": None}
    # The trial goes on in attempt 2 past the second point, then finishes.
    _write_steps(tmp_path / "ev", 2, range(6, 12))
    pods.run.add("trial-2")
    rc = evict_step._evict_all(_args(tmp_path, out), pods, points, done, 5.0, result)
    assert rc == 0
    written = json.loads(Path(out).read_text())
    assert [(e["point"], e["pod"]) for e in written["evictions"]] == [(5, "trial-1"), (10, "trial-2")]
    assert all(e["ended"] for e in written["evictions"])
    # The pending one was asked again only of its own pod, and only if that pod still ran.
    assert pods.asked == (["trial-1", "trial-2"] if pod_still_running else ["trial-2"])


def test_evict_writes_its_intent_before_it_asks(tmp_path, monkeypatch):
    out = str(tmp_path / "evictions.json")
    _write_steps(tmp_path / "ev", 0, range(1, 7))
    seen = []

    class Recording(FakePods):
        def evict(self, name, how="evict"):
            seen.append(json.loads(Path(out).read_text())["evictions"])
            super().evict(name, how)

    pods = Recording({"trial-0"})
    result = {"points": [5], "evictions": [], "planned": 1, "problem": None}
    assert evict_step._evict_all(_args(tmp_path, out), pods, [5], result["evictions"], 5.0, result) == 0
    assert seen == [[{**seen[0][0], "pod": "trial-0", "point": 5, "ended": None}]]


# --------------------------------------------------------------------------------------------------- report
def _report() -> dict:
    return {
        "passed": True,
        "tier": 1,
        "equal_tensors": 3,
        "tensors": 3,
        "max_abs_diff": 0.0,
        "floor": 0.0,
        "steps": {"total": 2, "distinct": 2, "replayed": 0, "resumed_from": [], "preemptions": 0},
        "preempt": [],
        "differing": [],
    }


def test_a_compare_killed_while_writing_leaves_no_report_json_here_or_in_the_bucket(tmp_path, monkeypatch):
    out, bucket = tmp_path / "out", tmp_path / "bucket" / "report"
    # A complete report from an earlier attempt is there: the new, interrupted one must not leave it beside
    # its own new files, nor a torn report.json.
    report_mod.write_report(out, {**_report(), "passed": False}, [], [], f"file://{bucket}")
    assert json.loads((bucket / "report.json").read_text())["passed"] is False

    def dies(*_a, **_k):
        raise KeyboardInterrupt  # where a SIGKILL could land: after report.md, before report.json

    monkeypatch.setattr(report_mod, "plot", dies)
    with pytest.raises(KeyboardInterrupt):
        report_mod.write_report(out, _report(), [], [], f"file://{bucket}")
    assert not (out / "report.json").exists()
    monkeypatch.undo()
    report_mod.write_report(
        out, _report(), [{"event": "step", "step": 1, "loss": 1.0}], [], f"file://{bucket}"
    )
    for folder in (out, bucket):
        assert json.loads((folder / "report.json").read_text())["passed"] is True
        assert "PASS" in (folder / "report.md").read_text()
        assert not list(folder.glob("*.tmp-*")) and not list(folder.glob(".loss.*"))


def test_planted_a_report_json_written_first_is_caught(tmp_path, monkeypatch):
    # Negative control: the old order (report.json first, in place) leaves it behind when the plot dies.
    out = tmp_path / "out"

    def old_write_report(out, report, ref, trial, copy_to=None):
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(report))
        report_mod.plot(out / "loss.png", {}, [], [])

    monkeypatch.setattr(report_mod, "plot", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        old_write_report(out, _report(), [], [])
    assert (out / "report.json").exists()  # what the real write_report's test above rules out


# ----------------------------------------------------------------------------------------------- steps.train
@pytest.mark.slow
def test_steps_train_deleted_before_any_step_exits_75_and_the_retry_resumes_bit_identically(tmp_path):
    # A pod deleted while it starts (torchrun, the workers' imports, a restore): nothing trained, so 75.
    from tests.helpers import CORPUS, TINY_YAML

    def train(root: str) -> list[str]:
        return [
            PY,
            "-m",
            "steps.train",
            "--nproc",
            "1",
            "--config",
            str(TINY_YAML),
            "--set",
            f"model.path={tmp_path / 'model'}",
            "--set",
            "model.create_if_missing=tiny-qwen2",
            "--set",
            f"data.uri={CORPUS}",
            "--set",
            f"checkpoint.uri=file://{tmp_path / root}",
            "--set",
            "total_steps=6",
            "--set",
            "checkpoint.every_steps=3",
            "--set",
            "model.dropout=0.1",
        ]

    cmd = train("ckpt")
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=base_env(BATON_GRACE="20"),
        start_new_session=True,
    )
    time.sleep(1.0)  # steps.train's handler is installed; torchrun and the worker are starting
    os.killpg(p.pid, signal.SIGTERM)  # as pod_init forwards it: to the whole group
    out, err = p.communicate(timeout=120)
    assert p.returncode == 75, err[-2000:]
    assert '"event": "step"' not in out and "step records: False -> exit 75" in err
    assert not list((tmp_path / "ckpt").rglob("_COMMIT"))  # nothing committed
    q = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=base_env(), timeout=300)
    assert q.returncode == 0, q.stderr[-2000:]
    ref = subprocess.run(train("ref"), capture_output=True, text=True, cwd=REPO, env=base_env(), timeout=300)
    assert ref.returncode == 0, ref.stderr[-2000:]
    a = load_flat(f"file://{next((tmp_path / 'ckpt').rglob('step-00000006'))}")
    b = load_flat(f"file://{next((tmp_path / 'ref').rglob('step-00000006'))}")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------------------------- the drill
@pytest.mark.slow
def test_a_chaos_drill_passes_with_nothing_replayed_and_records_every_deletion(tmp_path):
    out = tmp_path / "drill"
    # Seed 5 plans: verify 0.5 s after its start, the trial at step 54, compare 1.3 s after its start
    # (a deletion whose task ends first moves to another task: what happened is in report.json).
    cmd = [
        PY,
        "workflows/equivalence.py",
        "run",
        "--out",
        str(out),
        "-p",
        "total_steps=60",
        "-p",
        "evictions=3",
        "-p",
        "chaos=3",
        "-p",
        "chaos_seed=5",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=base_env(), timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] is True and report["equivalent"] is True and report["floor"] == 0.0
    s = report["steps"]
    assert (s["total"], s["distinct"], s["replayed"]) == (60, 60, 0)
    chaos = report["chaos"]
    assert (chaos["seed"], chaos["planned"], chaos["deleted"]) == (5, 3, 3)
    nodes = json.loads((out / "argo" / "nodes.json").read_text())["nodes"]
    by_pod = {n["pod_name"]: n for n in nodes}
    for d in chaos["deletions"]:
        node = by_pod[d["pod"]]
        assert (node["task"], node["attempt"]) == (d["task"], d["attempt"])
        assert node["status"] != "Succeeded"  # the deleted attempt ended, and a retry came after it
        assert any(n["task"] == d["task"] and n["attempt"] == d["attempt"] + 1 for n in nodes)
    assert {"trial", "compare"} <= {d["task"] for d in chaos["deletions"]}
    assert "chaos: 3 of 3 pod deletions (seed 5)" in p.stdout
    # The planned evictions are not chaos: one pod each, three distinct points, each seen as a preemption.
    ev = report["evictions"]["evictions"]
    assert len(ev) == 3 and len({e["point"] for e in ev}) == 3 and len({e["pod"] for e in ev}) == 3
    assert not {e["pod"] for e in ev} & {d["pod"] for d in chaos["deletions"]}
    # Every training run's evidence has each step once, and the trial's final tensors equal the reference's.
    bucket = next((out / "bucket" / "drills").iterdir())
    for role in ("reference", "replay", "trial"):
        steps = [
            r["step"] for r in read_evidence(f"file://{bucket}/evidence/{role}") if r.get("event") == "step"
        ]
        assert sorted(steps) == list(range(1, 61)), role
    finals = {
        role: load_flat(f"file://{next((bucket / role).rglob('step-00000060'))}")
        for role in ("reference", "replay", "trial")
    }
    ref = finals["reference"]
    for role in ("replay", "trial"):
        assert finals[role].keys() == ref.keys() and all(torch.equal(finals[role][k], ref[k]) for k in ref)


def test_evict_does_not_give_up_on_a_trial_whose_preemption_save_outlasts_the_gone_timeout(tmp_path):
    # Found by the soak on a loaded machine: the evicted attempt took 10 s to save and exit, evict counted
    # that wait as time without a pod, and gave up in the instant before the retry's pod appeared.
    out = str(tmp_path / "evictions.json")
    _write_steps(tmp_path / "ev", 0, range(1, 7))

    class SlowToEnd(FakePods):
        def evict(self, name, how="evict"):
            self.asked.append(name)
            self.ends_at = time.monotonic() + 0.4  # the save and the exit: longer than the gone-timeout

        def gone(self, name):
            if name in self.run and time.monotonic() >= getattr(self, "ends_at", float("inf")):
                self.run.discard(name)
                self.retry_at = time.monotonic() + 0.1  # the retry's pod, a moment later
            return name not in self.run

        def _retry_comes(self):
            if (
                not self.run
                and not self.asked[1:]
                and time.monotonic() >= getattr(self, "retry_at", float("inf"))
            ):
                self.run.add("trial-1")
                _write_steps(tmp_path / "ev", 1, range(7, 12))

        def running(self, node=None):
            self._retry_comes()
            return super().running(node)

        def alive(self):
            self._retry_comes()
            return bool(self.run)

    pods = SlowToEnd({"trial-0"})
    result = {"points": [5, 10], "evictions": [], "planned": 2, "problem": None}
    rc = evict_step._evict_all(_args(tmp_path, out), pods, [5, 10], result["evictions"], 0.3, result)
    assert rc == 0 and result["problem"] is None
    assert pods.asked == ["trial-0", "trial-1"]
