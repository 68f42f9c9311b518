"""The local control plane end to end: real etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
Argo's workflow-controller (infra/local/build.sh), and a real node: the kubelet, containerd and runc running every
pod's containers from baton's image (infra/local/kubelet.py, image.sh). Every pod uses the node's network.

The cluster is conftest.py's, shared with test_drill_real_argo.py. Skipped when the binaries are not built.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.localcluster import Local, why_skip

IMAGE = "baton:local"  # baton's own image (infra/local/image.sh): it has python, as every step needs

_SKIP = why_skip()
pytestmark = [pytest.mark.skipif(bool(_SKIP), reason=_SKIP), pytest.mark.slow, pytest.mark.e2e]


def test_up_again_says_healthy_and_everything_listens_on_loopback(cluster: Local):
    again = cluster.cli("up")
    assert again.returncode == 0, again.stderr
    lines = again.stdout.strip().splitlines()
    assert "already up" in lines[0], again.stdout
    # The export lines again, every time: a user in a new shell has them to paste (and the UI's address).
    exports = dict(line.removeprefix("export ").split("=", 1) for line in lines if line.startswith("export "))
    assert {"KUBECONFIG", "ARGO_SERVER", "ARGO_TOKEN", "PATH"} <= exports.keys(), again.stdout
    assert any(line.startswith("# Argo UI: https://127.0.0.1:") for line in lines), again.stdout
    out = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True).stdout
    ours = {str(p) for p in cluster.pids()}
    listening = [line.split()[3] for line in out.splitlines() if any(f"pid={p}," in line for p in ours)]
    assert listening, out
    # Three exceptions, each with no address Argo lets one set: the controller's health port ":6060"
    # (cmd/workflow-controller/main.go), its Prometheus endpoint's ":PORT" (util/telemetry/
    # exporter_prometheus.go) and the Argo Server's ":PORT" (server/apiserver/argoserver.go).
    ports = cluster.ports()
    exceptions = (":6060", f":{ports['argo_metrics']}", f":{ports['argo_server']}")
    # And the kubelet, on the node's own address: the API server reaches it there (a loopback node IP is refused).
    kubelet = f"{_node_ip(cluster)}:{ports['kubelet']}"
    beyond = [
        a for a in listening if not a.startswith("127.0.0.1:") and not a.endswith(exceptions) and a != kubelet
    ]
    assert not beyond, f"listening beyond 127.0.0.1: {beyond}"


def _node_ip(cluster: Local) -> str:
    return json.loads((cluster.state / "pids.json").read_text())["node_ip"]


def test_plain_pod_succeeds_and_its_logs_are_read_through_the_api_server(cluster: Local):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain"},
        "spec": {
            "restartPolicy": "Never",
            "hostNetwork": True,
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": [
                        "python",
                        "-c",
                        "import os; print('plain pod', os.environ['POD_NAME']); "
                        "print(open('/var/run/secrets/kubernetes.io/serviceaccount/namespace').read()); "
                        "print('uid', os.getuid(), 'app', os.path.isdir('/app/trainer'))",
                    ],
                    "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                }
            ],
        },
    }
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(pod))
    done = cluster.wait_phase("pod", "plain", ("Succeeded", "Failed"))
    assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"])
    term = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed"
    assert done["status"]["podIP"] == _node_ip(cluster) and done["spec"]["nodeName"] == "baton-local"
    # The image's own user and filesystem, not the host's: the Dockerfile's USER 1000 and its /app.
    # Through the API server, which reaches the kubelet over TLS checked both ways.
    assert cluster.kubectl("logs", "plain").splitlines() == ["plain pod plain", "baton", "uid 1000 app True"]


def _workflow(name: str, steps: list[list[dict[str, Any]]], templates: list[dict[str, Any]]) -> str:
    return json.dumps(
        {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": name},
            "spec": {
                "entrypoint": "main",
                "hostNetwork": True,
                "templates": [{"name": "main", "steps": steps}, *templates],
            },
        }
    )


def _nodes(wf: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["displayName"]: n for n in wf.get("status", {}).get("nodes", {}).values()}


def test_two_step_workflow_passes_a_parameter_and_succeeds(cluster: Local):
    produce = {
        "name": "produce",
        "container": {
            "image": IMAGE,
            "command": ["python", "-c", "open('/tmp/word.txt', 'w').write('baton'); print('produced')"],
        },
        "outputs": {"parameters": [{"name": "word", "valueFrom": {"path": "/tmp/word.txt"}}]},
    }
    consume = {
        "name": "consume",
        "inputs": {"parameters": [{"name": "word"}]},
        "container": {
            "image": IMAGE,
            "command": [
                "python",
                "-c",
                "import sys; print('got', sys.argv[1]); sys.exit(sys.argv[1] != 'baton')",
                "{{inputs.parameters.word}}",
            ],
        },
    }
    steps = [
        [{"name": "produce", "template": "produce"}],
        [
            {
                "name": "consume",
                "template": "consume",
                "arguments": {
                    "parameters": [{"name": "word", "value": "{{steps.produce.outputs.parameters.word}}"}]
                },
            }
        ],
    ]
    cluster.kubectl("create", "-f", "-", stdin=_workflow("two-steps", steps, [produce, consume]))
    wf = cluster.wait_phase("workflow", "two-steps", ("Succeeded", "Failed", "Error"))
    nodes = _nodes(wf)
    assert wf["status"]["phase"] == "Succeeded", json.dumps(
        {k: (v["phase"], v.get("message")) for k, v in nodes.items()}
    )
    assert nodes["produce"]["outputs"]["parameters"][0]["value"] == "baton"
    assert nodes["consume"]["inputs"]["parameters"][0]["value"] == "baton"
    pod = cluster.kubectl("get", "pods", "-l", "workflows.argoproj.io/workflow=two-steps", "-o", "json")
    names = {p["metadata"]["name"] for p in json.loads(pod)["items"] if "consume" in p["metadata"]["name"]}
    assert len(names) == 1, names
    assert "got baton" in cluster.kubectl("logs", names.pop(), "-c", "main")


def test_a_step_that_exits_3_fails_the_workflow_with_that_exit_code(cluster: Local):
    fail = {
        "name": "fail",
        "container": {
            "image": IMAGE,
            "command": ["python", "-c", "import sys; print('failing'); sys.exit(3)"],
        },
    }
    cluster.kubectl(
        "create", "-f", "-", stdin=_workflow("exits-3", [[{"name": "fail", "template": "fail"}]], [fail])
    )
    wf = cluster.wait_phase("workflow", "exits-3", ("Succeeded", "Failed", "Error"))
    assert wf["status"]["phase"] == "Failed"
    node = _nodes(wf)["fail"]
    assert node["phase"] == "Failed" and node["outputs"]["exitCode"] == "3", json.dumps(node)
    assert "exit code 3" in node.get("message", ""), node.get("message")
    pod = json.loads(
        cluster.kubectl("get", "pods", "-l", "workflows.argoproj.io/workflow=exits-3", "-o", "json")
    )
    main = [s for s in pod["items"][0]["status"]["containerStatuses"] if s["name"] == "main"][0]
    assert main["state"]["terminated"]["exitCode"] == 3


def _pod_processes(cluster: Local, pod: str, uid: str | None = None) -> list[int]:
    """The host pids of a pod's processes: those in its cgroup (the kubelet names it pod<uid>, cgroupfs driver)."""
    uid = uid or cluster.get("pod", pod)["metadata"]["uid"]
    found = []
    for d in Path("/proc").iterdir():
        try:
            groups = (d / "cgroup").read_text() if d.name.isdigit() else ""
        except OSError:
            continue
        if f"/pod{uid}/" in groups:
            found.append(int(d.name))
    return found


