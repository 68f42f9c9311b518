"""What only a real node gives the drill's pods (infra/local/kubelet.py: the kubelet, containerd and runc, every
container from baton's image), asserted on what the kubelet and Argo recorded: a memory limit enforced by the
kernel (OOMKilled, and not retried), `argo stop` and `argo terminate` reaching running containers, the exit
codes and termination message the drill's retry strategy reads, and a pod grace shorter than the save (the
kubelet's SIGKILL at the grace, the retry from the last commit, the drill's verdict).

The cluster is conftest.py's, shared with the other modules. Skipped where the node cannot run
(tests/e2e/localcluster.py, why_skip).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.localcluster import REPO, SMALL, SMALL_STEPS, Local, watch, why_skip
from tests.helpers import records

_SKIP = why_skip()
pytestmark = [pytest.mark.skipif(bool(_SKIP), reason=_SKIP), pytest.mark.slow, pytest.mark.e2e]
IMAGE = "baton:local"


def _local_cron() -> dict[str, Any]:
    built = subprocess.run(
        ["kubectl", "kustomize", str(REPO / "templates" / "overlays" / "local")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return next(d for d in yaml.safe_load_all(built) if d and d.get("kind") == "CronWorkflow")


def _submit_file(env: dict[str, str], obj: dict[str, Any], *params: str) -> str:
    r = subprocess.run(
        [sys.executable, "workflows/equivalence.py", "submit", "--from-file", "-", *params],
        input=json.dumps(obj),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.split()[0]


def _attempts(wf: dict[str, Any], task: str) -> list[dict[str, Any]]:
    nodes = wf["status"]["nodes"]
    (retry,) = [n for n in nodes.values() if n.get("type") == "Retry" and n["displayName"] == task]
    return [nodes[c] for c in retry.get("children", [])]


def _pods(cluster: Local, workflow: str) -> list[dict[str, Any]]:
    return json.loads(
        cluster.kubectl("get", "pods", "-l", f"workflows.argoproj.io/workflow={workflow}", "-o", "json")
    )["items"]


def _main_status(pod: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in pod["status"]["containerStatuses"] if s["name"] == "main")


def test_a_trainer_over_its_memory_limit_is_oom_killed_and_not_retried(cluster: Local):
    """The trial's container limited to 256 MiB, which importing torch alone exceeds: the kernel's OOM killer
    ends it inside its cgroup, containerd reports OOMKilled, Argo records it, and the retry strategy, which
    retries a 137 only when it is not an OOM kill, does not retry it. Control: the session's drill ran the same
    trainer without a limit and passed (test_drill_real_argo.py)."""
    env = cluster.user_env()
    cron = _local_cron()
    trial = next(t for t in cron["spec"]["workflowSpec"]["templates"] if t["name"] == "trial")
    patch = json.loads(trial["podSpecPatch"].replace("{{workflow.parameters.grace}}", "30"))
    patch["containers"] = [{"name": "main", "resources": {"limits": {"memory": "256Mi"}}}]
    trial["podSpecPatch"] = json.dumps(patch)
    name = _submit_file(env, cron, *SMALL)
    phase, status = watch(env, name, timeout=600)
    wf = cluster.get("workflow", name)
    attempts = _attempts(wf, "trial")
    print(
        f"\n[e2e] memory-limited drill {name}: {phase}; trial {[(a['phase'], a.get('message')) for a in attempts]}"
    )
    assert phase == "Failed", status.stdout
    assert len(attempts) == 1 and "OOMKilled" in (attempts[0].get("message") or ""), attempts
    pod = next(p for p in _pods(cluster, name) if "-trial-" in p["metadata"]["name"])
    term = _main_status(pod)["state"]["terminated"]
    assert term["reason"] == "OOMKilled", term
    # The drill says so: `status` prints the attempt as Argo recorded it.
    assert "OOMKilled" in status.stdout, status.stdout


def _argo(cluster: Local, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The Argo CLI built with the cluster, talking to the API server as the admin (the submitter may not
    update workflows, which stop and terminate do)."""
    admin = {k: v for k, v in env.items() if not k.startswith("ARGO_")}
    admin["KUBECONFIG"] = str(cluster.state / "admin.kubeconfig")
    return subprocess.run(
        ["argo", "-n", "baton", *args], env=admin, capture_output=True, text=True, timeout=120
    )


