"""The local Argo runner: DAG order, substitution, retries, pod deletion, refusals, cleanup.

Workflows are plain dicts (what Hera renders); every container is `fixtures/pod.py` run by this Python.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from steps.lib.contract import POD_GROUP_LABEL, QUEUE_LABEL, RELEASE_TEMPLATE, RETRY_EXPRESSION
from steps.lib.local_pods import list_pods
from steps.lib.local_pods import request_deletion as request_pod_deletion
from workflows.local import UnsupportedSpec, argo_expr, run_workflow

REPO = Path(__file__).resolve().parents[2]
POD = str(Path(__file__).parent / "fixtures" / "pod.py")
DRILL_EXPR = RETRY_EXPRESSION  # the drill's own, so that these tests prove what the drill relies on


def ctr(name: str, *args: str, retry: dict | None = None, grace: int | None = None, **extra) -> dict:
    t = {
        "name": name,
        "container": {"image": "baton:test", "command": [sys.executable, POD], "args": list(args)},
    }
    if retry is not None:
        t["retryStrategy"] = retry
    if grace is not None:
        t["podSpecPatch"] = json.dumps({"terminationGracePeriodSeconds": grace})
    t.update(extra)
    return t


def wf(tasks: list[dict], *templates: dict, params: dict[str, str] | None = None, **spec_extra) -> dict:
    spec = {
        "entrypoint": "main",
        "templates": [{"name": "main", "dag": {"tasks": tasks}}, *templates],
        **spec_extra,
    }
    if params:
        spec["arguments"] = {"parameters": [{"name": k, "value": v} for k, v in params.items()]}
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "t-", "labels": {"app": "baton"}},
        "spec": spec,
    }


def run(spec: dict, tmp_path: Path, **kw):
    out, buf = tmp_path / "out", io.StringIO()
    res = run_workflow(spec, out, progress=buf, cwd=tmp_path, env={"PYTHONPATH": str(REPO)}, **kw)
    return res, out, buf.getvalue()


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited already


def assert_no_pods_alive(out: Path) -> None:
    pods = list_pods(out / "pods")
    assert pods
    for p in pods:
        assert p["phase"] in ("Succeeded", "Failed"), p
        assert not alive(p["pid"]), p


def pod_name(workflow: str, task: str, template: str, attempt: int) -> str:
    """Argo's v2 name of a retried task's attempt, written out here on its own (FNV-1a 32 of the node's name)
    to check the runner's; test_pod_names_are_argos pins both to names the real controller gave."""
    h = 2166136261
    for b in f"{workflow}.{task}({attempt})".encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return f"{workflow}-{template}-{h}"


def test_pod_names_are_argos():
    """Names the real controller (Argo v3.7.18) gave the drill's pods (tests/e2e, 2026-12-04), from the
    runner's own naming; a task without a retryStrategy is its node itself (pod_name.go). Control: the
    runner's old `<workflow>-trial-<attempt>` is none of them."""
    from workflows.local.spec import Task

    def task(name: str, template: str, retry: object = True) -> Task:
        return Task(name, template, "", {}, [], {}, retry, None)  # type: ignore[arg-type]

    assert (
        task("trial", "trial").pod_name("baton-cron-e2e-1796396940", 0)
        == "baton-cron-e2e-1796396940-trial-3213994693"
    )
    assert (
        task("evict", "evict").pod_name("baton-equivalence-nightly-4qhx8", 0)
        == "baton-equivalence-nightly-4qhx8-evict-3309522342"
    )
    assert (
        pod_name("baton-equivalence-nightly-4qhx8", "trial", "trial", 0)
        == "baton-equivalence-nightly-4qhx8-trial-1562839561"
    )
    assert task("x", "t", None).pod_name("wf", 3) == task("x", "t", None).pod_name(
        "wf", 0
    )  # one node, no attempts
    assert "baton-cron-e2e-1796396940-trial-0" != task("trial", "trial").pod_name(
        "baton-cron-e2e-1796396940", 0
    )


def statuses(res, task: str) -> list[tuple[str, int, str]]:
    return [(n.status, n.exit_code, n.message) for n in res.attempts(task)]


def test_dag_order_and_parallelism(tmp_path):
    spec = wf(
        [
            {
                "name": "a",
                "template": "stamp",
                "arguments": {"parameters": [{"name": "me", "value": "a"}, {"name": "peer", "value": "b"}]},
            },
            {
                "name": "b",
                "template": "stamp",
                "arguments": {"parameters": [{"name": "me", "value": "b"}, {"name": "peer", "value": "a"}]},
            },
            {
                "name": "c",
                "template": "stamp",
                "depends": "a && b.Succeeded",
                "arguments": {"parameters": [{"name": "me", "value": "c"}]},
            },
            {
                "name": "d",
                "template": "stamp",
                "dependencies": ["c"],
                "arguments": {"parameters": [{"name": "me", "value": "d"}]},
            },
        ],
        ctr(
            "stamp",
            "stamp",
            str(tmp_path),
            "{{inputs.parameters.me}}",
            "{{inputs.parameters.peer}}",
            inputs={"parameters": [{"name": "me"}, {"name": "peer", "default": "me-self"}]},
        ),
    )
    (tmp_path / "me-self.start").write_text("0")  # tasks without a peer meet themselves at once
    res, out, _ = run(spec, tmp_path)
    assert res.phase == "Succeeded", res.nodes
    t = {f"{n}.{e}": float((tmp_path / f"{n}.{e}").read_text()) for n in "abcd" for e in ("start", "end")}
    assert t["a.start"] < t["b.end"] and t["b.start"] < t["a.end"]  # a and b overlapped
    assert t["c.start"] >= max(t["a.end"], t["b.end"])
    assert t["d.start"] >= t["c.end"]
    assert [n.task for n in res.nodes][2:] == ["c", "d"]
    assert json.loads((out / "nodes.json").read_text())["nodes"][3]["task"] == "d"
    assert_no_pods_alive(out)


def test_substitution_is_textual_and_never_through_a_shell(tmp_path):
    evil = """x"; echo $(id) ' `whoami` \\n {{workflow.name}}"""
    dump = tmp_path / "argv.json"
    spec = wf(
        [
            {
                "name": "show",
                "template": "show",
                "arguments": {"parameters": [{"name": "v", "value": "{{workflow.parameters.evil}}"}]},
            }
        ],
        ctr(
            "show",
            "argv",
            str(dump),
            "{{inputs.parameters.v}}",
            "pre-{{ workflow.parameters.evil }}-post",
            "{{workflow.name}}",
            "{{pod.name}}",
            "{{retries}}",
            inputs={"parameters": [{"name": "v"}]},
            retry={"limit": "1"},
        ),
        params={"evil": "harmless"},
    )
    spec["spec"]["templates"][1]["container"]["env"] = [
        {"name": "T_V", "value": "{{inputs.parameters.v}}"},
        {"name": "T_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    res, out, _ = run(spec, tmp_path, params={"evil": evil})
    assert res.phase == "Succeeded"
    got = json.loads(dump.read_text())
    pod = pod_name(res.name, "show", "show", 0)
    assert res.name.startswith("t-") and len(res.name) == 7
    assert got["argv"] == [evil, f"pre-{evil}-post", res.name, pod, "0"]
    assert got["env"] == {"T_V": evil, "T_POD": pod, "BATON_LOCAL_PODS": str(out / "pods")}
    assert res.nodes[0].pod_name == pod


def test_retry_on_exit_75_with_the_drill_expression(tmp_path):
    spec = wf(
        [{"name": "trial", "template": "trial"}],
        ctr(
            "trial",
            "seq",
            "{{retries}}",
            "75",
            "75",
            "0",
            retry={"limit": 5, "retryPolicy": "Always", "expression": DRILL_EXPR},
        ),
    )
    res, out, progress = run(spec, tmp_path)
    assert res.phase == "Succeeded"
    assert statuses(res, "trial") == [("Failed", 75, "main: Error (exit code 75)")] * 2 + [
        ("Succeeded", 0, "")
    ]
    assert [n.pod_name for n in res.nodes] == [pod_name(res.name, "trial", "trial", i) for i in range(3)]
    for i, n in enumerate(res.nodes):  # every attempt keeps its own log
        assert n.log_path == out / "logs" / f"trial-{i}.log"
        assert f"attempt {i}\n" in n.log_path.read_text()
    assert "retrying (1/5)" in progress and "retrying (2/5)" in progress
    assert re.search(r"trial attempt 0 step [123](/40)?\n", progress)  # live, while the pod runs
    assert "trial attempt 0 Failed: main: Error (exit code 75) at step 3 -> retrying (1/5)\n" in progress
    assert "trial attempt 2 Succeeded at step 23\n" in progress
    assert_no_pods_alive(out)


def test_crash_is_not_retried_by_the_drill_expression_and_dependents_do_not_run(tmp_path):
    spec = wf(
        [
            {"name": "trial", "template": "trial"},
            {"name": "verify", "template": "verify", "dependencies": ["trial"]},
        ],
        ctr(
            "trial",
            "seq",
            "{{retries}}",
            "1",
            "0",
            retry={"limit": 5, "retryPolicy": "Always", "expression": DRILL_EXPR},
        ),
        ctr("verify", "argv", str(tmp_path / "verify-ran")),
    )
    res, out, progress = run(spec, tmp_path)
    assert res.phase == "Failed"
    assert statuses(res, "trial") == [("Failed", 1, "main: Error (exit code 1)")]
    assert res.attempts("verify") == [] and not (tmp_path / "verify-ran").exists()
    assert "expression evaluated to false" in progress and "verify not run" in progress


def test_after_a_failure_running_tasks_finish_retries_included_and_ready_tasks_still_start(tmp_path):
    """As Argo v3.7.18's DAG did on the real controller (tests/e2e/test_local_cluster.py): failFast decides
    only the DAG's phase; a task whose own dependencies succeeded starts after another task failed."""
    spec = wf(
        [
            {"name": "crash", "template": "crash"},
            {"name": "slow", "template": "slow"},
            {"name": "later", "template": "later", "dependencies": ["slow"]},
        ],
        ctr("crash", "seq", "0", "1"),
        ctr(
            "slow",
            "wait-failed",
            "crash",
            "{{retries}}",
            "75",
            "0",
            retry={"limit": 1, "expression": DRILL_EXPR},
        ),
        ctr("later", "argv", str(tmp_path / "later-ran")),
    )
    res, _, progress = run(spec, tmp_path)
    assert res.phase == "Failed" and res.message == "failed: crash"
    assert statuses(res, "crash") == [("Failed", 1, "main: Error (exit code 1)")]
    assert statuses(res, "slow") == [
        ("Failed", 75, "main: Error (exit code 75)"),
        ("Succeeded", 0, ""),
    ]  # it goes on
    assert statuses(res, "later") == [("Succeeded", 0, "")] and (tmp_path / "later-ran").exists()
    assert "later not run" not in progress


def test_retry_limit_exhausted_fails(tmp_path):
    spec = wf(
        [{"name": "trial", "template": "trial"}],
        ctr(
            "trial",
            "seq",
            "{{retries}}",
            "75",
            retry={"limit": "{{workflow.parameters.retry_limit}}", "expression": DRILL_EXPR},
        ),
        params={"retry_limit": "8"},
    )
    res, _, progress = run(spec, tmp_path, params={"retry_limit": "2"})
    assert res.phase == "Failed"
    assert statuses(res, "trial") == [("Failed", 75, "main: Error (exit code 75)")] * 3
    assert "No more retries left (limit 2)" in progress
    assert res.message == "failed: trial (No more retries left (limit 2))"


def deletion_spec(tmp_path: Path, mode: str, grace: int, retry: dict, how: str = "delete") -> dict:
    return wf(
        [{"name": "trial", "template": "trial"}, {"name": "evict", "template": "evict"}],
        ctr("trial", mode, str(tmp_path), "{{retries}}", retry=retry, grace=grace),
        ctr("evict", "evict", str(tmp_path), "trial", how),
    )


def test_deleted_pod_that_exits_75_in_its_grace_is_recorded_pod_deleted_and_is_retried(tmp_path):
    spec = deletion_spec(
        tmp_path, "term75", 5, {"limit": 3, "retryPolicy": "Always", "expression": DRILL_EXPR}
    )
    res, out, progress = run(spec, tmp_path)
    assert res.phase == "Succeeded", progress
    # As the real controller (Argo v3.7.18, defaults) recorded every deletion: the object went before the
    # controller read its final status, so Argo knows no exit code.
    assert statuses(res, "trial") == [("Error", -1, "pod deleted"), ("Succeeded", 0, "")]
    assert statuses(res, "evict") == [("Succeeded", 0, "")]
    first = json.loads((out / "pods" / f"{pod_name(res.name, 'trial', 'trial', 0)}.json").read_text())
    assert first["phase"] == "Failed" and first["grace_s"] == 5 and first["pgid"] == first["pid"]
    assert (first["exit_code"], first["status"], first["message"]) == (
        75,
        "Error",
        "pod deleted",
    )  # the pod's own
    assert (out / "pods" / f"{pod_name(res.name, 'trial', 'trial', 0)}.delete").exists()
    assert (tmp_path / "child-got-term").exists()  # SIGTERM went to the pod's process group, not one pid
    assert_no_pods_alive(out)


def test_deleted_pod_that_ignores_sigterm_is_killed_after_its_grace(tmp_path):
    spec = deletion_spec(
        tmp_path, "ignore-term", 1, {"limit": 3, "retryPolicy": "Always", "expression": DRILL_EXPR}
    )
    res, out, progress = run(spec, tmp_path)
    assert res.phase == "Succeeded", progress
    # Still running at SIGKILL: the pod object is gone before its status is seen, no exit code is known.
    assert statuses(res, "trial") == [("Error", -1, "pod deleted"), ("Succeeded", 0, "")]
    assert (
        json.loads((out / "pods" / f"{pod_name(res.name, 'trial', 'trial', 0)}.json").read_text())[
            "exit_code"
        ]
        == 137
    )
    deleted = res.attempts("trial")[0]
    assert deleted.finished - deleted.started >= 1.0  # it outlived SIGTERM for the whole grace
    assert "SIGKILL" in progress
    assert not alive(int((tmp_path / "grandchild.pid").read_text()))  # the pod's whole group went
    assert_no_pods_alive(out)


def test_on_failure_policy_does_not_retry_a_deleted_pod_and_on_error_does(tmp_path):
    """A deleted pod is an Error ("pod deleted"), which OnFailure (Argo's default policy) does not retry, and
    OnError does; control for the policy: a Kueue preemption's SIGKILL after the grace is Failed 137, which
    OnError does not retry."""
    for sub in "abc":
        (tmp_path / sub).mkdir()
    res, out, progress = run(
        deletion_spec(tmp_path / "a", "ignore-term", 1, {"limit": 3, "retryPolicy": "OnFailure"}),
        tmp_path / "a",
    )
    assert res.phase == "Failed"
    assert statuses(res, "trial") == [("Error", -1, "pod deleted")]
    assert "retryPolicy OnFailure does not retry Error" in progress
    assert_no_pods_alive(out)
    res, out, progress = run(
        deletion_spec(tmp_path / "b", "ignore-term", 1, {"limit": 1, "retryPolicy": "OnError"}),
        tmp_path / "b",
    )
    assert statuses(res, "trial")[0] == ("Error", -1, "pod deleted") and len(res.attempts("trial")) == 2
    res, out, progress = run(
        deletion_spec(tmp_path / "c", "ignore-term", 1, {"limit": 3, "retryPolicy": "OnError"}, "kueue"),
        tmp_path / "c",
    )
    assert statuses(res, "trial")[0] == ("Error", -1, "pod deleted") and len(res.attempts("trial")) == 2
    assert_no_pods_alive(out)


NODE_SHUTDOWN = "Pod was terminated in response to imminent node shutdown."
LOST_VM = "pod failed: neither main nor wait container completed successfully"


@pytest.mark.parametrize(
    "how, mode, recorded",
    [
        # An eviction (the Eviction API): the object is gone before Argo reads its status (the real controller).
        ("evict", "term75", ("Error", -1, "pod deleted")),
        ("evict", "ignore-term", ("Error", -1, "pod deleted")),
        # A Kueue preemption: a Delete under the pod's own grace; Kueue's finalizer goes as soon as the pod has
        # terminated, and the object is gone before Argo reads its status (the real Kueue and Argo).
        ("kueue", "term75", ("Error", -1, "pod deleted")),
        ("kueue", "ignore-term", ("Error", -1, "pod deleted")),
        # A GKE Spot node's graceful shutdown: the kubelet's message, the process's own exit code.
        ("node-shutdown", "term75", ("Failed", 75, NODE_SHUTDOWN)),
        ("node-shutdown", "ignore-term", ("Failed", 137, NODE_SHUTDOWN)),
        # A VM lost at once: SIGKILL, no container terminated, Argo's exit -1 and message.
        ("lost-vm", "term75", ("Failed", -1, LOST_VM)),
    ],
)
def test_every_way_a_cluster_ends_a_pod_is_recorded_as_argo_does_and_the_drill_retries_it(
    tmp_path, how, mode, recorded
):
    spec = deletion_spec(
        tmp_path, mode, 1, {"limit": 3, "retryPolicy": "Always", "expression": DRILL_EXPR}, how
    )
    res, out, progress = run(spec, tmp_path)
    assert res.phase == "Succeeded", progress
    assert statuses(res, "trial") == [recorded, ("Succeeded", 0, "")]
    first = json.loads((out / "pods" / f"{pod_name(res.name, 'trial', 'trial', 0)}.json").read_text())
    assert first["phase"] == "Failed"
    if how == "kueue":  # set before the Delete, as Kueue does
        assert {
            "type": "TerminationTarget",
            "status": "True",
            "reason": "WorkloadEvictedDueToPreempted",
        } in first["conditions"]
    # A lost VM sends no SIGTERM: the pod's child never heard of one.
    assert (tmp_path / "child-got-term").exists() == (how != "lost-vm" and mode == "term75")
    assert_no_pods_alive(out)


@pytest.mark.parametrize(
    "labels, recorded",
    [
        # A pod of a queued Kueue pod group: Kueue keeps its finalizer until the group finishes, so Argo reads the
        # container's exit code (the real Kueue v0.19.2 and Argo v3.7.18: tests/e2e/test_kueue_groups.py).
        ({POD_GROUP_LABEL: "wf-trial", QUEUE_LABEL: "q"}, ("Failed", 75, "main: Error (exit code 75)")),
        # Controls: a group without a queue is not Kueue's, and neither is a queued pod without a group's finalizer
        # rule (a single queued pod's finalizer goes once it terminated): both gone before Argo reads them.
        ({POD_GROUP_LABEL: "wf-trial"}, ("Error", -1, "pod deleted")),
        ({QUEUE_LABEL: "q"}, ("Error", -1, "pod deleted")),
    ],
)
def test_an_evicted_pod_of_a_queued_kueue_group_keeps_its_exit_code(tmp_path, labels, recorded):
    spec = deletion_spec(
        tmp_path, "term75", 1, {"limit": 3, "retryPolicy": "Always", "expression": DRILL_EXPR}, "evict"
    )
    trial = next(t for t in spec["spec"]["templates"] if t["name"] == "trial")
    trial["metadata"] = {"labels": labels}
    res, out, progress = run(spec, tmp_path)
    assert res.phase == "Succeeded", progress
    assert statuses(res, "trial") == [recorded, ("Succeeded", 0, "")]
    assert_no_pods_alive(out)


def test_a_pod_deleted_that_then_crashes_is_not_retried_and_the_limit_says_no_more_retries(tmp_path):
    # The negative control's trial: SIGTERM ends it with exit 1 inside its grace; nothing retries a crash.
    spec = wf(
        [{"name": "trial", "template": "trial"}],
        ctr(
            "trial",
            "seq",
            "{{retries}}",
            "1",
            retry={"limit": 3, "retryPolicy": "Always", "expression": DRILL_EXPR},
        ),
    )
    res, out, progress = run(spec, tmp_path)
    assert res.phase == "Failed"
    assert statuses(res, "trial") == [("Failed", 1, "main: Error (exit code 1)")]
    assert "retryStrategy.expression evaluated to false" in progress


def test_template_deadline_fails_the_attempt(tmp_path):
    spec = wf(
        [{"name": "slow", "template": "slow"}],
        ctr(
            "slow",
            "sleep",
            str(tmp_path / "pid"),
            "30",
            grace=1,
            activeDeadlineSeconds=1,
            retry={"limit": 1, "retryPolicy": "OnError"},
        ),
    )
    res, out, _ = run(spec, tmp_path)
    assert res.phase == "Failed"
    assert statuses(res, "slow") == [
        ("Failed", 143, "Pod was active on the node longer than the specified deadline")
    ]
    assert_no_pods_alive(out)


def test_workflow_deadline_kills_everything_and_fails(tmp_path):
    spec = wf(
        [{"name": "slow", "template": "slow"}],
        ctr(
            "slow", "sleep", str(tmp_path / "pid"), "30", grace=1, retry={"limit": 3, "retryPolicy": "Always"}
        ),
        activeDeadlineSeconds=1,
    )
    res, out, progress = run(spec, tmp_path)
    # As the real controller recorded a drill's deadline (docs/cluster-local.md): the running pod ends as the
    # kubelet ends one past its activeDeadlineSeconds, and its retry does not start.
    assert res.phase == "Failed" and "activeDeadlineSeconds (1 s) passed" in res.message
    assert statuses(res, "slow") == [
        ("Failed", 143, "Pod was active on the node longer than the specified deadline")
    ]
    assert "retry exceeded workflow deadline" in progress
    assert_no_pods_alive(out)


def test_artifacts_are_copied(tmp_path):
    spec = wf(
        [{"name": "make", "template": "make"}],
        ctr(
            "make",
            "artifacts",
            str(tmp_path),
            outputs={
                "artifacts": [
                    {"name": "report", "path": "report.json", "archive": {"none": {}}},
                    {"name": "tree", "path": str(tmp_path / "out" / "sub"), "s3": {"key": "x"}},
                ]
            },
        ),
    )
    res, out, _ = run(spec, tmp_path)
    assert res.phase == "Succeeded"
    arts = res.nodes[0].artifacts
    assert arts == {
        "report": out / "artifacts" / "make" / "report",
        "tree": out / "artifacts" / "make" / "tree",
    }
    assert json.loads(arts["report"].read_text()) == {"ok": True}
    assert (arts["tree"] / "a.txt").read_text() == "A"


def test_output_parameters_are_read_from_files_with_a_default(tmp_path):
    spec = wf(
        [{"name": "make", "template": "make"}],
        ctr(
            "make",
            "artifacts",
            str(tmp_path),
            outputs={
                "parameters": [
                    {"name": "here", "valueFrom": {"path": str(tmp_path / "out" / "sub" / "a.txt")}},
                    {"name": "absent", "valueFrom": {"path": str(tmp_path / "nope"), "default": "-1"}},
                ]
            },
        ),
    )
    res, _, _ = run(spec, tmp_path)
    assert res.phase == "Succeeded"
    assert res.nodes[0].parameters == {"here": "A", "absent": "-1"}


def test_missing_artifact_is_an_error(tmp_path):
    spec = wf(
        [{"name": "make", "template": "make"}],
        ctr(
            "make", "argv", str(tmp_path / "x"), outputs={"artifacts": [{"name": "gone", "path": "nope.txt"}]}
        ),
    )
    res, _, _ = run(spec, tmp_path)
    assert res.phase == "Failed"
    assert res.nodes[0].status == "Error" and "nope.txt" in res.nodes[0].message


def test_container_entrypoint_and_enum(tmp_path):
    spec = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "solo"},
        "spec": {
            "entrypoint": "one",
            "arguments": {
                "parameters": [{"name": "mode", "value": "a", "enum": ["a", "b"], "description": "which"}]
            },
            "templates": [ctr("one", "argv", str(tmp_path / "one.json"), "{{workflow.parameters.mode}}")],
        },
    }
    res, _, _ = run(spec, tmp_path, params={"mode": "b"})
    # A container entrypoint is Argo's root node: its pod is named as the workflow (pod_name.go).
    assert (res.phase, res.name, res.nodes[0].pod_name) == ("Succeeded", "solo", "solo")
    assert json.loads((tmp_path / "one.json").read_text())["argv"] == ["b"]
    with pytest.raises(UnsupportedSpec, match=r"spec.arguments.parameters\[0\]: value 'c' is not in enum"):
        run(spec, tmp_path, params={"mode": "c"})


def _base(tmp_path: Path) -> dict:
    return wf(
        [{"name": "a", "template": "a"}, {"name": "b", "template": "b", "dependencies": ["a"]}],
        ctr("a", "argv", str(tmp_path / "ran-a"), retry={"limit": 1, "expression": DRILL_EXPR}),
        ctr("b", "argv", str(tmp_path / "ran-b")),
        params={"p": "1"},
    )


def _set(path: str, value):
    def mutate(spec: dict) -> None:
        *keys, last = path.split(".")
        node = spec
        for k in keys:
            node = node[int(k)] if isinstance(node, list) else node[k]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


def _script(spec: dict) -> None:
    t = spec["spec"]["templates"][2]
    t["script"] = {"image": "x", "source": "print(1)"}
    del t["container"]


REFUSALS = [
    ("spec volumes", _set("spec.volumes", [{"name": "v", "emptyDir": {}}]), r"^spec\.volumes: not supported"),
    ("script template", _script, r"^spec\.templates\[2\]\.script: not supported"),
    (
        "workingDir",
        _set("spec.templates.1.container.workingDir", "/w"),
        r"^spec\.templates\[1\]\.container\.workingDir: not supported",
    ),
    (
        "volumeMounts",
        _set("spec.templates.1.container.volumeMounts", []),
        r"^spec\.templates\[1\]\.container\.volumeMounts: not supported by the local runner$",
    ),
    (
        "podSpecPatch key",
        _set("spec.templates.1.podSpecPatch", "nodeSelector: {a: b}\nterminationGracePeriodSeconds: 3"),
        r"^spec\.templates\[1\]\.podSpecPatch\.nodeSelector: not supported",
    ),
    (
        "expression identifier",
        _set("spec.templates.1.retryStrategy.expression", "lastRetry.exitCode == '75' || workflow.status"),
        r"^spec\.templates\[1\]\.retryStrategy\.expression: unknown identifier 'workflow\.status'",
    ),
    (
        "expression function",
        _set("spec.templates.1.retryStrategy.expression", "sprig.int(lastRetry.exitCode) == 75"),
        r"^spec\.templates\[1\]\.retryStrategy\.expression: unknown function",
    ),
    (
        "backoff",
        _set("spec.templates.1.retryStrategy.backoff", {"duration": "1s"}),
        r"^spec\.templates\[1\]\.retryStrategy\.backoff: not supported",
    ),
    (
        "bad policy",
        _set("spec.templates.1.retryStrategy.retryPolicy", "Sometimes"),
        r"retryPolicy: 'Sometimes'",
    ),
    (
        "env secret",
        _set("spec.templates.1.container.env", [{"name": "S", "valueFrom": {"secretKeyRef": {}}}]),
        r"^spec\.templates\[1\]\.container\.env\[0\]\.valueFrom: only fieldRef",
    ),
    (
        "unresolvable",
        _set("spec.templates.2.container.args.1", "{{tasks.a.outputs.result}}"),
        r"^spec\.templates\[2\]\.container\.args\[1\]: cannot resolve \{\{tasks\.a\.outputs\.result\}\}",
    ),
    (
        "unknown workflow param",
        _set("spec.templates.2.container.args.1", "{{workflow.parameters.q}}"),
        r"cannot resolve \{\{workflow\.parameters\.q\}\}",
    ),
    (
        "retries without retryStrategy",
        _set("spec.templates.2.container.args.1", "{{retries}}"),
        r"cannot resolve \{\{retries\}\}",
    ),
    (
        "unknown dependency",
        _set("spec.templates.0.dag.tasks.1.dependencies", ["zz"]),
        r"unknown dependency 'zz'",
    ),
    ("cycle", _set("spec.templates.0.dag.tasks.0.dependencies", ["b"]), r"dependency cycle: a -> b -> a"),
    (
        "depends with ||",
        _set("spec.templates.0.dag.tasks.1.depends", "a || b"),
        r"tasks\[1\]\.depends: anything but 'a && b'",
    ),
    ("unknown template", _set("spec.templates.0.dag.tasks.1.template", "nope"), r"unknown template 'nope'"),
    ("nested dag", _set("spec.templates.0.dag.tasks.1.template", "main"), r"nested DAGs are not supported"),
    ("task when", _set("spec.templates.0.dag.tasks.1.when", "1 == 1"), r"tasks\[1\]\.when: not supported"),
    ("dag failFast", _set("spec.templates.0.dag.failFast", False), r"dag\.failFast: not supported"),
    (
        "missing input",
        _set("spec.templates.2.inputs", {"parameters": [{"name": "x"}]}),
        r"no value for input 'x'",
    ),
    ("no command", _set("spec.templates.2.container.command", []), r"command: required by the local runner"),
    ("onExit", _set("spec.onExit", "b"), r"^spec\.onExit: not supported"),
]


@pytest.mark.parametrize("mutate,message", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refusals_name_the_field_and_run_nothing(tmp_path, mutate, message):
    run(_base(tmp_path), tmp_path / "ok")  # the unmutated spec is fine
    assert (tmp_path / "ran-a").exists() and (tmp_path / "ran-b").exists()
    (tmp_path / "ran-a").unlink()
    (tmp_path / "ran-b").unlink()
    spec = copy.deepcopy(_base(tmp_path))
    mutate(spec)
    with pytest.raises(UnsupportedSpec, match=message):
        run(spec, tmp_path)
    assert not (tmp_path / "ran-a").exists() and not (tmp_path / "out").exists()


def test_the_kueue_release_handler_is_accepted_and_runs_nothing(tmp_path):
    """The one exit handler the runner accepts: the release of Kueue pod groups (no Kueue here). The spec
    runs as without it (control: any other onExit is refused, in REFUSALS)."""
    spec = copy.deepcopy(_base(tmp_path))
    spec["spec"]["onExit"] = RELEASE_TEMPLATE
    spec["spec"]["templates"].append(
        {
            "name": RELEASE_TEMPLATE,
            "container": {"image": "x", "command": ["sh", "-c", f"touch {tmp_path / 'released'}"]},
        }
    )
    run(spec, tmp_path / "ok")
    assert (tmp_path / "ran-a").exists() and (tmp_path / "ran-b").exists()
    assert not (tmp_path / "released").exists()


def test_unknown_param_override_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="unknown workflow parameter 'typo'"):
        run(_base(tmp_path), tmp_path, params={"typo": "1"})
    assert not (tmp_path / "out").exists()


def test_request_pod_deletion_of_an_unknown_pod_is_a_404(tmp_path):
    with pytest.raises(FileNotFoundError):
        request_pod_deletion(tmp_path, "nope-trial-0")


RUNNER = """
import json, sys
from pathlib import Path
from workflows.local import run_workflow
run_workflow(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]), progress=None)
"""


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, -signal.SIGINT), (signal.SIGTERM, 143)])
def test_signal_to_the_runner_stops_every_pod(tmp_path, sig, code):
    spec = wf(
        [{"name": "a", "template": "slow"}, {"name": "b", "template": "slow"}],
        ctr("slow", "sleep", str(tmp_path / "pid-{{pod.name}}"), "60", grace=30),
    )
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(tmp_path / "spec.json"), str(out)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 20
    while len(list(tmp_path.glob("pid-*"))) < 2:  # both pods are up
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(sig)
    assert proc.wait(timeout=20) == code
    nodes = json.loads((out / "nodes.json").read_text())["nodes"]
    assert sorted(n["task"] for n in nodes) == ["a", "b"]
    assert {n["message"] for n in nodes} == {f"runner interrupted ({sig.name})"}
    for f in tmp_path.glob("pid-*"):
        assert not alive(int(f.read_text()))
    assert_no_pods_alive(out)


