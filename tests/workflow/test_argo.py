"""The drill on a cluster, without one: `submit` and `status` against a loopback Argo Server that records
what it is sent and answers with recorded responses (tests/workflow/fixtures/argo/*.json, Argo's real
response shape), a file:// checkpoint store in tmp_path, the kustomize overlays, and the template metrics."""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.crd import crd_schema, validate_kueue
from tests.helpers import PY, REPO, base_env
from tests.overlays import CLUSTER_IMAGE, TERRAFORM_OUTPUT, cluster_overlay, overlays
from workflows import equivalence as eq

FIXTURES = Path(__file__).parent / "fixtures" / "argo"
NAME = "baton-equivalence-7xk2p"  # the name in the recorded responses
TOKEN = "Bearer eyJhbGciOiJSUzI1NiJ9.test-token"
CREATE = "/api/v1/workflows/baton"
KUBECTL = shutil.which("kubectl")
OVERLAYS = REPO / "templates" / "overlays"


ARGO_ENV = (
    "ARGO_SERVER",
    "ARGO_TOKEN",
    "ARGO_NAMESPACE",
    "ARGO_SECURE",
    "ARGO_INSECURE_SKIP_VERIFY",
    "ARGO_HTTP1",
    "ARGO_BASE_HREF",
)


@functools.cache
def _crd_validator(kind: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(crd_schema(kind))


def validate(obj: dict) -> None:
    """tests.crd.validate (Argo's CRD schema, strict), with the validator built once per kind: the
    schema self-check that jsonschema.validate repeats on every call costs about a second here."""
    assert obj.get("apiVersion") == "argoproj.io/v1alpha1", obj.get("apiVersion")
    _crd_validator(obj["kind"]).validate(obj)


def fixture(name: str):
    return json.loads((FIXTURES / name).read_text())


class FakeArgo:
    """A threaded loopback HTTP server: records every request, answers from `routes`."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], tuple[int, object]] = {}
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                path = self.path.split("?")[0]
                outer.requests.append(
                    {
                        "method": self.command,
                        "path": path,
                        "body": body,
                        "authorization": self.headers.get("Authorization"),
                        "content_type": self.headers.get("Content-Type"),
                    }
                )
                status, payload = outer.routes.get(
                    (self.command, path), (404, {"code": 5, "message": f"{path} not found"})
                )
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header(
                    "Content-Type", "application/json" if not isinstance(payload, bytes) else "text/html"
                )
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _handle

            def log_message(self, *args) -> None:  # quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def start(self) -> FakeArgo:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def argo(monkeypatch):
    srv = FakeArgo().start()
    for k in ARGO_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("ARGO_SERVER", srv.host)
    monkeypatch.setenv("ARGO_TOKEN", TOKEN)
    monkeypatch.setenv("ARGO_SECURE", "false")
    monkeypatch.delenv("BATON_TARGET", raising=False)  # as a cluster's export lines may have set it
    yield srv
    srv.stop()


def error_of(argv: list[str]) -> str:
    """The one-line error that `main(argv)` exits with."""
    with pytest.raises(SystemExit) as ei:
        eq.main(argv)
    msg = ei.value.code
    assert isinstance(msg, str) and msg.startswith("error: "), msg
    assert "\n" not in msg, msg
    return msg


def params_of(wf: dict) -> dict[str, str]:
    return {p["name"]: p["value"] for p in wf["spec"]["arguments"]["parameters"]}


def templates_of(obj: dict) -> dict[str, dict]:
    spec = obj["spec"].get("workflowSpec", obj["spec"])
    return {t["name"]: t for t in spec["templates"]}


# ---- submit --------------------------------------------------------------------------------------------


def test_submit_posts_the_drill_with_parameters_as_workflow_arguments(argo, capsys):
    argo.routes[("POST", CREATE)] = (200, fixture("created.json"))
    assert eq.main(["submit", "-p", "evictions=7"]) == 0

    assert len(argo.requests) == 1
    req = argo.requests[0]
    assert (req["method"], req["path"]) == ("POST", CREATE)
    assert req["authorization"] == TOKEN
    assert req["content_type"] == "application/json"
    body = json.loads(req["body"])
    assert set(body) == {"namespace", "workflow"} and body["namespace"] == "baton"
    wf = body["workflow"]
    validate(wf)
    assert wf["kind"] == "Workflow" and wf["metadata"]["generateName"] == "baton-equivalence-"
    assert wf["metadata"]["namespace"] == "baton"
    params = params_of(wf)
    assert params["evictions"] == "7" and params["retry_limit"] == "12"
    # Nothing else changed: the other parameters keep their defaults, the templates are the rendered ones.
    defaults = {k: v for k, (v, _) in eq.PARAMETERS.items()}
    assert {k: v for k, v in params.items() if k not in ("evictions", "retry_limit")} == {
        k: v for k, v in defaults.items() if k not in ("evictions", "retry_limit")
    }
    assert wf["spec"]["templates"] == eq.rendered()[0]["spec"]["templates"]

    out = capsys.readouterr().out.splitlines()
    assert out == [NAME, f"http://{argo.host}/workflows/baton/{NAME}"]


def test_flags_win_over_the_environment_and_base_href_prefixes_every_path(argo, monkeypatch, capsys):
    monkeypatch.setenv("ARGO_NAMESPACE", "elsewhere")
    argo.routes[("POST", "/argo/api/v1/workflows/drills")] = (200, fixture("created.json"))
    assert (
        eq.main(
            [
                "submit",
                "--namespace",
                "drills",
                "--token",
                "Bearer from-flag",
                "--argo-base-href",
                "/argo/",
                "-p",
                "total_steps=50",
                "-p",
                "evictions=2",
                "-p",
                "retry_limit=3",
            ]
        )
        == 0
    )
    req = argo.requests[0]
    assert req["path"] == "/argo/api/v1/workflows/drills" and req["authorization"] == "Bearer from-flag"
    params = params_of(json.loads(req["body"])["workflow"])
    assert (params["total_steps"], params["evictions"], params["retry_limit"]) == ("50", "2", "3")
    assert capsys.readouterr().out.splitlines()[1] == f"http://{argo.host}/argo/workflows/drills/{NAME}"


def test_no_token_sends_no_authorization_header(argo, monkeypatch):
    monkeypatch.delenv("ARGO_TOKEN")
    argo.routes[("POST", CREATE)] = (200, fixture("created.json"))
    assert eq.main(["submit"]) == 0
    assert argo.requests[0]["authorization"] is None


@pytest.mark.parametrize(
    "env, argv, message",
    [
        ({"ARGO_SERVER": None}, [], "no Argo Server: set ARGO_SERVER"),
        ({"ARGO_SERVER": "http://127.0.0.1:2746"}, [], "without a scheme"),
        ({"ARGO_SERVER": "127.0.0.1"}, [], "is not host:port"),
        ({"ARGO_SERVER": "127.0.0.1:99999"}, [], "is not host:port"),
        ({}, ["--argo-server", "argo server:2746"], "--argo-server='argo server:2746' is not host:port"),
        (
            {"ARGO_TOKEN": "eyJhbGciOiJSUzI1NiJ9.no-prefix"},
            [],
            "ARGO_TOKEN must be the whole Authorization value",
        ),
        ({"ARGO_TOKEN": "Bearer"}, [], "ARGO_TOKEN must be the whole Authorization value"),
        ({}, ["--token", "bearer abc"], "--token must be the whole Authorization value"),
        ({"ARGO_SECURE": "yes"}, [], "ARGO_SECURE must be true or false"),
        ({"ARGO_INSECURE_SKIP_VERIFY": "maybe"}, [], "ARGO_INSECURE_SKIP_VERIFY must be true or false"),
        ({"ARGO_HTTP1": "2"}, [], "ARGO_HTTP1 must be true or false"),
        ({"ARGO_NAMESPACE": "Not_A_Namespace"}, [], "is not a Kubernetes namespace name"),
        ({}, ["-p", "evictionz=3"], "unknown parameter"),
        ({}, ["-p", "evictions"], "expected name=value"),
        ({}, ["-p", "evictions=x"], "evictions must be an integer >= 0"),
        ({}, ["-p", "nodes=" + "9" * 5000], "nodes must be an integer >= 1 and <= 1024"),
        ({}, ["-p", "eviction=lost-vm"], "eviction must be one of evict on a cluster"),
        ({}, ["-p", "evictions=5", "-p", "retry_limit=5"], "must exceed evictions"),
        ({}, ["-p", "evictions=50", "-p", "total_steps=40"], "do not fit"),
        ({}, ["--from-file", "/nonexistent/drill.yaml"], "--from-file /nonexistent/drill.yaml"),
    ],
)
def test_bad_settings_are_refused_before_any_request(argo, monkeypatch, env, argv, message):
    argo.routes[("POST", CREATE)] = (200, fixture("created.json"))
    for k, v in env.items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)
    assert message in error_of(["submit", *argv])
    assert argo.requests == []


def test_a_token_is_never_echoed_in_an_error(argo, monkeypatch):
    monkeypatch.setenv("ARGO_TOKEN", "s3cr3t-token-value")
    assert "s3cr3t" not in error_of(["submit"])


@pytest.mark.parametrize(
    "status, payload, expected",
    [
        (401, "unauthorized.json", ["HTTP 401", "token not valid", "ARGO_TOKEN"]),
        (
            403,
            {
                "code": 7,
                "message": 'workflows.argoproj.io is forbidden: User "system:serviceaccount:baton:x" '
                'cannot create resource "workflows"',
            },
            ["HTTP 403", "cannot create resource"],
        ),
        (500, "internal-error.json", ["HTTP 500", "failed calling webhook"]),
        (502, b"<html><body>502 Bad Gateway</body></html>", ["HTTP 502", "Bad Gateway"]),
    ],
)
def test_http_errors_are_one_clear_line_naming_the_server(argo, status, payload, expected):
    argo.routes[("POST", CREATE)] = (status, fixture(payload) if isinstance(payload, str) else payload)
    msg = error_of(["submit"])
    assert f"create workflow at http://{argo.host}: " in msg
    for text in expected:
        assert text in msg
    assert len(argo.requests) == 1


def test_an_answer_that_is_not_a_workflow_is_a_clear_error(argo):
    argo.routes[("POST", CREATE)] = (200, b"<html>an ingress default page</html>")
    assert "is ARGO_SERVER the Argo Server?" in error_of(["submit"])


def test_an_unreachable_server_is_a_clear_error(argo, monkeypatch):
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("ARGO_SERVER", f"127.0.0.1:{port}")
    msg = error_of(["submit"])
    assert f"cannot reach the Argo Server at http://127.0.0.1:{port}" in msg and "Connection refused" in msg


def test_https_is_the_default_and_a_plain_http_server_is_a_clear_tls_error(argo, monkeypatch):
    monkeypatch.delenv("ARGO_SECURE")
    msg = error_of(["submit"])
    assert f"at https://{argo.host}: TLS failed" in msg and "ARGO_SECURE=false" in msg
    assert argo.requests == []  # the handshake failed; no HTTP request was understood


def test_the_cli_prints_one_line_and_exits_1_without_a_traceback(argo):
    argo.routes[("POST", CREATE)] = (401, fixture("unauthorized.json"))
    env = base_env(ARGO_SERVER=argo.host, ARGO_TOKEN=TOKEN, ARGO_SECURE="false")
    p = subprocess.run(
        [PY, "workflows/equivalence.py", "submit", "-p", "evictions=2"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert p.returncode == 1
    assert p.stdout == ""
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("error: create workflow at http://")
    assert "Traceback" not in p.stderr and "HTTP 401" in p.stderr


# ---- status --------------------------------------------------------------------------------------------


def _commit(root: Path, role: str, run: str, *steps: int, incomplete: tuple[int, ...] = ()) -> None:
    for s in steps + incomplete:
        d = root / role / "runs" / run / f"step-{s:08d}"
        d.mkdir(parents=True)
        (d / "manifest.json").write_text("{}")
        if s not in incomplete:
            (d / "_COMMIT").write_text("sha")


def _records(path: Path, attempt: int, steps: range, t0: float, preempt: bool = False) -> None:
    run = "tiny-0123456789ab"
    lines = [
        {"event": "resume", "run_id": run, "attempt": attempt, "rank": 0, "time": t0, "step": steps[0] - 1}
    ]
    lines += [
        {
            "event": "step",
            "run_id": run,
            "attempt": attempt,
            "rank": 0,
            "time": t0 + i + 1,
            "step": s,
            "loss": 5.0 - s / 100,
            "lr": 1e-3,
            "tokens_per_s": 900.0,
        }
        for i, s in enumerate(steps)
    ]
    if preempt:
        lines.append(
            {
                "event": "preempt",
                "run_id": run,
                "attempt": attempt,
                "rank": 0,
                "time": t0 + len(steps) + 1,
                "step": steps[-1],
                "signal": "SIGTERM",
                "save_ms": 41.2,
                "grace_left_s": 29.96,
                "exit": 75,
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(rec) + "\n" for rec in lines) + '{"event": "step", "cut by a ki')


@pytest.fixture
def drill_store(tmp_path):
    """The store of the recorded running drill: the reference done, the replay writing step 30, the trial
    resumed twice (preempted at 15 and committed 20 before its pod was deleted at 27), now at step 23."""
    bucket = f"file://{tmp_path}/bucket"
    root = tmp_path / "bucket" / "drills" / NAME
    run = "tiny-0123456789ab"
    _commit(root, "reference", run, 10, 20, 30)
    _commit(root, "replay", run, 10, 20, incomplete=(30,))
    _commit(root, "trial", run, 15, 20)
    ev = root / "evidence" / "trial"
    _records(ev / f"{NAME}-trial-1170470342.jsonl", 1, range(1, 16), 1000.0, preempt=True)
    _records(ev / f"{NAME}-trial-1103359866.jsonl", 2, range(16, 28), 2000.0)
    _records(ev / f"{NAME}-trial-1086582247.jsonl", 3, range(21, 24), 3000.0)
    return bucket


def _served(bucket: str) -> dict:
    wf = fixture("running.json")
    for p in wf["spec"]["arguments"]["parameters"]:
        if p["name"] == "bucket":
            p["value"] = bucket
    return wf


def test_status_shows_each_trial_attempt_beside_the_checkpoint_store(argo, drill_store, capsys):
    argo.routes[("GET", f"/api/v1/workflows/baton/{NAME}")] = (200, _served(drill_store))
    assert eq.main(["status", NAME]) == 0
    assert [(r["method"], r["path"], r["authorization"]) for r in argo.requests] == [
        ("GET", f"/api/v1/workflows/baton/{NAME}", TOKEN)
    ]
    out = capsys.readouterr().out
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert lines[0] == f"workflow {NAME} Running"
    assert lines[1] == f"http://{argo.host}/workflows/baton/{NAME}"
    expected = [
        "reference Succeeded exit 0 (98 s)",
        "reference-replay Running",
        "trial Running 3 attempts",
        "trial(0) Failed exit 75 Error (exit code 75) (52 s)",
        "trial(1) Error no exit code pod deleted (40 s)",
        "trial(2) Running",
        "evict Running",
        "verify not started",
        "compare not started",
        f"store {drill_store}/drills/{NAME}",
        "reference newest committed step 30 (run tiny-0123456789ab)",
        "replay newest committed step 20 (run tiny-0123456789ab)",  # step 30 has no _COMMIT yet
        "trial newest committed step 20 (run tiny-0123456789ab)",
        "trial evidence: last step record 23 (attempt 3), newest committed 20: gap 3 steps",
        "preempt at step 15: save 41.2 ms, grace left 29.96 s, exit 75",
    ]
    assert lines[2:] == ["nodes"] + expected[:9] + expected[9:], out


NAME2 = "baton-equivalence-q4n2d"  # the nodes=2 drill of running-nodes2.json


def _served2(bucket: str, drop: str | None = None) -> dict:
    """running-nodes2.json (built by hand from running.json's recording, with Argo v4.1.2's naming for a
    withSequence task: a TaskGroup node `trial` whose children are the items' Retry nodes `trial(0:0)`,
    `trial(1:1)`, each with its attempts `trial(0:0)(0)`, ...; workflow/controller/dag.go), served with
    `bucket`; `drop`: an item node that Argo has not created yet."""
    wf = fixture("running-nodes2.json")
    for p in wf["spec"]["arguments"]["parameters"]:
        if p["name"] == "bucket":
            p["value"] = bucket
    if drop is not None:
        nodes = wf["status"]["nodes"]
        (gone,) = [k for k, n in nodes.items() if n["displayName"] == drop]
        for k in [gone, *nodes[gone].get("children", [])]:
            del nodes[k]
        for n in nodes.values():
            if gone in n.get("children", []):
                n["children"].remove(gone)
    return wf


def test_status_at_two_nodes_lists_each_items_attempts(argo, tmp_path, capsys):
    """At nodes > 1 each role is a task group: status lists every item (node) of it with its own attempts,
    as it lists a plain task's attempts. The control: an item Argo has not created yet is `not started`,
    with no attempts, and the other item is listed as before: the lines come from the nodes, not the names."""
    (tmp_path / "bucket").mkdir()
    bucket = f"file://{tmp_path}/bucket"
    argo.routes[("GET", f"/api/v1/workflows/baton/{NAME2}")] = (200, _served2(bucket))
    assert eq.main(["status", NAME2]) == 0
    lines = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    expected = [
        "nodes",
        "reference Succeeded 2 nodes",
        "reference(0:0) Succeeded 1 attempt",
        "reference(0:0)(0) Succeeded exit 0 (104 s)",
        "reference(1:1) Succeeded 1 attempt",
        "reference(1:1)(0) Succeeded exit 0 (104 s)",
        "reference-replay Running 2 nodes",
        "reference-replay(0:0) Running 1 attempt",
        "reference-replay(0:0)(0) Running",
        "reference-replay(1:1) Running 1 attempt",
        "reference-replay(1:1)(0) Running",
        "trial Running 2 nodes",
        "trial(0:0) Running 2 attempts",
        "trial(0:0)(0) Failed exit 75 Error (exit code 75) (55 s)",
        "trial(0:0)(1) Running",
        "trial(1:1) Running 2 attempts",
        "trial(1:1)(0) Error no exit code pod deleted (41 s)",
        "trial(1:1)(1) Running",
        "evict Running",
        "verify not started",
        "compare not started",
        "publish not started",
    ]
    assert lines[2 : 2 + len(expected)] == expected, lines

    argo.routes[("GET", f"/api/v1/workflows/baton/{NAME2}")] = (200, _served2(bucket, drop="trial(1:1)"))
    assert eq.main(["status", NAME2]) == 0
    lines = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    at = lines.index("trial Running 2 nodes")
    assert lines[at : at + 5] == [
        "trial Running 2 nodes",
        "trial(0:0) Running 2 attempts",
        "trial(0:0)(0) Failed exit 75 Error (exit code 75) (55 s)",
        "trial(0:0)(1) Running",
        "trial(1:1) not started",
    ], lines
    assert not any(line.startswith("trial(1:1)(") for line in lines)


def test_status_with_nothing_committed_counts_the_gap_from_zero(argo, drill_store, tmp_path, capsys):
    shutil.rmtree(tmp_path / "bucket" / "drills" / NAME / "trial")
    argo.routes[("GET", f"/api/v1/workflows/baton/{NAME}")] = (200, _served(drill_store))
    assert eq.main(["status", NAME]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "trial newest committed step none" in out
    assert "last step record 23 (attempt 3), newest committed none: gap 23 steps" in out


def test_status_reports_an_unreadable_store_in_one_line_and_exits_1(argo, capsys):
    argo.routes[("GET", f"/api/v1/workflows/baton/{NAME}")] = (200, _served("nosuchscheme://bucket"))
    assert eq.main(["status", NAME]) == 1
    out = capsys.readouterr().out
    assert "trial(0)" in out  # the nodes are still shown
    assert re.search(r"error: cannot read nosuchscheme://bucket/drills/" + NAME, out), out
    assert "Traceback" not in out


@pytest.mark.parametrize("bucket", ["missing", "empty"])
def test_status_says_when_a_local_bucket_is_not_a_folder_here(argo, tmp_path, capsys, bucket):
    # A local bucket is a folder on the nodes' host: where it is missing, "nothing committed" would be wrong.
    # The control: the same drill on a bucket folder that exists but holds nothing reports "none", exit 0.
    if bucket == "empty":
        (tmp_path / bucket).mkdir()
    argo.routes[("GET", f"/api/v1/workflows/baton/{NAME}")] = (200, _served(f"file://{tmp_path / bucket}"))
    code = eq.main(["status", NAME])
    out = " ".join(capsys.readouterr().out.split())
    assert "trial(0)" in out  # the nodes are shown either way
    if bucket == "missing":
        assert code == 1
        assert f"error: the bucket file://{tmp_path / bucket} is not a folder on this host" in out, out
        assert "newest committed step" not in out
    else:
        assert code == 0
        assert "trial newest committed step none" in out, out


def test_status_of_an_unknown_workflow_is_a_clear_error(argo):
    msg = error_of(["status", "baton-equivalence-nope"])
    assert "get workflow at http://" in msg and "HTTP 404" in msg
    assert argo.requests[0]["path"] == "/api/v1/workflows/baton/baton-equivalence-nope"


def test_status_checks_its_settings_and_the_name_before_any_request(argo, monkeypatch):
    assert "is not a workflow name" in error_of(["status", "Bad_Name"])
    monkeypatch.setenv("ARGO_TOKEN", "no-prefix")
    assert "ARGO_TOKEN must be" in error_of(["status", NAME])
    assert argo.requests == []


def test_the_recorded_responses_are_argo_workflows():
    bad = dict(fixture("created.json"), apiVersion="argoproj.io/v1alpha1", kind="Workflow")
    bad["spec"] = dict(bad["spec"], entrypoynt="drill")
    with pytest.raises(jsonschema.ValidationError):  # the check used throughout this file can fail
        validate(bad)
    for name in ("created.json", "running.json", "running-nodes2.json"):
        wf = dict(fixture(name), apiVersion="argoproj.io/v1alpha1", kind="Workflow")
        validate(wf)
    nodes = fixture("running.json")["status"]["nodes"]
    retry = next(n for n in nodes.values() if n["type"] == "Retry")
    assert [nodes[c]["displayName"] for c in retry["children"]] == ["trial(0)", "trial(1)", "trial(2)"]
    nodes = fixture("running-nodes2.json")["status"]["nodes"]
    group = next(n for n in nodes.values() if n["type"] == "TaskGroup" and n["displayName"] == "trial")
    assert [nodes[c]["displayName"] for c in group["children"]] == ["trial(0:0)", "trial(1:1)"]
    assert [nodes[c]["displayName"] for c in nodes[group["children"][1]]["children"]] == [
        "trial(1:1)(0)",
        "trial(1:1)(1)",
    ]
    assert all(n["type"] == "Retry" for n in (nodes[c] for c in group["children"]))


# ---- kustomize -----------------------------------------------------------------------------------------

needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (kubectl kustomize)")


def kustomize(folder: Path) -> list[dict]:
    """`kubectl kustomize DIR` with no flags (what `kubectl apply -k` can do: it has no --load-restrictor),
    every document it builds validated: Argo's objects against the vendored CRDs, the rest against
    Kubernetes' own schemas (strict)."""
    import kubernetes_validate

    p = subprocess.run([KUBECTL, "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    docs = [d for d in yaml.safe_load_all(p.stdout) if d]
    for d in docs:
        if d["apiVersion"].startswith("argoproj.io/"):
            validate(d)
        elif d["apiVersion"].startswith("kueue.x-k8s.io/"):
            validate_kueue(d)  # Kueue v0.19.2's CRDs, vendored (tests/kueue/), strictly
        else:
            kubernetes_validate.validate(d, "1.32", strict=True)
    return docs


def _one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, [d["kind"] for d in docs]
    return found[0]


def _env(template: dict) -> dict[str, dict]:
    return {e["name"]: e for e in template["container"].get("env", [])}


@needs_kubectl
def test_base_is_the_generated_cron_workflow_and_the_rbac_in_namespace_baton():
    docs = kustomize(REPO / "templates" / "base")
    assert sorted(d["kind"] for d in docs) == sorted(
        ["CronWorkflow"] + ["Role", "RoleBinding", "ServiceAccount"] * 2
    )
    assert {d["metadata"]["namespace"] for d in docs} == {"baton"}
    cron = _one(docs, "CronWorkflow")
    validate(cron)
    generated = eq.rendered()[1]
    assert cron["spec"] == generated["spec"]
    assert cron["metadata"]["name"] == generated["metadata"]["name"]


@pytest.mark.parametrize("overlay", ["kind", "gke"])
def test_overlays_use_the_base_beside_them(overlay):
    base = yaml.safe_load((REPO / "templates" / "base" / "kustomization.yaml").read_text())
    over = yaml.safe_load((OVERLAYS / overlay / "kustomization.yaml").read_text())
    assert (
        over["resources"][0] == "../../base"
    )  # a base beside the overlays: no cycle, no load-restrictor flag
    assert not [r for r in over["resources"][1:] if r.startswith("..")], over["resources"]
    assert over["namespace"] == base["namespace"]


@needs_kubectl
@pytest.mark.parametrize("overlay", ["kind", "gke"])
def test_overlays_carry_the_submitter_rbac_and_the_artifact_repository_the_workflow_names(overlay):
    docs = kustomize(overlays() / overlay)
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {
        ("ServiceAccount", "baton-submitter"),
        ("Role", "baton-submitter"),
        ("RoleBinding", "baton-submitter"),
    } <= names
    cron = _one(docs, "CronWorkflow")
    ref = cron["spec"]["workflowSpec"]["artifactRepositoryRef"]
    cm = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == ref["configMap"]]
    assert len(cm) == 1, names
    repo = yaml.safe_load(cm[0]["data"][ref["key"]])
    store = {"kind": "s3", "gke": "gcs"}[overlay]
    assert set(repo) == {"archiveLogs", store}
    params = params_of({"spec": cron["spec"]["workflowSpec"]})
    # The artifacts land in the drill's own bucket.
    assert params["bucket"] == f"{ {'s3': 's3', 'gcs': 'gs'}[store] }://{repo[store]['bucket']}"


@needs_kubectl
def test_kind_overlay_points_every_step_at_the_in_cluster_minio():
    docs = kustomize(overlays() / "kind")
    cron = _one(docs, "CronWorkflow")
    validate(cron)
    params = params_of({"spec": cron["spec"]["workflowSpec"]})
    minio = (REPO / "infra" / "kind" / "minio.yaml").read_text()
    made = re.search(r"mc mb --ignore-existing local/([a-z0-9.-]+)", minio)
    assert made, "infra/kind/minio.yaml no longer makes a bucket the way this test reads it"
    assert params["bucket"] == f"s3://{made.group(1)}"
    assert params["image"] == "baton:e2e-cpu"
    base = templates_of(eq.rendered()[1])
    containers = {n: t for n, t in templates_of(cron).items() if "container" in t}
    assert set(containers) == {"train", "trial", "evict", "verify", "compare"}
    for name, t in containers.items():
        env = _env(t)
        assert env["BATON_S3_ENDPOINT"]["value"] == "http://minio.baton.svc:9000", name
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert env[key]["valueFrom"]["secretKeyRef"] == {"name": "baton-minio", "key": key}, name
        for original in base[name]["container"].get("env", []):  # only added, nothing lost
            assert env[original["name"]] == original, (name, original["name"])
        assert "nodeSelector" not in t and "tolerations" not in t


@needs_kubectl
def test_gke_overlay_uses_gcs_workload_identity_and_the_spot_gpu_pool():
    docs = kustomize(overlays() / "gke")
    cron = _one(docs, "CronWorkflow")
    validate(cron)
    params = params_of({"spec": cron["spec"]["workflowSpec"]})
    assert params["bucket"].startswith("gs://") and params["grace"] == "15"
    sa = _one(docs, "ServiceAccount", "baton-drill")
    assert re.fullmatch(
        r"baton-drill@[a-zA-Z0-9_-]+\.iam\.gserviceaccount\.com",
        sa["metadata"]["annotations"]["iam.gke.io/gcp-service-account"],
    )
    for name, t in templates_of(cron).items():
        if name in ("train", "trial"):
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in t["tolerations"]
            patch = json.loads(t["podSpecPatch"].replace("{{workflow.parameters.grace}}", "15"))
            assert patch["terminationGracePeriodSeconds"] == 15
            assert patch["containers"] == [
                {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "{{workflow.parameters.ranks}}"}}}
            ]
            if name == "trial":  # always on Spot: the drill is about preemption
                assert t["nodeSelector"] == {"baton.dev/pool": "gpu-spot"} and "nodeSelector" not in patch
            else:  # the baseline's pool follows baseline_pool: gpu-spot (default) or gpu-on-demand
                assert "nodeSelector" not in t
                assert patch["nodeSelector"] == {
                    "baton.dev/pool": "gpu-{{workflow.parameters.baseline_pool}}"
                }
                assert params["baseline_pool"] == "spot"
        else:
            assert "nodeSelector" not in t and "tolerations" not in t, name


