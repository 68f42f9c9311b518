"""The drill end to end on this machine: the rendered workflow through the local runner, a trial
evicted twice, and its negative control (a trainer without its SIGTERM handler) that must fail."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.helpers import PY, REPO, base_env, with_workers

pytestmark = pytest.mark.slow
NASTY = "x\"; echo $(id) ' `whoami`"


def drill(out, *params):
    cmd = [PY, "workflows/equivalence.py", "run", "--out", str(out)]
    for p in params:
        cmd += ["-p", p]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=base_env(), timeout=600)


def test_drill_passes_and_writes_the_report_contract(tmp_path):
    out = tmp_path / "drill"
    # 80 steps: the second eviction point (64) leaves the trial room to be caught before it ends.
    p = drill(out, "total_steps=80", "evictions=2", f"prefix={NASTY}")
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["equivalent"] is True and report["tier"] == 1 and report["max_abs_diff"] == 0.0
    assert report["floor"] == 0.0 and report["tensors"] > 100
    s = report["steps"]
    assert (s["total"], s["distinct"], s["replayed"], s["preemptions"]) == (80, 80, 0, 2)
    assert len(s["resumed_from"]) == 2 and all(0 < r < 80 for r in s["resumed_from"])
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert "bit-identical: " in p.stdout and "drill PASSED" in p.stdout
    # The parameter with quotes and $(...) stayed data: it is a folder name under the bucket.
    assert (out / "bucket" / NASTY).is_dir()
    # The numbers behind the Prometheus gauges reached the compare node's output parameters.
    nodes = json.loads((out / "argo" / "nodes.json").read_text())["nodes"]
    params = [
        n["parameters"]
        for n in (nodes["nodes"] if isinstance(nodes, dict) else nodes)
        if n["task"] == "compare"
    ][0]
    assert params["replayed_steps"] == "0" and float(params["max_save_ms"]) > 0
    assert params["trial_retries"] == "2" and params["preemptions"] == "2"
    assert 0 < float(params["min_grace_left_s"]) <= 30
    # Every attempt's log is kept.
    assert len(list((out / "argo" / "logs").glob("trial-*.log"))) == 3


def test_negative_control_a_trial_that_dies_on_sigterm_fails_the_drill_with_a_report_that_says_so(tmp_path):
    out = tmp_path / "drill"
    # As on the real controller (tests/e2e, docs/cluster-local.md): the trial exits 1 inside its grace after
    # the eviction, but its pod is gone before Argo reads that, so Argo records "pod deleted" and the retry
    # expression retries it; the retry trains again from step 1 (no checkpoints), and compare fails the
    # drill on the trainer's own evidence: an eviction that ended an attempt without a preempt record.
    p = drill(out, "total_steps=40", "evictions=1", "every_steps=0", "disable_sigterm_handler=1")
    assert p.returncode == 1, p.stdout
    nodes = json.loads((out / "argo" / "nodes.json").read_text())["nodes"]
    trial = [(n["status"], n["exit_code"], n["message"]) for n in nodes if n["task"] == "trial"]
    assert trial == [("Error", -1, "pod deleted"), ("Succeeded", 0, "")]
    assert [n["status"] for n in nodes if n["task"] == "compare"] == ["Failed"]
    report = json.loads((out / "report.json").read_text())
    # A retry from step 1 of a deterministic trainer ends equal to the reference: the checkpoints alone
    # would pass it, and only the evidence fails it.
    assert report["passed"] is False and report["equivalent"] is True
    assert report["trial_retries"] == 1 and report["steps"]["preemptions"] == 0
    assert report["steps"]["replayed"] > 0  # the retry started again from step 1
    [evicted] = report["comebacks"]
    assert evicted["exit_code"] == 1  # the pod's own last status: it died on SIGTERM
    why = "1 eviction(s) ended an attempt without a preempt record"
    assert any(why in x for x in report["verify_problems"]), report["verify_problems"]
    assert "an evicted attempt died without committing its step" in (out / "report.md").read_text()
    assert "drill FAILED" in p.stdout


def test_a_drill_whose_trial_kueue_preempts_passes_with_nothing_replayed(tmp_path):
    out = tmp_path / "drill"
    # Kueue preempts a plain pod with a Delete under the pod's own grace, after marking it
    # TerminationTarget; the trial saves, exits 75, and the retry expression brings it back. Argo records
    # each preempted attempt as the real Kueue and Argo did: Error, "pod deleted", no exit code.
    p = drill(out, "total_steps=80", "evictions=2", "eviction=kueue", "queue=baton")
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] is True and report["equivalent"] is True
    assert (report["steps"]["replayed"], report["steps"]["preemptions"]) == (0, 2)
    assert [e["how"] for e in report["evictions"]["evictions"]] == ["kueue", "kueue"]
    pods = [json.loads(f.read_text()) for f in sorted((out / "argo" / "pods").glob("*-trial-*.json"))]
    preempted = [pod for pod in pods if pod.get("conditions")]
    assert len(preempted) == 2 and all(
        c["reason"] == "WorkloadEvictedDueToPreempted" for pod in preempted for c in pod["conditions"]
    )
    nodes = json.loads((out / "argo" / "nodes.json").read_text())["nodes"]
    assert [(n["status"], n["message"]) for n in nodes if n["task"] == "trial"] == [
        ("Error", "pod deleted"),
        ("Error", "pod deleted"),
        ("Succeeded", ""),
    ]
    assert [c["exit_code"] for c in report["comebacks"]] == [75, 75]  # the container's own, from the registry


def test_a_drill_that_can_never_schedule_fails_by_its_deadline(tmp_path):
    """Every training pod stays Pending (a Spot stockout, an image that cannot be pulled, a Kueue quota
    stall): the drill fails by its deadline, with Argo's words, instead of running forever and blocking the
    next nightly drill (concurrencyPolicy Forbid). Control: the same drill without a deadline would wait:
    the rendered spec carries one derived from its size."""
    out = tmp_path / "drill"
    p = drill(
        out, "total_steps=10", "evictions=1", "deadline=6", "unschedulable=reference,reference-replay,trial"
    )
    assert p.returncode == 1, p.stdout + p.stderr[-2000:]
    assert "workflow Failed" in p.stdout and "activeDeadlineSeconds (6 s) passed" in p.stderr
    nodes = json.loads((out / "argo" / "nodes.json").read_text())["nodes"]
    by_task = {n["task"]: n for n in nodes}
    for task in ("reference", "reference-replay", "trial"):
        assert (
            by_task[task]["status"] == "Failed" and by_task[task]["message"] == "Step exceeded its deadline"
        ), task
    assert "compare" not in by_task  # nothing after the deadline
    from workflows.params import drill_deadline_s, values_of

    assert drill_deadline_s(values_of({"total_steps": "10", "evictions": "1"})) > 0


def test_a_drill_across_two_nodes_passes_with_every_tensor_equal_and_names_each_evicted_pod(tmp_path):
    """Every role is a group of two pods (docs/multinode.md); each eviction ends one pod of the trial's group
    (drawn under the seed: node 1, then node 0), both pods of the group exit 75 at the same step, and each
    comes back through its own retry."""
    out = tmp_path / "drill"
    p = drill(out, "nodes=2", "evictions=2", "total_steps=48")
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] is True and report["tier"] == 1 and report["max_abs_diff"] == 0.0
    assert report["equal_tensors"] == report["tensors"] > 100
    s = report["steps"]
    assert (s["total"], s["distinct"], s["replayed"], s["preemptions"]) == (48, 48, 0, 2)
    evicted = [(c["node"], c["pod"], c["exit_code"]) for c in report["comebacks"]]
    assert [(n, code) for n, _, code in evicted] == [(1, 75), (0, 75)]
    # Argo's v2 pod names: the item's attempt node `<wf>.trial(<n>:<n>)(<attempt>)`, hashed.
    recorded = json.loads((out / "argo" / "nodes.json").read_text())
    nodes_by_pod = {n["pod_name"]: n["task"] for n in recorded["nodes"]}
    assert [nodes_by_pod[pod] for _, pod, _ in evicted] == ["trial(1:1)", "trial(0:0)"]
    assert all(pod.startswith(f"{recorded['workflow']}-trial-") for _, pod, _ in evicted)
    assert all(c["back_s"] is not None and c["back_s"] > 0 for c in report["comebacks"])
    nodes = json.loads((out / "argo" / "nodes.json").read_text())["nodes"]
    # Both pods of the group stop at each eviction: the evicted one is "pod deleted" (no exit code, as Argo
    # records a deleted pod), the other exits 75 by itself.
    assert [n["exit_code"] for n in nodes if n["task"] == "trial(1:1)"] == [-1, 75, 0]
    assert [n["exit_code"] for n in nodes if n["task"] == "trial(0:0)"] == [75, -1, 0]
    for role in ("reference", "reference-replay"):
        assert [n["status"] for n in nodes if n["task"].startswith(f"{role}(")] == ["Succeeded"] * 2
    assert "pod evicted" in (out / "report.md").read_text() and "drill PASSED" in p.stdout


def test_the_negative_control_across_two_nodes_fails_for_its_cause_without_a_rendezvous_wait(tmp_path):
    """nodes=2 without the SIGTERM handling: the evicted node dies on SIGTERM, its peer's rank finds its peer
    gone within the collective timeout and ends retry-safe (`retry_later` `peer_lost`, 75), and both come back
    from the last periodic save. The verdict blames the eviction that met no preempt record: the survivor's
    `peer_lost` is not the evicted node's save (it was counted as one, and the verdict then named only the
    replayed steps). No round waits out its rendezvous timeout (no `round_not_formed`)."""
    out = tmp_path / "drill"
    p = drill(out, "nodes=2", "evictions=1", "total_steps=48", "disable_sigterm_handler=1")
    assert p.returncode == 1, p.stdout + p.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] is False and report["evictions_met"]["lost"] == 1, report["verdict"]
    assert report["verdict"].startswith(
        "NOT preemption-safe: 1 of 1 evictions ended without a preempt record"
    ), report["verdict"]
    assert report["steps"]["replayed"] > 0 and report["steps"]["preemptions"] == 0
    trial = [
        json.loads(line)
        for f in sorted(out.glob("bucket/*/*/evidence/trial/*.jsonl"))
        for line in f.read_text().splitlines()
        if line.startswith("{")
    ]
    assert [r["reason"] for r in trial if r["event"] == "retry_later"] == ["peer_lost"], trial


def test_a_drill_with_loader_workers_and_unseeded_noise_measures_a_floor_and_passes_at_tier_2(tmp_path):
    """The documented way to try Tier 2 on a CPU (docs/tier2.md: BATON_NOISE with no seed, tests/faultfs on
    PYTHONPATH, one environment for the whole drill) gives every role its own noise: a floor above 0, and a
    correct trial within it. The trainer's loader has two workers, which the evictions' SIGTERM (sent to each
    pod's process group) must not kill: every eviction lands. The control, one seed for every role (what the
    seam's seeded form gives a drill), measures a floor of 0: tests/unit/test_tier2.py."""
    out = tmp_path / "drill"
    config = with_workers(REPO / "trainer" / "configs" / "tiny.yaml", tmp_path / "tiny-workers.yaml")
    cmd = [PY, "workflows/equivalence.py", "run", "--out", str(out)]
    for param in ("total_steps=80", "evictions=2", "tier=2", f"config={config}"):
        cmd += ["-p", param]
    p = subprocess.run(
        cmd, capture_output=True, text=True, cwd=REPO, env=base_env(BATON_NOISE="1e-4"), timeout=600
    )
    report = json.loads((out / "report.json").read_text())
    seeds = {
        f.name: [line for line in f.read_text().splitlines() if "BATON_NOISE seed" in line]
        for f in sorted((out / "argo" / "logs").glob("*.log"))
    }
    figures = {k: report.get(k) for k in ("floor_l2", "l2_diff", "diff_over_floor", "floor_slack")}
    assert p.returncode == 0, f"{report['verdict']}\n{figures}\nseeds: {seeds}\n{p.stderr[-3000:]}"
    assert report["tier"] == 2 and report["floor_l2"] > 0 and report["passed"], report
    assert report["evictions_met"]["landed"] == 2 and report["steps"]["replayed"] == 0
    logs = "".join(f.read_text() for f in (out / "argo" / "logs").glob("trial-*.log"))
    assert "DataLoader worker" not in logs, logs[-3000:]
