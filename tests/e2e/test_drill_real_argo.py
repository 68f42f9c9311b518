"""The drill as a user runs it, on the real Argo controller and Argo Server of the local cluster.

A bare `python workflows/equivalence.py submit` (the export lines of `cluster up` set BATON_TARGET=local, so it
renders the drill with templates/overlays/local) through the Argo Server with baton-submitter's token (`client` auth mode), then `status NAME` against the same server
until the workflow ends. The assertions are on what Argo itself recorded: the Workflow's phase and nodes in
the API server, compare's outputs on the workflow, its artifacts in moto's bucket, and the API server's audit
log for the eviction. Skipped when the binaries are not built (tests/e2e/localcluster.py).
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import time
import urllib.request
from typing import Any

import boto3
import pytest
import yaml

from tests.e2e.localcluster import (
    FINAL,
    REPO,
    SMALL,
    SMALL_STEPS,
    WORKERS_CONFIGS,
    Drill,
    Local,
    submit,
    watch,
    why_skip,
)

_SKIP = why_skip()
pytestmark = [pytest.mark.skipif(bool(_SKIP), reason=_SKIP), pytest.mark.slow, pytest.mark.e2e]


def _tasks(wf: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The DAG's tasks (Retry nodes) by name; each with its attempts, in order, under "attempts"."""
    nodes = wf["status"]["nodes"]
    out = {}
    for n in nodes.values():
        if n.get("type") == "Retry":
            out[n["displayName"]] = dict(n, attempts=[nodes[c] for c in n.get("children", [])])
    return out


def _outputs(node: dict[str, Any]) -> dict[str, str]:
    return {p["name"]: p.get("value") for p in (node.get("outputs") or {}).get("parameters", [])}