def _assert_own_pid_namespace(cluster: Local, pod: str) -> None:
    """Before anything signals the pod: its processes are in a PID namespace of their own. Argo's emissary
    forwards signals as kill(-1) (docs/cluster-local.md), which on the host would hit every process."""
    pids = _pod_processes(cluster, pod)
    assert pids, f"no processes found for pod {pod}"
    ours = os.readlink("/proc/self/ns/pid")
    shared = [p for p in pids if os.readlink(f"/proc/{p}/ns/pid") == ours]
    assert not shared, f"pod {pod} processes {shared} share the host's PID namespace"


def _wait_log(cluster: Local, pod: str, container: str, text: str, timeout: float = 120) -> None:
    t0 = time.monotonic()
    while text not in cluster.kubectl("logs", pod, "-c", container, check=False):
        assert time.monotonic() - t0 < timeout, f"{pod}/{container} never logged {text!r}"
        time.sleep(0.5)


def test_deleting_a_pod_whose_pid1_ignores_sigterm_kills_it_after_the_grace_period(cluster: Local):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ignores-term"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "hostNetwork": True,
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": ["python", "-c", "import time; print('up', flush=True); time.sleep(300)"],
                }
            ],
        },
    }
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(pod))
    _wait_log(cluster, "ignores-term", "main", "up")
    _assert_own_pid_namespace(cluster, "ignores-term")
    uid = cluster.get("pod", "ignores-term")["metadata"]["uid"]
    t0 = time.monotonic()
    cluster.kubectl("delete", "pod", "ignores-term", "--wait=true", "--timeout=60s")
    took = time.monotonic() - t0
    # PID 1 with no handler ignores SIGTERM, as in a container: only the SIGKILL at 2 s ends it.
    assert 2 <= took < 15, took
    assert not _pod_processes(cluster, "ignores-term", uid)