@needs_kubectl
def test_submit_from_a_kustomized_overlay_submits_its_workflow_spec(argo, tmp_path):
    docs = kustomize(overlays() / "kind")
    path = tmp_path / "kind.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    argo.routes[("POST", CREATE)] = (200, fixture("created.json"))
    assert eq.main(["submit", "--from-file", str(path), "-p", "evictions=4"]) == 0
    wf = json.loads(argo.requests[0]["body"])["workflow"]
    validate(wf)
    cron = _one(docs, "CronWorkflow")
    assert wf["kind"] == "Workflow" and wf["metadata"]["generateName"] == "baton-equivalence-nightly-"
    expected = copy.deepcopy(cron["spec"]["workflowSpec"])
    for p in expected["arguments"]["parameters"]:
        p["value"] = {"evictions": "4", "retry_limit": "9"}.get(p["name"], p["value"])
    # The deadline follows the drill's size: one eviction more is one attempt more.
    from workflows.params import drill_deadline_s, values_of

    expected["activeDeadlineSeconds"] = drill_deadline_s(
        values_of({p["name"]: p["value"] for p in expected["arguments"]["parameters"]})
    )
    assert expected["activeDeadlineSeconds"] > cron["spec"]["workflowSpec"]["activeDeadlineSeconds"]
    assert wf["spec"] == expected