@pytest.mark.parametrize(
    "env,expected",
    [
        # Each message Argo records for an attempt a cluster ended (ARGO-FACTS), word for word:
        (
            {"lastRetry.exitCode": "75", "lastRetry.message": "main: Error (exit code 75)"},
            True,
        ),  # deleted, evicted,
        (
            {"lastRetry.exitCode": "75", "lastRetry.message": "Error (exit code 75)"},
            True,
        ),  # Kueue; v3.6's words
        ({"lastRetry.exitCode": "-1", "lastRetry.message": "pod deleted"}, True),  # the object went first
        ({"lastRetry.exitCode": "75", "lastRetry.message": NODE_SHUTDOWN}, True),  # GKE Spot, saved in time
        ({"lastRetry.exitCode": "137", "lastRetry.message": NODE_SHUTDOWN}, True),  # GKE Spot, killed
        # SIGKILLed after the grace by an eviction or a Kueue preemption: only the exit code says so.
        ({"lastRetry.exitCode": "137", "lastRetry.message": "main: Error (exit code 137)"}, True),
        ({"lastRetry.exitCode": "-1", "lastRetry.message": LOST_VM}, True),  # a VM lost at once
        (
            {
                "lastRetry.exitCode": "137",
                "lastRetry.message": "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi.",
            },
            True,
        ),
        # A crash is never retried, whatever its code; neither is an OOM kill or a deadline.
        ({"lastRetry.exitCode": "1", "lastRetry.message": "main: Error (exit code 1)"}, False),
        ({"lastRetry.exitCode": "137", "lastRetry.message": "OOMKilled (exit code 137)"}, False),
        ({"lastRetry.exitCode": "137", "lastRetry.message": "main: OOMKilled (exit code 137)"}, False),
        (
            {
                "lastRetry.exitCode": "-1",
                "lastRetry.message": "Pod was active on the node longer than the specified deadline",
            },
            False,
        ),
    ],
)
def test_drill_expression(env, expected):
    env = {"lastRetry.status": "Failed", "lastRetry.duration": "1.5", **env}
    assert argo_expr.parse(DRILL_EXPR).evaluate(env) is expected