def test_a_deleted_argo_step_gets_sigterm_through_the_emissary_and_the_workflow_does_not_succeed(
    cluster: Local,
):
    train = {
        "name": "train",
        "container": {
            "image": IMAGE,
            "command": [
                "python",
                "-c",
                (
                    "import signal, sys, time\n"
                    "signal.signal(signal.SIGTERM, lambda *a: (print('SIGTERM: saving', flush=True), sys.exit(75)))\n"
                    "print('training', flush=True)\n"
                    "time.sleep(300)\n"
                ),
            ],
        },
    }
    cluster.kubectl(
        "create", "-f", "-", stdin=_workflow("preempted", [[{"name": "train", "template": "train"}]], [train])
    )
    t0 = time.monotonic()
    while not (
        pods := json.loads(
            cluster.kubectl("get", "pods", "-l", "workflows.argoproj.io/workflow=preempted", "-o", "json")
        )["items"]
    ):
        assert time.monotonic() - t0 < 120, "no pod for workflow preempted"
        time.sleep(0.5)
    name = pods[0]["metadata"]["name"]
    _wait_log(cluster, name, "main", "training")
    # Argo must have seen the pod running first: a pod that vanishes while its node is still Pending in the
    # workflow's status is created again under the same name, as if it had never been made.
    t0 = time.monotonic()
    while _nodes(cluster.get("workflow", "preempted")).get("train", {}).get("phase") != "Running":
        assert time.monotonic() - t0 < 120, "Argo never marked step train Running"
        time.sleep(0.5)
    _assert_own_pid_namespace(cluster, name)
    t0 = time.monotonic()
    cluster.kubectl("delete", "pod", name, "--grace-period=30", "--wait=true", "--timeout=90s")
    # Far less than the 30 s grace: the SIGTERM reached the Python process through argoexec emissary.
    assert time.monotonic() - t0 < 15
    wf = cluster.wait_phase("workflow", "preempted", ("Succeeded", "Failed", "Error"))
    node = _nodes(wf)["train"]
    assert wf["status"]["phase"] in ("Failed", "Error") and node["phase"] in ("Failed", "Error"), json.dumps(
        node
    )
    # Which one Argo records is a race: the final status if it saw it before the pod was gone, else
    # "pod deleted" (shared/ARGO-FACTS.md, ARGO_POD_STATUS_CAPTURE_FINALIZER).
    msg = node.get("message", "")
    print(f"\n[e2e] Argo recorded the deleted step as {node['phase']}: {msg!r}")
    assert "exit code 75" in msg or "pod deleted" in msg, msg