def test_submit_refuses_a_file_for_another_namespace(argo, tmp_path):
    wf = eq.rendered()[0]
    wf["metadata"]["namespace"] = "default"
    path = tmp_path / "wf.yaml"
    path.write_text(yaml.safe_dump(wf))
    assert "namespace 'default'" in error_of(["submit", "--from-file", str(path)])
    assert argo.requests == []


def _argo_metric_scope(wf: dict, template: dict, attempt_without_outputs: bool) -> dict[str, str]:
    """What Argo binds when it evaluates a template's metrics on a node (steps.go, prepareMetricScope and
    prepareDefaultMetricScope, v4.1.2): the workflow's global parameters, `status`, `duration`, the
    node's inputs, and its outputs only where the node has them. `retries` only on a node with children
    (a retry parent, never an attempt). An emulation: the real thing is the controller."""
    spec = wf["spec"].get("workflowSpec", wf["spec"])
    scope = {
        "status": "Failed",
        "duration": "1.0",
        "workflow.name": "wf",
        "workflow.namespace": "baton",
        "workflow.status": "Running",
        "workflow.duration": "1.0",
    }
    scope |= {
        f"workflow.parameters.{p['name']}": str(p.get("value")) for p in spec["arguments"]["parameters"]
    }
    scope |= {f"inputs.parameters.{p['name']}": "7" for p in template.get("inputs", {}).get("parameters", [])}
    if not attempt_without_outputs:
        scope |= {
            f"outputs.parameters.{p['name']}": "7" for p in template.get("outputs", {}).get("parameters", [])
        }
    return scope


