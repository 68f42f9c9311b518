"""The local control plane end to end: real etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
Argo's workflow-controller (infra/local/build.sh), with the node agent running pods as host processes.

One cluster for the module, in a temporary state folder, brought down at the end whatever happens; the
teardown then checks that none of its processes is left. Skipped when the binaries are not built.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "infra" / "local" / "build.sh"


def _why_skip() -> str:
    check = subprocess.run(["bash", str(BUILD), "--check"], capture_output=True, text=True)
    if check.returncode != 0:
        return f"local cluster binaries not built (bash infra/local/build.sh): {check.stderr.strip()}"
    if os.geteuid() != 0:
        return "the node agent needs root (a private mount namespace per container)"
    if not any((Path(d) / "kubectl").exists() for d in os.environ.get("PATH", "").split(os.pathsep)):
        return "no kubectl on PATH"
    return ""


_SKIP = _why_skip()
pytestmark = [pytest.mark.skipif(bool(_SKIP), reason=_SKIP), pytest.mark.slow]


class Local:
    """The running cluster: its state folder and a kubectl bound to its admin kubeconfig."""

    def __init__(self, state: Path):
        self.state = state
        self.env = dict(os.environ, BATON_CLUSTER_STATE=str(state))

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "infra.local.cluster", *args], cwd=REPO, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        r = subprocess.run(["kubectl", "--kubeconfig", str(self.state / "admin.kubeconfig"), "-n", "baton", *args],
                           input=stdin, capture_output=True, text=True, timeout=60)
        if check and r.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def get(self, kind: str, name: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", kind, name, "-o", "json"))

    def wait_phase(self, kind: str, name: str, phases: tuple[str, ...], timeout: float = 180) -> dict[str, Any]:
        t0 = time.monotonic()
        while True:
            obj = self.get(kind, name)
            if obj.get("status", {}).get("phase") in phases:
                return obj
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"{kind} {name} not in {phases} after {timeout:.0f} s: "
                                     f"{json.dumps(obj.get('status', {}))[:1500]}")
            time.sleep(0.5)

    def pids(self) -> list[int]:
        info = json.loads((self.state / "pids.json").read_text())
        return [p["pid"] for p in info["procs"].values()]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    local = Local(tmp_path_factory.mktemp("cluster-state"))
    t0 = time.monotonic()
    up = local.cli("up")
    pids: list[int] = []
    try:
        assert up.returncode == 0, f"cluster up failed: {up.stderr.strip()}"
        print(f"\n[e2e] {up.stdout.strip()} (measured {time.monotonic() - t0:.1f} s)")
        pids = local.pids()
        yield local
    finally:
        if (local.state / "pids.json").exists() and not pids:
            pids = local.pids()
        marker = f"BATON_LOCAL_POD_OF={local.state}".encode()
        down = local.cli("down")
        assert down.returncode == 0, f"cluster down failed: {down.stderr.strip()}"
        left = [p for p in pids if _alive(p)]
        assert not left, f"processes left running after down: {left}"
        strays = []
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and marker in (d / "environ").read_bytes().split(b"\0"):
                    strays.append(int(d.name))
            except OSError:
                continue
        assert not strays, f"pod processes left running after down: {strays}"


def test_up_again_says_healthy_and_everything_listens_on_loopback(cluster: Local):
    again = cluster.cli("up")
    assert again.returncode == 0, again.stderr
    assert "already up" in again.stdout and len(again.stdout.strip().splitlines()) == 1, again.stdout
    out = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True).stdout
    ours = {str(p) for p in cluster.pids()}
    listening = [line.split()[3] for line in out.splitlines()
                 if any(f"pid={p}," in line for p in ours)]
    assert listening, out
    # Argo's health port is hard-coded to ":6060" (cmd/workflow-controller/main.go): the one exception.
    beyond = [a for a in listening if not a.startswith("127.0.0.1:") and not a.endswith(":6060")]
    assert not beyond, f"listening beyond 127.0.0.1: {beyond}"


def test_plain_pod_succeeds_and_its_logs_are_read_through_the_api_server(cluster: Local):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
           "spec": {"restartPolicy": "Never", "containers": [{
               "name": "main", "image": "python:3.11",
               "command": ["python", "-c", "import os; print('plain pod', os.environ['POD_NAME']); "
                           "print(open('/var/run/secrets/kubernetes.io/serviceaccount/namespace').read())"],
               "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}]}}
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(pod))
    done = cluster.wait_phase("pod", "plain", ("Succeeded", "Failed"))
    assert done["status"]["phase"] == "Succeeded", json.dumps(done["status"])
    term = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed"
    assert done["status"]["podIP"] == "127.0.0.1" and done["spec"]["nodeName"] == "baton-local"
    # Through the API server, which reaches the node agent's log port over TLS checked both ways.
    assert cluster.kubectl("logs", "plain").splitlines() == ["plain pod plain", "baton"]


def _workflow(name: str, steps: list[list[dict[str, Any]]], templates: list[dict[str, Any]]) -> str:
    return json.dumps({"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": name},
                       "spec": {"entrypoint": "main",
                                "templates": [{"name": "main", "steps": steps}, *templates]}})


def _nodes(wf: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["displayName"]: n for n in wf["status"]["nodes"].values()}


def test_two_step_workflow_passes_a_parameter_and_succeeds(cluster: Local):
    produce = {"name": "produce", "container": {
        "image": "python:3.11",
        "command": ["python", "-c", "open('/tmp/word.txt', 'w').write('baton'); print('produced')"]},
        "outputs": {"parameters": [{"name": "word", "valueFrom": {"path": "/tmp/word.txt"}}]}}
    consume = {"name": "consume", "inputs": {"parameters": [{"name": "word"}]}, "container": {
        "image": "python:3.11",
        "command": ["python", "-c", "import sys; print('got', sys.argv[1]); sys.exit(sys.argv[1] != 'baton')",
                    "{{inputs.parameters.word}}"]}}
    steps = [[{"name": "produce", "template": "produce"}],
             [{"name": "consume", "template": "consume",
               "arguments": {"parameters": [{"name": "word", "value": "{{steps.produce.outputs.parameters.word}}"}]}}]]
    cluster.kubectl("create", "-f", "-", stdin=_workflow("two-steps", steps, [produce, consume]))
    wf = cluster.wait_phase("workflow", "two-steps", ("Succeeded", "Failed", "Error"))
    nodes = _nodes(wf)
    assert wf["status"]["phase"] == "Succeeded", json.dumps({k: (v["phase"], v.get("message")) for k, v in nodes.items()})
    assert nodes["produce"]["outputs"]["parameters"][0]["value"] == "baton"
    assert nodes["consume"]["inputs"]["parameters"][0]["value"] == "baton"
    pod = cluster.kubectl("get", "pods", "-l", "workflows.argoproj.io/workflow=two-steps", "-o", "json")
    names = {p["metadata"]["name"] for p in json.loads(pod)["items"] if "consume" in p["metadata"]["name"]}
    assert len(names) == 1, names
    assert "got baton" in cluster.kubectl("logs", names.pop(), "-c", "main")


def test_a_step_that_exits_3_fails_the_workflow_with_that_exit_code(cluster: Local):
    fail = {"name": "fail", "container": {"image": "python:3.11",
                                          "command": ["python", "-c", "import sys; print('failing'); sys.exit(3)"]}}
    cluster.kubectl("create", "-f", "-", stdin=_workflow("exits-3", [[{"name": "fail", "template": "fail"}]], [fail]))
    wf = cluster.wait_phase("workflow", "exits-3", ("Succeeded", "Failed", "Error"))
    assert wf["status"]["phase"] == "Failed"
    node = _nodes(wf)["fail"]
    assert node["phase"] == "Failed" and node["outputs"]["exitCode"] == "3", json.dumps(node)
    assert "exit code 3" in node.get("message", ""), node.get("message")
    pod = json.loads(cluster.kubectl("get", "pods", "-l", "workflows.argoproj.io/workflow=exits-3", "-o", "json"))
    main = [s for s in pod["items"][0]["status"]["containerStatuses"] if s["name"] == "main"][0]
    assert main["state"]["terminated"]["exitCode"] == 3