def test_pod_gc_and_ttl_strategy_remove_what_they_say(cluster: Local):
    """The drill's podGC (OnPodSuccess: each succeeded pod at once) on a workflow with a step that succeeds and
    one that fails in parallel; the WorkflowTaskResults, which the controller deletes once the workflow is
    complete; then its ttlStrategy, shortened from the drill's days to seconds: the controller deletes the
    Workflow, and the controller manager's garbage collector the failed pod it owned. Control: until the TTL,
    the failed pod stays."""
    from workflows.equivalence import POD_GC, TTL

    name = "gc-ttl"
    ok = {"name": "ok", "container": {"image": IMAGE, "command": ["python", "-c", "print('ok')"]}}
    bad = {
        "name": "bad",
        "container": {
            "image": IMAGE,
            "command": ["python", "-c", "import time, sys; time.sleep(3); sys.exit(2)"],
        },
    }
    wf = json.loads(
        _workflow(name, [[{"name": "ok", "template": "ok"}, {"name": "bad", "template": "bad"}]], [ok, bad])
    )
    ttl_s = 20
    assert TTL.seconds_after_failure > ttl_s  # the drill keeps a failed drill for days; here, seconds
    wf["spec"]["podGC"] = POD_GC.model_dump(by_alias=True, exclude_none=True)
    wf["spec"]["ttlStrategy"] = {"secondsAfterSuccess": ttl_s, "secondsAfterFailure": ttl_s}
    label = f"workflows.argoproj.io/workflow={name}"
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(wf))
    done = cluster.wait_phase("workflow", name, ("Succeeded", "Failed", "Error"))
    assert done["status"]["phase"] == "Failed"
    uid = done["metadata"]["uid"]
    owners = {
        o["uid"]
        for p in json.loads(cluster.kubectl("get", "pods", "-l", label, "-o", "json"))["items"]
        for o in p["metadata"].get("ownerReferences", [])
    }
    assert owners == {uid}, owners  # what the garbage collector follows once the Workflow is gone

    def pods() -> dict[str, str]:
        items = json.loads(cluster.kubectl("get", "pods", "-l", label, "-o", "json"))["items"]
        return {
            p["metadata"]["annotations"]["workflows.argoproj.io/node-name"].rsplit(".", 1)[1]: p["status"][
                "phase"
            ]
            for p in items
        }

    t0 = time.monotonic()
    while "ok" in pods():  # OnPodSuccess: the succeeded pod goes; the failed one stays
        assert time.monotonic() - t0 < 60, f"podGC left the succeeded pod: {pods()}"
        time.sleep(1)
    assert pods() == {"bad": "Failed"}, pods()

    def results() -> list[dict[str, Any]]:
        return json.loads(cluster.kubectl("get", "workflowtaskresults", "-l", label, "-o", "json"))["items"]

    # The task results go when the workflow completes: v3.7.18's controller deletes them by label itself
    # (operator.go, deleteTaskResults); owner references would otherwise leave them to the Workflow's TTL.
    t0 = time.monotonic()
    while results():
        assert all(r["metadata"]["ownerReferences"][0]["uid"] == uid for r in results())
        assert time.monotonic() - t0 < 60, f"the task results outlived the completed workflow: {results()}"
        time.sleep(1)
    assert pods() == {"bad": "Failed"}  # control: before the TTL, the failed pod stays
    # The TTL controller queues a workflow only from an informer event that shows it completed. Argo writes
    # its own update back into the informer's store (operator.go, writeBackToInformer), and client-go then
    # passes the watch event with that same resourceVersion only to handlers in a resync (shared_informer.go,
    # OnUpdate): when the write-back wins, the TTL waits for the next resync, 20 min (controller.go,
    # workflowResyncPeriod). CI lost that race (argoproj/argo-workflows#10947). Any later change to the
    # workflow gives the TTL controller its event; this annotation is one. The expiry counts from finishedAt.
    cluster.kubectl("annotate", "workflow", name, "baton.test/ttl-event=1", check=False)  # gone already: fine
    t0 = time.monotonic()
    while cluster.kubectl("get", "workflow", name, "--ignore-not-found", "-o", "name").strip():
        assert time.monotonic() - t0 < ttl_s + 90, "ttlStrategy did not delete the workflow"
        time.sleep(2)
    t0 = time.monotonic()
    while pods():  # owned by the Workflow: the controller manager's garbage collector removes it
        assert time.monotonic() - t0 < 90, f"garbage collection left {pods()}"
        time.sleep(2)


def test_a_dag_still_starts_a_task_whose_dependencies_succeeded_after_another_task_failed(cluster: Local):
    """Argo v3.7.18's DAG keeps creating every task whose dependencies are met after an unrelated task failed
    (dag.go runs executeDAGTask for every target on each pass; failFast only decides the DAG's phase), and
    the DAG fails at the end. The local runner follows this (tests/workflow/test_local_runner.py)."""
    name = "dag-after-failure"
    fail = {"name": "fail", "container": {"image": IMAGE, "command": ["python", "-c", "raise SystemExit(1)"]}}
    slow = {
        "name": "slow",
        "container": {"image": IMAGE, "command": ["python", "-c", "import time; time.sleep(15)"]},
    }
    after = {"name": "after", "container": {"image": IMAGE, "command": ["python", "-c", "print('after')"]}}
    dag = {
        "name": "main",
        "dag": {
            "tasks": [
                {"name": "fail", "template": "fail"},
                {"name": "slow", "template": "slow"},
                {"name": "after", "template": "after", "dependencies": ["slow"]},
            ]
        },
    }
    wf = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": name},
        "spec": {"entrypoint": "main", "hostNetwork": True, "templates": [dag, fail, slow, after]},
    }
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(wf))
    done = cluster.wait_phase("workflow", name, ("Succeeded", "Failed", "Error"))
    nodes = _nodes(done)
    phases = {k: nodes[k]["phase"] for k in ("fail", "slow") if k in nodes}
    print(
        f"\n[e2e] DAG after a failure: {done['status']['phase']}, "
        f"{ {k: v['phase'] for k, v in nodes.items()} }"
    )
    assert done["status"]["phase"] == "Failed" and phases == {"fail": "Failed", "slow": "Succeeded"}, phases
    assert nodes.get("after", {}).get("phase") == "Succeeded", {k: v["phase"] for k, v in nodes.items()}