@pytest.mark.parametrize("index", [0, 1], ids=["Workflow", "CronWorkflow"])
def test_every_metric_resolves_on_an_attempt_that_left_no_outputs(index):
    """Argo substitutes the whole metric, `when` included, with unresolved variables an error (a MetricsError
    condition), on every attempt node. Rendered here against a node with no outputs, as a deleted pod or a
    lost VM leaves it: nothing may stay unresolved. Control: compare's old metrics (its output parameters)
    do not resolve there."""
    wf = eq.rendered()[index]
    ts = templates_of(wf)
    names = {n: [m["name"] for m in t.get("metrics", {}).get("prometheus", [])] for n, t in ts.items()}
    assert names["drill"] == ["baton_drill_passed", "baton_drill_passed", "baton_drill_seconds"]
    assert names["publish"] == [f"baton_drill_{n}" for n in eq.COMPARE_METRICS]
    assert not names["trial"] and not names["train"] and not names["compare"]
    helps: dict[str, set[tuple[str, str]]] = {}
    for tname, t in ts.items():
        for m in t.get("metrics", {}).get("prometheus", []):
            assert re.fullmatch(r"[a-z_][a-z0-9_]*", m["name"]) and m["help"]
            assert set(m) <= {"name", "help", "gauge", "when"}, (
                m
            )  # gauges only: re-evaluation cannot double count
            helps.setdefault(m["name"], set()).add((m["help"], "gauge"))
            scope = _argo_metric_scope(wf, t, attempt_without_outputs=True)
            unresolved = {v for v in re.findall(r"\{\{\s*([^}\s]+)\s*\}\}", json.dumps(m)) if v not in scope}
            assert not unresolved, (tname, unresolved)
    assert all(len(h) == 1 for h in helps.values()), helps  # one help and type per name, wherever it appears
    # The control: a gauge over compare's own outputs would not resolve on its attempt without outputs.
    old = {"name": "baton_drill_max_save_ms", "gauge": {"value": "{{outputs.parameters.max_save_ms}}"}}
    scope = _argo_metric_scope(wf, ts["compare"], attempt_without_outputs=True)
    assert (
        "outputs.parameters.max_save_ms" not in scope
        and "{{outputs.parameters.max_save_ms}}" in json.dumps(old)
    )
    # publish gets compare's numbers as its arguments; compare's outputs default to -1 where a file is missing.
    dag = {t["name"]: t for t in ts["drill"]["dag"]["tasks"]}
    assert dag["publish"]["dependencies"] == ["compare"]
    assert {p["name"]: p["value"] for p in dag["publish"]["arguments"]["parameters"]} == {
        n: "{{tasks.compare.outputs.parameters." + n + "}}" for n in eq.COMPARE_METRICS
    }
    assert all(p["valueFrom"]["default"] == "-1" for p in ts["compare"]["outputs"]["parameters"])
    passed = ts["drill"]["metrics"]["prometheus"][:2]
    assert [(m["gauge"]["value"], m["when"]) for m in passed] == [
        ("1", "{{status}} == Succeeded"),
        ("0", "{{status}} != Succeeded"),
    ]