def _container_processes(uid: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and f"/pod{uid}/" in (d / "cgroup").read_text():
                found.append(int(d.name))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("how", ["stop", "terminate"])
def test_argo_stop_and_terminate_reach_the_running_containers(cluster: Local, how: str):
    """A long step running; `argo stop` / `argo terminate` make the controller end it through the pod (the
    wait container's kill, over exec); the step ends, the workflow fails, and no process of the pod is left."""
    step = {
        "name": "long",
        "container": {
            "image": IMAGE,
            "command": ["python", "-c", ("import time\nprint('running', flush=True)\ntime.sleep(600)\n")],
        },
    }
    name = f"to-{how}"
    wf = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": name},
        "spec": {"entrypoint": "long", "hostNetwork": True, "templates": [step]},
    }
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(wf))
    t0 = time.monotonic()
    while True:
        pods = _pods(cluster, name)
        if pods and "running" in cluster.kubectl(
            "logs", pods[0]["metadata"]["name"], "-c", "main", check=False
        ):
            break
        assert time.monotonic() - t0 < 180, f"{name}'s step never printed 'running'"
        time.sleep(1)
    uid = pods[0]["metadata"]["uid"]
    assert _container_processes(uid), "no process of the running pod found by its cgroup"
    r = _argo(cluster, cluster.user_env(), how, name)
    assert r.returncode == 0, r.stderr
    t0 = time.monotonic()
    done = cluster.wait_phase("workflow", name, ("Succeeded", "Failed", "Error"), timeout=180)
    print(
        f"\n[e2e] argo {how}: {done['status']['phase']} after {time.monotonic() - t0:.0f} s: "
        f"{done['status'].get('message')!r}"
    )
    assert done["status"]["phase"] in ("Failed", "Error"), done["status"]
    assert time.monotonic() - t0 < 120  # the step was ended, not left to its 600 s
    t0 = time.monotonic()
    while _container_processes(uid):
        assert time.monotonic() - t0 < 60, f"processes of {name}'s pod left: {_container_processes(uid)}"
        time.sleep(1)


def test_exit_codes_and_the_termination_message_are_what_argo_reads(cluster: Local):
    """Steps that end with 75 (a clean preemption), 1, 137 (SIGKILL) and 143 (SIGTERM, no handler), one writing
    a termination message: the kubelet records each exit code and the message, and Argo's node carries the same
    exit code, which the drill's retry expression reads (steps/lib/contract.py)."""
    codes = {
        "ends-75": "import sys; sys.exit(75)",
        "ends-1": "import sys; sys.exit(1)",
        "ends-137": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
        "ends-143": "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
        "says": "open('/dev/termination-log', 'w').write('baton: saved at step 7'); import sys; sys.exit(75)",
    }
    templates = [
        {"name": k, "container": {"image": IMAGE, "command": ["python", "-c", v]}} for k, v in codes.items()
    ]
    dag = {"name": "main", "dag": {"tasks": [{"name": k, "template": k} for k in codes]}}
    name = "exit-codes"
    wf = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": name},
        "spec": {"entrypoint": "main", "hostNetwork": True, "templates": [dag, *templates]},
    }
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(wf))
    done = cluster.wait_phase("workflow", name, ("Succeeded", "Failed", "Error"), timeout=300)
    nodes = {n["displayName"]: n for n in done["status"]["nodes"].values() if n.get("type") == "Pod"}
    pods = {
        p["metadata"]["annotations"]["workflows.argoproj.io/node-name"].rsplit(".", 1)[1]: p
        for p in _pods(cluster, name)
    }
    want = {"ends-75": 75, "ends-1": 1, "ends-137": 137, "ends-143": 143, "says": 75}
    got = {
        k: (
            nodes[k].get("outputs", {}).get("exitCode"),
            _main_status(pods[k])["state"]["terminated"]["exitCode"],
        )
        for k in want
    }
    print(f"\n[e2e] exit codes (Argo, kubelet): {got}")
    assert got == {k: (str(v), v) for k, v in want.items()}, got
    assert _main_status(pods["says"])["state"]["terminated"].get("message") == "baton: saved at step 7", (
        _main_status(pods["says"])["state"]["terminated"]
    )