def _s3(env: dict[str, str]):
    return boto3.client(
        "s3",
        endpoint_url=env["BATON_S3_ENDPOINT"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )


def _evictions(cluster: Local, name: str) -> list[dict[str, Any]]:
    """The API server's audit events for evictions of this workflow's pods."""
    events = []
    for line in (cluster.state / "logs" / "audit.log").read_text().splitlines():
        e = json.loads(line)
        ref = e.get("objectRef", {})
        if ref.get("subresource") == "eviction" and ref.get("name", "").startswith(f"{name}-"):
            events.append(e)
    return events


def _describe(wf: dict[str, Any], env: dict[str, str] | None = None) -> str:
    """Each task's attempts (phase, message, exit code); with `env`, also why compare said what it said
    (its report.json and the tail of its log, from the bucket), for a failure message."""
    out = json.dumps(
        {
            t: [
                (a["phase"], a.get("message"), (a.get("outputs") or {}).get("exitCode"))
                for a in n["attempts"]
            ]
            for t, n in _tasks(wf).items()
        }
    )
    compare = _tasks(wf).get("compare", {}).get("attempts", [{}])[-1]
    arts = {a["name"]: a for a in (compare.get("outputs") or {}).get("artifacts", []) if "s3" in a}
    if env is not None and arts:
        try:
            s3 = _s3(env)
            report = json.loads(
                s3.get_object(Bucket="baton", Key=arts["report-json"]["s3"]["key"])["Body"].read()
            )
            log = s3.get_object(Bucket="baton", Key=arts["main-logs"]["s3"]["key"])["Body"].read().decode()
            out += f"\nreport: {json.dumps({k: report.get(k) for k in ('passed', 'verdict', 'verify_problems')})}"
            out += f"\ncompare's log: {log[-1500:]}"
        except Exception as e:  # noqa: BLE001 -- only a failure message: say why it has no report
            out += f"\n(no report: {e})"
    return out


def test_the_drill_submitted_through_the_argo_server_passes_with_argo_retrying_the_evicted_trial(
    cluster: Local, drill: Drill
):
    """The session's drill (conftest.py): the trainer's data loader has two worker processes, and the
    eviction's SIGTERM, which the pod's emissary forwards to the whole process group, must not end them
    (trainer/data.py, IgnoreSigterm)."""
    name, phase, status, env = drill.name, drill.phase, drill.status, drill.env
    wf = cluster.get("workflow", name)  # what the controller wrote, read from the API server
    assert wf["status"]["phase"] == phase == "Succeeded", _describe(wf, env)
    assert status.returncode == 0, status.stdout  # status also read the bucket (BATON_S3_ENDPOINT and keys)
    tasks = _tasks(wf)
    trial = tasks["trial"]["attempts"]
    assert len(trial) == 2, _describe(wf)
    first, last = trial
    # Which of the two Argo records is a race between the kubelet's final status and the pod's deletion
    # (the controller's default, no ARGO_POD_STATUS_CAPTURE_FINALIZER): both are retried by the expression.
    assert (first["phase"], first.get("message")) in (
        ("Error", "pod deleted"),
        ("Failed", "main: Error (exit code 75)"),
    ), _describe(wf)
    print(f"[e2e] Argo recorded the evicted trial attempt as {first['phase']}: {first.get('message')!r}")
    assert last["phase"] == "Succeeded" and last["outputs"]["exitCode"] == "0"
    assert [a["displayName"] for a in trial] == ["trial(0)", "trial(1)"]
    assert any(line.split()[:2] == ["trial(1)", "Succeeded"] for line in status.stdout.splitlines()), (
        status.stdout
    )
    # evict went through the Eviction API, as the drill's ServiceAccount, and evicted the first trial pod.
    evictions = _evictions(cluster, name)
    # Pod names are Argo's v2 names, <workflow>-<template>-<the hash of the node id>.
    pod = f"{name}-trial-{first['id'].rsplit('-', 1)[1]}"
    assert [e["objectRef"]["name"] for e in evictions] == [pod], evictions
    assert evictions[0]["user"]["username"] == "system:serviceaccount:baton:baton-drill"
    assert evictions[0]["responseStatus"]["code"] == 201
    # compare's outputs are on the workflow: nothing replayed, one clean preemption, one retry.
    compare = tasks["compare"]["attempts"][-1]
    out = _outputs(compare)
    assert out["replayed_steps"] == "0" and out["preemptions"] == "1" and out["trial_retries"] == "1", out
    # ...and its report is in the artifact repository (moto), where the workflow says it is.
    arts = {a["name"]: a for a in compare["outputs"]["artifacts"]}
    assert {"report-json", "report-md", "loss-png"} <= set(arts)
    s3 = _s3(env)
    body = {
        k: s3.get_object(Bucket=arts[k]["s3"].get("bucket", "baton"), Key=arts[k]["s3"]["key"])["Body"].read()
        for k in ("report-json", "report-md", "loss-png")
    }
    report = json.loads(body["report-json"])
    assert report["passed"] is True and report["steps"]["preemptions"] == 1, report
    assert body["loss-png"].startswith(b"\x89PNG") and body["report-md"].strip()
    # The drill's gauges, on the controller's own Prometheus endpoint (its self-signed TLS).
    gauges = _gauges(cluster, "argo_workflows_baton_drill_")
    assert gauges.get("argo_workflows_baton_drill_passed") == 1.0, gauges
    assert gauges.get("argo_workflows_baton_drill_replayed_steps") == 0.0, gauges
    assert gauges.get("argo_workflows_baton_drill_preemptions") == 1.0, gauges


def _gauges(cluster: Local, prefix: str, timeout: float = 60) -> dict[str, float]:
    """The samples whose names start with `prefix`, scraped from the workflow controller's metrics port (Argo
    sets a gauge when it evaluates the node's metrics: wait for the first one)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # Argo makes its certificate at each start
    url = f"https://127.0.0.1:{cluster.ports()['argo_metrics']}/metrics"
    t0 = time.monotonic()
    while True:
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
        )
        with opener.open(url, timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith(prefix):
                name, value = line.rsplit(" ", 1)
                out[name.split("{", 1)[0]] = float(value)
        if out or time.monotonic() - t0 > timeout:
            return out
        time.sleep(2)


def test_the_hf_example_with_loader_workers_passes_on_the_real_controller(cluster: Local):
    """The HF Trainer example with two loader workers (dataloader_num_workers from data.num_workers), evicted
    through the Eviction API and retried by Argo: the workers outlive the SIGTERM (the callback's
    worker_init_fn), the evicted attempt saves, and the drill passes with nothing replayed."""
    env = cluster.user_env()
    config = WORKERS_CONFIGS["examples/hf_trainer/config.yaml"]
    name = submit(cluster, env, *SMALL, "-p", "trainer=hf", "-p", f"config={config}")
    phase, status = watch(env, name)
    wf = cluster.get("workflow", name)
    assert wf["status"]["phase"] == phase == "Succeeded", _describe(wf, env)
    out = _outputs(_tasks(wf)["compare"]["attempts"][-1])
    assert out["replayed_steps"] == "0" and out["preemptions"] == "1", out


def test_the_negative_control_fails_the_drill_on_the_real_controller(cluster: Local):
    env = cluster.user_env()
    t0 = time.monotonic()
    # As tests/workflow/test_drill.py's negative control: no periodic checkpoints, the SIGTERM handler off.
    name = submit(cluster, env, *SMALL, "-p", "every_steps=0", "-p", "disable_sigterm_handler=1")
    phase, status = watch(env, name)
    print(f"\n[e2e] negative control {name}: {phase} after {time.monotonic() - t0:.0f} s\n{status.stdout}")
    wf = cluster.get("workflow", name)
    assert wf["status"]["phase"] == phase == "Failed", _describe(wf)
    tasks = _tasks(wf)
    print(f"[e2e] Argo recorded the negative control's trial as {_describe(wf)}")
    compare = tasks["compare"]["attempts"][-1]
    assert compare["phase"] == "Failed", _describe(wf)
    assert len(_evictions(cluster, name)) == 1
    arts = {a["name"]: a for a in compare["outputs"]["artifacts"]}
    report = json.loads(
        _s3(env).get_object(Bucket="baton", Key=arts["report-json"]["s3"]["key"])["Body"].read()
    )
    assert report["passed"] is False and report["steps"]["preemptions"] == 0, report
    first = tasks["trial"]["attempts"][0]
    if (first["phase"], first.get("message")) == ("Error", "pod deleted"):
        # Argo's default: the pod was gone before the controller saw its exit 1, so it recorded "pod deleted",
        # which the retry expression retries; the retried trial trained again from step 1 (no checkpoints),
        # and compare fails the drill on the evidence. The local runner records exit 1 and retries nothing
        # (docs/cluster-local.md, "Where the local runner and real Argo differ").
        assert len(tasks["trial"]["attempts"]) == 2 and report["trial_retries"] == 1, _describe(wf)
        assert report["steps"]["replayed"] > 0
        assert any("without a preempt record" in p for p in report["verify_problems"]), report[
            "verify_problems"
        ]
    else:  # the controller saw the final status: what the local runner records
        assert (first["phase"], first.get("message")) == ("Failed", "main: Error (exit code 1)"), _describe(
            wf
        )
        assert report["trial_outcome"] == "died_on_sigterm" and report["trial_retries"] == 0, report


def test_the_nightly_cronworkflow_fires_and_forbid_skips_a_schedule_while_its_drill_runs(cluster: Local):
    built = subprocess.run(
        ["kubectl", "kustomize", str(REPO / "templates" / "overlays" / "local")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cron = next(d for d in yaml.safe_load_all(built) if d and d.get("kind") == "CronWorkflow")
    name = "baton-cron-e2e"
    cron["metadata"]["name"] = name
    # Every minute, so the first firing is at most a minute ahead and the next one falls inside the drill
    # (about 150 s here), where concurrencyPolicy: Forbid must skip it.
    cron["spec"].update(schedules=["* * * * *"], suspend=False)
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    small = {"total_steps": SMALL_STEPS, "evictions": "1", "retry_limit": "6"}
    for p in cron["spec"]["workflowSpec"]["arguments"]["parameters"]:
        p["value"] = small.get(p["name"], p["value"])
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(cron))
    label = f"workflows.argoproj.io/cron-workflow={name}"
    try:
        t0 = time.monotonic()
        while not (
            wfs := json.loads(cluster.kubectl("get", "workflows", "-l", label, "-o", "json"))["items"]
        ):
            assert time.monotonic() - t0 < 90, "the CronWorkflow did not fire within 90 s"
            time.sleep(2)
        first = wfs[0]["metadata"]["name"]
        log = cluster.state / "logs" / "workflow-controller.log"
        skipped = "has 'ConcurrencyPolicy: Forbid' and has an active Workflow so it was not run"
        t0 = time.monotonic()
        while not any(
            name in line and skipped in line for line in log.read_text(errors="replace").splitlines()
        ):
            assert time.monotonic() - t0 < 90, "no schedule was skipped by Forbid within 90 s"
            assert cluster.get("workflow", first)["status"].get("phase") in (None, "Pending", "Running"), (
                "the first drill ended before the next schedule: nothing to forbid"
            )
            time.sleep(2)
        names = [
            w["metadata"]["name"]
            for w in json.loads(cluster.kubectl("get", "workflows", "-l", label, "-o", "json"))["items"]
        ]
        assert names == [first], names
    finally:
        # No further firings; the drill that fired runs to its end.
        cluster.kubectl("patch", "cronworkflow", name, "--type", "merge", "-p", '{"spec":{"suspend":true}}')
    wf = cluster.wait_phase("workflow", first, FINAL, timeout=600)
    why = _describe(wf, cluster.user_env())
    print(f"\n[e2e] the cron-fired drill {first}: {wf['status']['phase']}\n{why}")
    # Once INCONCLUSIVE or failed here for two causes that were not the cron's (docs/cluster-local.md): a
    # 60-step trial outran its eviction (the evidence's flush lag), and evict died on an evidence file
    # replaced while it read it (trainer/untrusted.py now reads it again). The cron's drill must pass.
    assert wf["status"]["phase"] == "Succeeded", why
    cluster.kubectl("delete", "cronworkflow", name)


def _pod_of(wf: dict[str, Any], display: str, template: str) -> str | None:
    """The pod of attempt node `display` (e.g. "reference(0)"): Argo's v2 name, <wf>-<template>-<hash>."""
    for n in (wf.get("status") or {}).get("nodes", {}).values():
        if n.get("displayName") == display and n.get("type") == "Pod":
            return f"{wf['metadata']['name']}-{template}-{n['id'].rsplit('-', 1)[1]}"
    return None


def test_a_chaos_deletion_of_the_reference_pod_through_the_api_and_the_drill_still_passes(cluster: Local):
    env = cluster.user_env()
    name = submit(cluster, env, *SMALL)
    t0 = time.monotonic()
    while True:  # the reference's first attempt, once it has trained a few steps
        pod = _pod_of(cluster.get("workflow", name), "reference(0)", "train")
        if pod and "step 10/" in cluster.kubectl("logs", pod, "-c", "main", check=False):
            break
        assert time.monotonic() - t0 < 300, "reference(0) never reached step 10"
        time.sleep(1)
    cluster.kubectl("delete", "pod", pod, "--wait=false")
    phase, status = watch(env, name)
    print(f"\n[e2e] chaos drill {name}: {phase} after {time.monotonic() - t0:.0f} s\n{status.stdout}")
    wf = cluster.get("workflow", name)
    assert phase == "Succeeded", _describe(wf, env)
    reference = _tasks(wf)["reference"]["attempts"]
    assert len(reference) == 2 and reference[-1]["phase"] == "Succeeded", _describe(wf)
    assert (reference[0]["phase"], reference[0].get("message")) in (
        ("Error", "pod deleted"),
        ("Failed", "main: Error (exit code 75)"),
    ), _describe(wf)
    assert _outputs(_tasks(wf)["compare"]["attempts"][-1])["replayed_steps"] == "0"


def test_a_drill_whose_trial_cannot_be_scheduled_fails_at_its_deadline(cluster: Local):
    env = cluster.user_env()
    built = subprocess.run(
        ["kubectl", "kustomize", str(REPO / "templates" / "overlays" / "local")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cron = next(d for d in yaml.safe_load_all(built) if d and d.get("kind") == "CronWorkflow")
    for t in cron["spec"]["workflowSpec"]["templates"]:
        if t["name"] == "trial":  # no node has this label: the scheduler keeps the pod Pending
            t["nodeSelector"] = {"baton.example/never": "true"}
    r = subprocess.run(
        [
            sys.executable,
            "workflows/equivalence.py",
            "submit",
            "--from-file",
            "-",
            *SMALL,
            "-p",
            "deadline=30",
        ],
        input=json.dumps(cron),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    name = r.stdout.split()[0]
    t0 = time.monotonic()
    phase, status = watch(env, name, timeout=400)
    took = time.monotonic() - t0
    print(f"\n[e2e] unschedulable drill {name}: {phase} after {took:.0f} s\n{status.stdout}")
    wf = cluster.get("workflow", name)
    assert wf["spec"]["activeDeadlineSeconds"] == 30 and phase == "Failed", _describe(wf)
    assert took < 30 + 90, took  # the deadline ended it, not the drill's own end
    print(f"[e2e] the workflow's message: {wf['status'].get('message')!r}")
    tasks = _tasks(wf)
    trial = tasks["trial"]["attempts"]
    assert [(a["phase"], a.get("message")) for a in trial] == [("Failed", "Step exceeded its deadline")], (
        trial
    )
    assert tasks["trial"]["message"].startswith("retry exceeded workflow deadline"), tasks["trial"]
    # Pods still running at the deadline: Argo had set their activeDeadlineSeconds to what was left, and the
    # node ended them there, as a kubelet does (a trainer saves and exits 75). evict is always still running
    # (it waits for the trial); a trainer that finished first is Succeeded (seen once with 60 steps).
    deadline = ("Failed", "Pod was active on the node longer than the specified deadline")
    ended = {
        role: (tasks[role]["attempts"][0]["phase"], tasks[role]["attempts"][0].get("message"))
        for role in ("reference", "reference-replay", "evict")
    }
    assert ended["evict"] == deadline, _describe(wf)
    assert all(v in (deadline, ("Succeeded", None)) for v in ended.values()), _describe(wf)
    # verify's dependencies continue on failure: Argo still created it after the deadline, and failed it.
    assert [(a["phase"], a.get("message")) for a in tasks["verify"]["attempts"]] == [
        ("Failed", "Step exceeded its deadline")
    ], _describe(wf)
    nodes = {n["displayName"]: n for n in wf["status"]["nodes"].values()}
    assert nodes["compare"]["type"] == "Skipped" and nodes["compare"]["phase"] == "Omitted"


def test_a_submit_with_no_target_says_so_and_its_pods_cannot_start_here(cluster: Local):
    """The control for the session's bare submit (conftest.py's drill, with BATON_TARGET=local from the export
    lines): without the variable, submit says in one line that it sends the base Workflow, which names a
    registry's image (baton:cpu), no bucket, and no host network. This node has no pod network (docs/cluster-
    local.md): the kubelet cannot create a sandbox for a pod without hostNetwork ("failed to find network
    info"), so no step starts, and the workflow is deleted here."""
    env = {k: v for k, v in cluster.user_env().items() if k != "BATON_TARGET"}
    r = subprocess.run(
        [sys.executable, "workflows/equivalence.py", "submit", *SMALL],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "target: none (BATON_TARGET unset)" in r.stderr, r.stderr
    name = r.stdout.split()[0]
    try:
        spec = json.dumps(cluster.get("workflow", name)["spec"])
        assert "hostNetwork" not in spec and "baton:local" not in spec, spec[:2000]
        deadline, seen = time.monotonic() + 300, []
        while not seen:
            assert time.monotonic() < deadline, f"no pod of {name} was refused a sandbox in 300 s"
            events = json.loads(cluster.kubectl("get", "events", "-o", "json"))["items"]
            seen = [
                (e["involvedObject"]["name"], e.get("message", ""))
                for e in events
                if e.get("reason") == "FailedCreatePodSandBox"
                and e["involvedObject"]["name"].startswith(name)
            ]
            time.sleep(2)
        pod, message = seen[0]
        print(f"[e2e] without a target, pod {pod}: {message[:200]}")
        assert "failed to find network info" in message, seen
        phases = {
            p["metadata"]["name"]: p["status"].get("phase")
            for p in json.loads(
                cluster.kubectl("get", "pods", "-l", f"workflows.argoproj.io/workflow={name}", "-o", "json")
            )["items"]
        }
        assert phases and set(phases.values()) == {"Pending"}, phases  # no step started
    finally:
        cluster.kubectl("delete", "workflow", name, "--wait=false", check=False)