def test_report_artifacts_are_not_archived_so_the_ui_shows_them():
    arts = templates_of(eq.rendered()[0])["compare"]["outputs"]["artifacts"]
    assert [a["archive"] for a in arts] == [{"none": {}}] * len(eq.REPORT_FILES)


# ---- no placeholder reaches a cluster -----------------------------------------------------------------

PLACEHOLDERS = ("PROJECT_ID", "REGION-docker", "TAG-cuda", "PROJECT_ID-baton-drills")


@needs_kubectl
@pytest.mark.parametrize("overlay", ["gke", "gke-kueue"])
def test_the_committed_gke_overlays_do_not_build_without_make_gke_ups_values(overlay):
    p = subprocess.run(
        [KUBECTL, "kustomize", str(OVERLAYS / overlay)], capture_output=True, text=True, timeout=60
    )
    if (OVERLAYS / "gke" / cluster_overlay().FOLDER).exists():
        pytest.skip("this checkout has make gke-up's generated values (a developer's cluster)")
    assert p.returncode != 0 and "generated-by-make-gke-up" in p.stderr, p.stderr


@needs_kubectl
@pytest.mark.parametrize("overlay", ["gke", "gke-kueue"])
def test_generated_values_land_where_workload_identity_the_artifacts_and_the_nightly_drill_read_them(overlay):
    import json as _json

    tf = {k: v["value"] for k, v in _json.loads(TERRAFORM_OUTPUT.read_text()).items()}
    docs = kustomize(overlays() / overlay)
    text = yaml.safe_dump_all(docs)
    assert not [p for p in PLACEHOLDERS if p in text], [p for p in PLACEHOLDERS if p in text]
    sa = _one(docs, "ServiceAccount", "baton-drill")
    assert sa["metadata"]["annotations"]["iam.gke.io/gcp-service-account"] == tf["gsa_email"]
    cm = _one(docs, "ConfigMap", "artifact-repositories")
    assert yaml.safe_load(cm["data"]["default-v1"])["gcs"]["bucket"] == tf["bucket"]
    cron = _one(docs, "CronWorkflow")
    params = params_of({"spec": cron["spec"]["workflowSpec"]})
    assert (params["bucket"], params["image"]) == (tf["bucket_url"], CLUSTER_IMAGE)
    # Idempotent: generating again writes the same files.
    gen, folder = cluster_overlay(), overlays() / "gke" / cluster_overlay().FOLDER
    before = {p.name: p.read_text() for p in folder.iterdir()}
    gen.write(folder, gen.outputs(TERRAFORM_OUTPUT), CLUSTER_IMAGE)
    assert {p.name: p.read_text() for p in folder.iterdir()} == before