def test_expression_semantics():
    env = {
        "lastRetry.exitCode": "75",
        "lastRetry.status": "Error",
        "lastRetry.message": "m",
        "lastRetry.duration": "3",
    }

    def ev(src: str) -> bool:
        return argo_expr.parse(src).evaluate(env)

    assert ev('lastRetry.exitCode == "75"') and not ev("lastRetry.exitCode == 75")  # a string, as in Argo
    assert ev("asInt(lastRetry.exitCode) >= 75 && asInt(lastRetry.duration) < 10")
    assert ev("!(lastRetry.status == 'Failed') && lastRetry.status != \"Failed\"")
    assert ev("lastRetry.status == 'Failed' || lastRetry.status == 'Error' && lastRetry.message == 'm'")
    assert not ev("(lastRetry.status == 'Failed' || lastRetry.status == 'Error') && lastRetry.message == 'n'")
    assert ev("lastRetry.message matches '^m$'") and not ev("lastRetry.message matches 'x'")
    with pytest.raises(argo_expr.ExprError):
        ev("asInt(lastRetry.message) == 1")  # a run-time error: not an integer
    with pytest.raises(argo_expr.ExprError):
        ev("lastRetry.exitCode < 1")  # string < int
    for bad in (
        "lastRetry.exitCode = 75",
        "(lastRetry.status == 'Error'",
        "lastRetry.status == 'Error' )",
        "workflow.status == 'x'",
        "eval('1')",
        "lastRetry.message matches '('",
        "1 +",
        "",
        "'unterminated",
    ):
        with pytest.raises(argo_expr.ExprError):
            argo_expr.parse(bad)