# The pod's grace in the test below: the kubelet's own floor is 2 s (minimumGracePeriodInSeconds,
# pkg/kubelet/kuberuntime/kuberuntime_container.go); the trainer is told it has the parameter's 30 s.
SHORT_GRACE_S = 3
# klog's header, "I1207 12:00:01.123456", and the fields of the kubelet's lines this test reads (--v 2).
_KLOG_TIME = re.compile(r"^[IWE](\d{4}) (\d\d):(\d\d):(\d\d\.\d+)")


def _klog_seconds(line: str) -> float:
    m = _KLOG_TIME.match(line)
    assert m, line
    return int(m.group(2)) * 3600 + int(m.group(3)) * 60 + float(m.group(4))


def _klog_field(line: str, name: str) -> str:
    m = re.search(rf'\b{name}="?([^" ]+)"?', line)
    assert m, f"no {name} in {line}"
    return m.group(1)


def _kill_and_exit(kubelet_log: str, pod: str) -> tuple[int, int, float]:
    """For `pod`'s main container, from the kubelet's log: the grace it killed it with, the exit code the PLEG
    then saw, and the seconds between the two lines."""
    lines = kubelet_log.splitlines()
    kills = [
        line
        for line in lines
        if '"Killing container with a grace period"' in line
        and f'pod="baton/{pod}"' in line
        and 'containerName="main"' in line
    ]
    assert len(kills) == 1, kills or f"the kubelet never killed {pod}'s main container"
    container = _klog_field(kills[0], "containerID").rsplit("//", 1)[-1]
    finished = [line for line in lines if "container finished" in line and container in line]
    assert len(finished) == 1, (
        finished or f"the kubelet never saw {pod}'s main container ({container}) finish"
    )
    return (
        int(_klog_field(kills[0], "gracePeriod")),
        int(_klog_field(finished[0], "exitCode")),
        _klog_seconds(finished[0]) - _klog_seconds(kills[0]),
    )