def test_the_generator_refuses_terraform_outputs_it_cannot_use(tmp_path):
    gen = cluster_overlay()
    partial = tmp_path / "tf.json"
    partial.write_text('{"bucket": {"value": "b"}}')
    with pytest.raises(SystemExit, match="gsa_email"):
        gen.outputs(partial)


def test_status_shows_hf_checkpoint_roots_beside_dcp_ones(argo, drill_store, tmp_path, capsys):
    """A drill of an HF Trainer script (-p trainer=hf) commits checkpoint-N/ folders: status lists them
    through the same checkpoint package as baton's own (trainer.checkpoint.open_root)."""
    trial = tmp_path / "bucket" / "drills" / NAME / "trial"
    shutil.rmtree(trial)
    for step in (5, 10, 12):
        (trial / f"checkpoint-{step}").mkdir(parents=True)
        if step != 12:  # 12 has no _COMMIT: a save cut short
            (trial / f"checkpoint-{step}" / "_COMMIT").write_text('{"files": {}}')
    argo.routes[("GET", f"/api/v1/workflows/baton/{NAME}")] = (200, _served(drill_store))
    assert eq.main(["status", NAME]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "trial newest committed step 10 (checkpoint-N)" in out
    assert "reference newest committed step 30 (run tiny-0123456789ab)" in out
    assert "newest committed 10: gap 13 steps" in out