def test_with_sequence_expands_into_items_named_as_argo_names_them_each_retried_on_its_own(tmp_path):
    spec = wf(
        [
            {
                "name": "grp",
                "template": "node",
                "withSequence": {"count": "{{workflow.parameters.n}}"},
                "arguments": {"parameters": [{"name": "code", "value": "7{{item}}"}]},
            },
            {"name": "after", "template": "dump", "dependencies": ["grp"]},
        ],
        ctr(
            "node",
            "seq",
            "{{retries}}",
            "{{inputs.parameters.code}}",
            "0",
            inputs={"parameters": [{"name": "code"}]},
            retry={"limit": 2, "retryPolicy": "OnFailure"},
        ),
        ctr("dump", "argv", str(tmp_path / "after.json"), "x"),
        params={"n": "2"},
    )
    spec["spec"]["templates"][2]["container"]["env"] = [
        {"name": "T_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    ]
    res, out, _ = run(spec, tmp_path)
    assert res.phase == "Succeeded", res.nodes
    for item in (0, 1):
        assert statuses(res, f"grp({item}:{item})") == [
            ("Failed", 70 + item, f"main: Error (exit code {70 + item})"),
            ("Succeeded", 0, ""),
        ]
        assert [n.pod_name for n in res.attempts(f"grp({item}:{item})")] == [
            pod_name(res.name, f"grp({item}:{item})", "node", a) for a in (0, 1)
        ]
    registry = {p["name"]: p for p in list_pods(out / "pods")}
    first = registry[pod_name(res.name, "grp(1:1)", "node", 0)]
    assert (first["task"], first["item"]) == ("grp", "1")
    after = res.attempts("after")[0]
    assert after.started >= max(n.finished for n in res.nodes if n.task.startswith("grp("))
    assert json.loads((tmp_path / "after.json").read_text())["env"]["T_IP"] == "127.0.0.1"
    assert_no_pods_alive(out)


def test_item_is_substituted_only_in_a_tasks_arguments(tmp_path):
    spec = wf(
        [{"name": "grp", "template": "t", "withSequence": {"count": "2"}}], ctr("t", "argv", "{{item}}")
    )
    with pytest.raises(UnsupportedSpec, match=r"cannot resolve \{\{item\}\}"):
        run(spec, tmp_path)
    assert not (tmp_path / "out" / "pods").exists()


def test_chaos_deletes_a_pod_of_a_group_and_only_that_item_is_retried(tmp_path):
    from workflows.local import Chaos

    spec = wf(
        [
            {
                "name": "grp",
                "template": "node",
                "withSequence": {"count": "2"},
                "arguments": {"parameters": [{"name": "out", "value": str(tmp_path / "pid-{{item}}")}]},
            }
        ],
        ctr(
            "node",
            "sleep",
            "{{inputs.parameters.out}}",
            "3",
            inputs={"parameters": [{"name": "out"}]},
            retry={"limit": 2, "retryPolicy": "Always"},
        ),
    )
    res, out, _ = run(spec, tmp_path, chaos=Chaos(1, 0, ["grp"], delay_s=0.3))
    assert res.phase == "Succeeded", res.nodes
    [d] = res.chaos["deletions"]
    assert d["outcome"] == "deleted" and d["task"] == "grp"
    hit = next(item for item in (0, 1) if d["pod"] == pod_name(res.name, f"grp({item}:{item})", "node", 0))
    assert [n.status for n in res.attempts(f"grp({hit}:{hit})")] == ["Error", "Succeeded"]  # "pod deleted"
    assert [n.status for n in res.attempts(f"grp({1 - hit}:{1 - hit})")] == ["Succeeded"]
    assert_no_pods_alive(out)