def test_an_eviction_with_a_grace_shorter_than_the_save_is_sigkilled_and_the_retry_falls_back(cluster: Local):
    """The trial's pod grace cut to SHORT_GRACE_S while its save is slowed far past it (tests/faultfs: every
    write of a save from the step after the last checkpoint before the eviction waits 60 s, in the first
    attempt only): the kubelet SIGKILLs the main container at the grace (its log: the grace, exit 137), the
    save never commits, Argo retries the 137, and the next attempt resumes from the last committed checkpoint
    and replays the steps since, which the drill reports. The bucket is a host folder that every step mounts
    (faulty://, so the slow writes meet DCP's real writer); the other steps only see the protocol.
    Control: the session's drill, with the pod's full grace, saved at the eviction and replayed nothing."""
    from steps.evict import eviction_points
    from trainer.checkpoint.layout import COMMIT

    env = cluster.user_env()
    store = cluster.state / "slow-store"
    store.mkdir()
    store.chmod(0o777)  # the image's user 1000 writes the bucket
    every = 10
    (point,) = eviction_points(int(SMALL_STEPS), 1)
    last_before = (point - 1) // every * every
    marker = "/slow-store/save-started"
    faults = {
        "slow_writes": {str(k): 60 for k in range(last_before + 1, int(SMALL_STEPS) + 1)},
        "marker": marker,
        "once": True,
    }
    cron = _local_cron()
    spec = cron["spec"]["workflowSpec"]
    spec.setdefault("volumes", []).extend(
        [
            {"name": "faultfs", "hostPath": {"path": str(REPO / "tests" / "faultfs"), "type": "Directory"}},
            {"name": "slow-store", "hostPath": {"path": str(store), "type": "Directory"}},
        ]
    )
    for t in spec["templates"]:
        if "container" not in t:
            continue
        t["container"].setdefault("volumeMounts", []).extend(
            [
                {"name": "faultfs", "mountPath": "/faultfs", "readOnly": True},
                {"name": "slow-store", "mountPath": "/slow-store"},
            ]
        )
        t["container"]["env"].append({"name": "PYTHONPATH", "value": "/faultfs"})
        if t["name"] == "trial":
            t["container"]["env"].append({"name": "BATON_TEST_FAULTS", "value": json.dumps(faults)})
            # The pod's grace only: BATON_GRACE and steps.train's --shutdown-timeout keep the parameter's 30 s,
            # so that it is the kubelet, not the wrapper, that ends the save.
            t["podSpecPatch"] = json.dumps({"terminationGracePeriodSeconds": SHORT_GRACE_S})
    name = _submit_file(
        env, cron, *SMALL, "-p", f"every_steps={every}", "-p", "bucket=faulty:///slow-store/bucket"
    )
    phase, status = watch(env, name, timeout=900)
    wf = cluster.get("workflow", name)
    attempts = _attempts(wf, "trial")
    described = [(a["phase"], a.get("message")) for a in attempts]
    print(
        f"\n[e2e] drill {name} with a {SHORT_GRACE_S} s pod grace: {phase}; trial {described}\n{status.stdout}"
    )
    first_pod = f"{name}-trial-{attempts[0]['id'].rsplit('-', 1)[1]}"
    grace, code, took = _kill_and_exit((cluster.state / "logs" / "kubelet.log").read_text(), first_pod)
    print(f"[e2e] the kubelet killed {first_pod} with a {grace} s grace; exit {code} {took:.1f} s later")
    assert (grace, code) == (SHORT_GRACE_S, 137), (grace, code)
    # The container was still in its save when the grace ran out: it did not end before it (the PLEG sees an exit
    # up to its 1 s relist late, never early).
    assert took >= SHORT_GRACE_S - 0.1, took
    assert (store / "save-started").exists(), "the slowed save never started: nothing was cut"
    assert described[0] in (("Failed", "main: Error (exit code 137)"), ("Error", "pod deleted")), described
    assert len(attempts) == 2 and described[1][0] == "Succeeded", described
    # The bucket: the first attempt committed nothing after last_before; the second resumed there. Its
    # evidence was copied at the SIGTERM (steps/train.py), so the kill lost none of its step records.
    root = store / "bucket" / "drills" / name
    trial = [r for f in sorted((root / "evidence" / "trial").glob("*.jsonl")) for r in records(f.read_text())]
    resumes = sorted((r["attempt"], r["from_step"]) for r in trial if r["event"] == "resume")
    first_steps = sorted(r["step"] for r in trial if r["event"] == "step" and r["attempt"] == resumes[0][0])
    stopped_at = first_steps[-1]
    print(f"[e2e] trial resumes (attempt, from step): {resumes}; the first attempt's last step: {stopped_at}")
    assert [f for _, f in resumes] == [0, last_before], resumes
    assert first_steps == list(range(1, stopped_at + 1)), first_steps
    assert stopped_at > last_before and not [r for r in trial if r["event"] == "preempt"], stopped_at
    assert not [
        d
        for d in (root / "trial").rglob("step-*")
        if last_before < int(d.name[5:]) <= stopped_at and (d / COMMIT).exists()
    ]
    # ...and the drill says so: the kill, where it came, and the steps since the last commit trained twice.
    verify = json.loads((root / "verify.json").read_text())
    print(f"[e2e] verify: {verify['problems']}")
    assert (verify["evictions_met"]["killed"], verify["replayed"], verify["missing"]) == (
        1,
        stopped_at - last_before,
        [],
    ), verify
    assert any(f"exit 137, at step {stopped_at}" in p for p in verify["problems"]), verify["problems"]
    report = json.loads((root / "report" / "report.json").read_text())
    print(f"[e2e] the drill's verdict: {report['verdict']}")
    assert phase == "Failed" and report["passed"] is False, status.stdout
    assert report["verdict"].startswith(
        "NOT preemption-safe: 1 of 1 evictions ended in SIGKILL after the grace"
    )
    assert report["steps"]["replayed"] == stopped_at - last_before, report["steps"]
