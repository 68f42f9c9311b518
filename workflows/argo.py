"""The drill on a cluster: submit it to an Argo Server, and show a drill's nodes beside its checkpoint store.

    python workflows/equivalence.py submit [-p name=value ...] [--from-file FILE|-] [server options]
    python workflows/equivalence.py status NAME [server options]

Both speak the Argo Server's REST API through Hera's `WorkflowsService` (POST /api/v1/workflows/{ns},
GET /api/v1/workflows/{ns}/{name}) and read the Argo CLI's environment, each setting with a flag too:

    ARGO_SERVER                host:port of the Argo Server, no scheme (--argo-server)
    ARGO_TOKEN                 the whole Authorization value, "Bearer <token>" (--token); unset: none sent
    ARGO_NAMESPACE             namespace of the workflow (--namespace); default baton, the drill's RBAC
    ARGO_SECURE                true (default): https; false: plain http (--secure / --no-secure)
    ARGO_INSECURE_SKIP_VERIFY  true: do not verify the server's certificate (--insecure-skip-verify)
    ARGO_HTTP1                 accepted as the CLI has it (--http1); this client always speaks HTTP/1.1
    ARGO_BASE_HREF             path prefix when the server sits behind an ingress path (--argo-base-href)

Every setting, and every -p parameter, is checked before a request is sent. A refused request or an
unreachable server ends in one line naming the server URL, and exit status 1.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import requests
import yaml

from steps.lib.contract import ROLES, drill_root, evidence_root
from trainer.untrusted import printable
from workflows.params import (
    PARAMETERS,
    parse_params,
    resolve_params,
    set_deadline,
    set_queue_label,
    values_of,
)

DEFAULT_NAMESPACE = (
    "baton"  # the namespace of templates/base/rbac.yaml: the drill's ServiceAccount lives there
)
TIMEOUT_S = 30.0
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}  # Go's strconv.ParseBool, which the Argo CLI uses
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
_HOST = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?):(\d{1,5})$")
_DNS_LABEL = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$")
_WF_NAME = re.compile(r"^[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?$")
_FLAGS = {
    "ARGO_SERVER": "--argo-server",
    "ARGO_TOKEN": "--token",
    "ARGO_NAMESPACE": "--namespace",
    "ARGO_SECURE": "--secure",
    "ARGO_INSECURE_SKIP_VERIFY": "--insecure-skip-verify",
    "ARGO_HTTP1": "--http1",
    "ARGO_BASE_HREF": "--argo-base-href",
}


class ArgoError(SystemExit):
    """A one-line `error: ...`; exit status 1 (argparse prints nothing else, there is no traceback)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"error: {message}")


# ---- settings -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    host: str  # host:port
    token: str | None
    namespace: str
    secure: bool
    verify: bool
    http1: bool
    base_href: str  # "" or "/path", no trailing slash

    @property
    def url(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.host}{self.base_href}"

    def ui_url(self, name: str) -> str:
        return f"{self.url}/workflows/{self.namespace}/{name}"


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Argo Server (each defaults to the Argo CLI's environment variable)")
    g.add_argument("--argo-server", metavar="HOST:PORT", help="ARGO_SERVER, e.g. localhost:2746 (no scheme)")
    g.add_argument("--token", help="ARGO_TOKEN: the whole Authorization value, 'Bearer <token>'")
    g.add_argument("-n", "--namespace", help=f"ARGO_NAMESPACE (default {DEFAULT_NAMESPACE})")
    g.add_argument(
        "--secure",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ARGO_SECURE: https (default) or, with --no-secure, plain http",
    )
    g.add_argument(
        "-k",
        "--insecure-skip-verify",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ARGO_INSECURE_SKIP_VERIFY: do not verify the server's TLS certificate",
    )
    g.add_argument(
        "--http1",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ARGO_HTTP1: accepted for the CLI's convention; this client always uses HTTP/1.1",
    )
    g.add_argument(
        "--argo-base-href", metavar="PATH", help="ARGO_BASE_HREF: the server's path behind an ingress"
    )


def _flag_or_env(value: Any, env: Mapping[str, str], name: str) -> tuple[Any, str]:
    if value is not None:
        return value, _FLAGS[name]
    return env.get(name), name


def _bool(value: Any, source: str, default: bool) -> bool:
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ArgoError(f"{source} must be true or false, got {value!r}")


def settings(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Server:
    """The server settings from the flags, else the environment; every problem is reported here."""
    env = os.environ if env is None else env
    host, src = _flag_or_env(getattr(args, "argo_server", None), env, "ARGO_SERVER")
    if not host:
        raise ArgoError(
            "no Argo Server: set ARGO_SERVER=host:port (e.g. localhost:2746, after "
            "'kubectl -n argo port-forward svc/argo-server 2746:2746') or pass --argo-server"
        )
    host = host.strip()
    if "://" in host:
        raise ArgoError(
            f"{src}={host!r}: give host:port without a scheme; "
            "https or http is chosen by ARGO_SECURE / --secure / --no-secure"
        )
    m = _HOST.match(host)
    if not m or not 0 < int(m.group(1)) < 65536:
        raise ArgoError(f"{src}={host!r} is not host:port (e.g. localhost:2746)")

    token, tsrc = _flag_or_env(getattr(args, "token", None), env, "ARGO_TOKEN")
    if token is not None and token.strip() == "":
        token = None
    if token is not None:
        token = token.strip()
        scheme, _, credential = token.partition(" ")
        if scheme not in ("Bearer", "Basic") or not credential.strip() or len(token.split()) != 2:
            raise ArgoError(
                f"{tsrc} must be the whole Authorization value, 'Bearer <token>' "
                "(as 'argo auth token' prints it, or \"Bearer $(kubectl create token ...)\")"
            )

    ns, nsrc = _flag_or_env(getattr(args, "namespace", None), env, "ARGO_NAMESPACE")
    ns = (ns or DEFAULT_NAMESPACE).strip()
    if not _DNS_LABEL.match(ns):
        raise ArgoError(f"{nsrc}={ns!r} is not a Kubernetes namespace name")

    secure = _bool(*_flag_or_env(getattr(args, "secure", None), env, "ARGO_SECURE"), default=True)
    skip = _bool(
        *_flag_or_env(getattr(args, "insecure_skip_verify", None), env, "ARGO_INSECURE_SKIP_VERIFY"),
        default=False,
    )
    http1 = _bool(*_flag_or_env(getattr(args, "http1", None), env, "ARGO_HTTP1"), default=False)
    href, hsrc = _flag_or_env(getattr(args, "argo_base_href", None), env, "ARGO_BASE_HREF")
    href = (href or "").strip().strip("/")
    if href and not re.fullmatch(r"[A-Za-z0-9._~/-]+", href):
        raise ArgoError(f"{hsrc}={href!r} is not a URL path")
    return Server(
        host=host,
        token=token,
        namespace=ns,
        secure=secure,
        verify=not skip,
        http1=http1,
        base_href=f"/{href}" if href else "",
    )


# ---- the service -----------------------------------------------------------------------------------------


class _Session(requests.Session):
    """A requests session with a timeout on every call, that keeps the last response for error messages."""

    def __init__(self) -> None:
        super().__init__()
        self.last: requests.Response | None = None

    def request(self, method, url, *args, **kwargs):  # type: ignore[override]
        kwargs.setdefault("timeout", TIMEOUT_S)
        self.last = None
        self.last = super().request(method, url, *args, **kwargs)
        return self.last


def _service(server: Server):
    from hera.workflows import WorkflowsService

    if not server.verify:
        import urllib3

        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # asked for explicitly
    return WorkflowsService(
        host=server.url + "/",
        verify_ssl=server.verify,
        token=server.token,
        namespace=server.namespace,
        session=_Session(),
    )


def _http_error(server: Server, what: str, r: requests.Response) -> ArgoError:
    try:
        body = r.json()
        detail = body.get("message") if isinstance(body, dict) else None
    except ValueError:
        detail = None
    detail = re.sub(r"<[^>]*>", " ", str(detail or r.text or r.reason or ""))  # an HTML error page
    detail = " ".join(detail.split())[:300]
    verb = what.split()[0]
    hint = {
        401: "; is ARGO_TOKEN current and meant for this server?",
        403: f"; may the token's account {verb} workflows in namespace {server.namespace}?",
        404: f"; is the namespace ({server.namespace}) right"
        + (", and the name?" if verb == "get" else ", and ARGO_BASE_HREF?"),
    }.get(r.status_code, "")
    return ArgoError(
        f"{what} at {server.url}: HTTP {r.status_code} {r.reason or ''}".rstrip()
        + (f": {detail}" if detail else "")
        + hint
    )


def _call(server: Server, svc: Any, what: str, fn) -> Any:
    """`fn()` with every failure turned into one clear line naming the server."""
    try:
        with warnings.catch_warnings():  # Hera 7.1 calls pydantic's deprecated .json()
            warnings.simplefilter("ignore", DeprecationWarning)
            return fn()
    except requests.exceptions.SSLError as e:
        raise ArgoError(
            f"{what} at {server.url}: TLS failed ({_reason(e)}); for a self-signed certificate set "
            "ARGO_INSECURE_SKIP_VERIFY=true, for a plain-http server ARGO_SECURE=false"
        ) from None
    except requests.exceptions.Timeout:
        raise ArgoError(f"{what} at {server.url}: no answer within {TIMEOUT_S:.0f} s") from None
    except requests.exceptions.InvalidJSONError as e:
        raise ArgoError(
            f"{what} at {server.url}: the answer is not an Argo workflow ({_reason(e)}); "
            "is ARGO_SERVER the Argo Server?"
        ) from None
    except requests.exceptions.ConnectionError as e:
        raise ArgoError(f"{what}: cannot reach the Argo Server at {server.url} ({_reason(e)})") from None
    except requests.exceptions.RequestException as e:
        raise ArgoError(f"{what} at {server.url}: {_reason(e)}") from None
    except Exception as e:  # Hera's HTTP exceptions, or a body that is not an Argo workflow
        r = svc.session.last
        if r is not None and not r.ok:
            raise _http_error(server, what, r) from None
        raise ArgoError(
            f"{what} at {server.url}: the answer is not an Argo workflow ({type(e).__name__}); "
            "is ARGO_SERVER the Argo Server?"
        ) from None


_REASONS = (
    "Connection refused",
    "Name or service not known",
    "Temporary failure in name resolution",
    "No route to host",
    "Network is unreachable",
    "timed out",
    "certificate verify failed",
    "wrong version number",
    "record layer failure",
    "Connection reset by peer",
    "RemoteDisconnected",
)


def _reason(e: BaseException) -> str:
    text = str(e)
    for phrase in _REASONS:
        if phrase in text:
            return phrase
    return " ".join(text.split())[:200]


# ---- submit ----------------------------------------------------------------------------------------------


def load_workflow(path: str) -> dict[str, Any]:
    """The Workflow in a YAML/JSON file (`-`: stdin), such as `kubectl kustomize templates/overlays/kind`.
    Without a Workflow, a CronWorkflow's workflowSpec becomes one (as `argo submit --from cronwf/NAME`)."""
    try:
        text = sys.stdin.read() if path == "-" else open(path).read()
        docs = [d for d in yaml.safe_load_all(io.StringIO(text)) if isinstance(d, dict)]
    except OSError as e:
        raise ArgoError(f"--from-file {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ArgoError(f"--from-file {path}: not YAML ({' '.join(str(e).split())[:200]})") from None
    for kind in ("Workflow", "CronWorkflow"):
        found = [d for d in docs if d.get("kind") == kind and d.get("apiVersion") == "argoproj.io/v1alpha1"]
        if len(found) > 1:
            raise ArgoError(f"--from-file {path}: {len(found)} {kind}s; keep one")
        if found and kind == "Workflow":
            return found[0]
        if found:
            cron = found[0]
            meta = cron.get("metadata") or {}
            wf_meta: dict[str, Any] = {"generateName": f"{meta.get('name', 'cron')}-"}
            for key in ("namespace", "labels"):
                if meta.get(key):
                    wf_meta[key] = meta[key]
            return {
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Workflow",
                "metadata": wf_meta,
                "spec": (cron.get("spec") or {}).get("workflowSpec") or {},
            }
    raise ArgoError(f"--from-file {path}: no argoproj.io/v1alpha1 Workflow or CronWorkflow in it")


def apply_parameters(wf: dict[str, Any], overrides: dict[str, str]) -> dict[str, str]:
    """Set `overrides` as the values of spec.arguments.parameters, after the same checks as `run`
    (against the workflow's own values); returns every value that was set."""
    params = wf.setdefault("spec", {}).setdefault("arguments", {}).setdefault("parameters", [])
    current = {p.get("name"): p.get("value") for p in params}
    for name in overrides:
        if name not in current:
            raise ArgoError(f"the workflow has no parameter {name!r} in spec.arguments.parameters")
    if "nodes" in overrides and str(current.get("nodes")) != overrides["nodes"]:
        raise ArgoError(
            f"parameter nodes: this workflow was rendered for {current.get('nodes') or 1} node(s), and the "
            "DAG's shape follows it; render it again with -p nodes=N (or submit without --from-file)"
        )
    base = {k: str(v) for k, v in current.items() if v is not None and k in PARAMETERS}
    if "evictions" in overrides and "retry_limit" not in overrides:
        base.pop("retry_limit", None)  # the limit follows the evictions, as in `run`
    values = resolve_params(base | overrides, cluster=True)
    for p in params:
        if p.get("name") in values:
            p["value"] = values[p["name"]]
    if "queue" in current:  # the pods' Kueue label follows the parameter, whatever the file said
        set_queue_label(wf, str(values.get("queue", current["queue"]) or ""))
    if "deadline" in current:  # so does the deadline (an integer in the spec, never a template expression)
        set_deadline(
            wf,
            values_of({k: v for k, v in {**current, **values}.items() if k in PARAMETERS and v is not None}),
        )
    return {k: v for k, v in values.items() if k in current}


def submit(args: argparse.Namespace, default_workflow: Callable[[], dict[str, Any]]) -> int:
    """Submit `--from-file`'s Workflow, or else `default_workflow()` (the caller renders it: this module
    does not import the definition, which imports it)."""
    from hera.workflows import models as m

    server = settings(args)
    overrides = parse_params(args.param)
    from_file = getattr(args, "from_file", None)
    wf = load_workflow(from_file) if from_file else default_workflow()
    file_ns = (wf.get("metadata") or {}).get("namespace")
    if file_ns and file_ns != server.namespace:
        raise ArgoError(
            f"the workflow says namespace {file_ns!r} but the request goes to {server.namespace!r} "
            "(ARGO_NAMESPACE / --namespace)"
        )
    apply_parameters(wf, overrides)
    wf.setdefault("metadata", {})["namespace"] = server.namespace
    try:
        req = m.WorkflowCreateRequest(namespace=server.namespace, workflow=m.Workflow.model_validate(wf))
    except ValueError as e:
        raise ArgoError(
            f"the workflow is not a valid Argo Workflow: {' '.join(str(e).split())[:300]}"
        ) from None
    with _service(server) as svc:
        created = _call(server, svc, "create workflow", lambda: svc.create_workflow(req))
    name = created.metadata.name if created.metadata else None
    if not name:
        raise ArgoError(f"create workflow at {server.url}: the answer has no metadata.name")
    print(name)
    print(server.ui_url(name))
    return 0


# ---- status ----------------------------------------------------------------------------------------------


def status(args: argparse.Namespace) -> int:
    server = settings(args)
    name = args.name
    if not _WF_NAME.match(name):
        raise ArgoError(f"{name!r} is not a workflow name")
    with _service(server) as svc:
        _call(server, svc, "get workflow", lambda: svc.get_workflow(name))
        wf = svc.session.last.json()  # as Argo sent it; Hera's model above checked that it is a workflow
    # What the server and the bucket hold is shown, never obeyed: control characters are printed escaped.
    print(printable("\n".join(workflow_lines(wf, server.ui_url(name)))))
    lines, ok = store_lines(wf)
    print(printable("\n".join(lines)))
    return 0 if ok else 1


def _seconds(node: dict[str, Any]) -> str:
    try:
        start = datetime.fromisoformat(node["startedAt"])
        end = datetime.fromisoformat(node["finishedAt"])
    except (KeyError, TypeError, ValueError):
        return ""
    return f"{(end - start).total_seconds():.0f} s"


def _dag_tasks(wf: dict[str, Any]) -> list[str]:
    spec = wf.get("spec") or {}
    for t in spec.get("templates") or []:
        if t.get("name") == spec.get("entrypoint") and t.get("dag"):
            return [task["name"] for task in t["dag"].get("tasks") or []]
    return []


def workflow_lines(wf: dict[str, Any], ui_url: str) -> list[str]:
    meta, st = wf.get("metadata") or {}, wf.get("status") or {}
    nodes: dict[str, dict[str, Any]] = st.get("nodes") or {}
    name = meta.get("name", "")
    out = [
        f"workflow {name}  {st.get('phase') or 'Pending'}"
        + (f": {st['message']}" if st.get("message") else ""),
        f"  {ui_url}",
    ]
    root = nodes.get(name) or {}
    tasks = {
        n.get("displayName"): n
        for n in nodes.values()
        if n.get("boundaryID") == root.get("id", name) and n.get("type") != "Skipped"
    }
    out.append("nodes")
    for task in _dag_tasks(wf) or sorted(t for t in tasks if t):
        node = tasks.get(task)
        if node is None:
            out.append(f"  {task:<18} not started")
            continue
        if (
            node.get("type") == "TaskGroup"
        ):  # withSequence (nodes > 1): one item per node, each retried on its own
            items = _items(wf, task, node, nodes, tasks)
            out.append(
                f"  {task:<18} {node.get('phase', 'Pending'):<10} {len(items)} node{'s' if len(items) != 1 else ''}"
            )
            for item, item_node in items:
                out += _task_lines(item, item_node, nodes, indent=4)
            continue
        out += _task_lines(task, node, nodes, indent=2)
    return out


_ITEM = re.compile(r"\((\d+):[^()]*\)$")


def _items(
    wf: dict[str, Any],
    task: str,
    group: dict[str, Any],
    nodes: dict[str, dict[str, Any]],
    tasks: dict[str, dict[str, Any]],
) -> list[tuple[str, dict[str, Any] | None]]:
    """A task group's items, `task(0:0)`, `task(1:1)`, ... as Argo names them (its TaskGroup node's children),
    in item order, with those the `nodes` parameter expects but Argo has not created yet (None)."""
    names = {nodes[c].get("displayName", "") for c in group.get("children") or [] if c in nodes}
    count = _param(wf, "nodes")
    if count is not None and str(count).isdigit():
        names |= {f"{task}({i}:{i})" for i in range(int(count))}
    names = {n for n in names if n.startswith(task + "(") and _ITEM.search(n)}
    return [(n, tasks.get(n)) for n in sorted(names, key=lambda n: int(_ITEM.search(n).group(1)))]


def _task_lines(
    task: str, node: dict[str, Any] | None, nodes: dict[str, dict[str, Any]], indent: int
) -> list[str]:
    """A task (or a task group's item): its phase, and under it each attempt when it is retried."""
    pad = " " * indent
    if node is None:
        return [f"{pad}{task:<{20 - indent}} not started"]
    retried = node.get("type") == "Retry"
    attempts = [nodes[c] for c in node.get("children") or [] if c in nodes] if retried else []
    extra = f"{len(attempts)} attempt{'s' if len(attempts) != 1 else ''}" if retried else _node_detail(node)
    out = [f"{pad}{task:<{20 - indent}} {node.get('phase', 'Pending'):<10} {extra}".rstrip()]
    for a in attempts:
        out.append(
            f"{pad}  {a.get('displayName', '?'):<{18 - indent}} {a.get('phase', 'Pending'):<10} "
            f"{_node_detail(a)}".rstrip()
        )
    return out


def _node_detail(node: dict[str, Any]) -> str:
    code = (node.get("outputs") or {}).get("exitCode")
    parts = []
    if code is not None:
        parts.append(f"exit {code}")
    elif node.get("phase") in ("Failed", "Error"):
        parts.append("no exit code")
    if node.get("message"):
        parts.append(node["message"])
    if _seconds(node):
        parts.append(f"({_seconds(node)})")
    return "  ".join(parts)


def _param(wf: dict[str, Any], name: str) -> str | None:
    for p in ((wf.get("spec") or {}).get("arguments") or {}).get("parameters") or []:
        if p.get("name") == name:
            return p.get("value")
    return None


def committed_steps(root: str, role: str) -> dict[str, list[int]]:
    """run -> committed steps, newest first, under `<root>/<role>`, in either checkpoint format (the
    checkpoint package's own listing: an HF root is one run, named "")."""
    from trainer.checkpoint import open_root

    return open_root(f"{root}/{role}").committed()


def store_lines(wf: dict[str, Any]) -> tuple[list[str], bool]:
    """The checkpoint store of a drill beside its nodes: the newest committed step per prefix, and the gap
    between the trial's newest commit and its last step record (what a kill right now would replay)."""
    from steps.lib.evidence import read_evidence
    from trainer.storage import describe, local_path, redact

    name = (wf.get("metadata") or {}).get("name", "")
    bucket, prefix = _param(wf, "bucket"), _param(wf, "prefix")
    if bucket is None or prefix is None:
        return ["store: the workflow has no bucket or prefix parameter"], False
    root = drill_root(bucket, prefix, name)
    out = [f"store {redact(root)}"]
    folder = local_path(bucket)
    if folder is not None and not os.path.isdir(folder):
        # A local bucket is a folder on the nodes' host: missing here, nothing can be said of the drill's state,
        # and "nothing committed" would be a wrong answer.
        out.append(
            f"  error: the bucket {redact(bucket)} is not a folder on this host; run status where it is"
        )
        return out, False
    try:
        newest: dict[str, int | None] = {}
        for role in ROLES:
            runs = committed_steps(root, role)
            steps = sorted((s for v in runs.values() for s in v), reverse=True)
            newest[role] = steps[0] if steps else None
            where = f" (run {', '.join(sorted(runs))})" if any(runs) else (" (checkpoint-N)" if runs else "")
            out.append(f"  {role:<10} newest committed step {steps[0] if steps else 'none'}{where}")
        records = read_evidence(evidence_root(root, "trial"))
    except Exception as e:  # storage errors of any backend: one line, not a traceback
        out.append(f"  error: cannot read {redact(root)}: {describe(e)}")
        return out, False
    step_recs = [r for r in records if r.get("event") == "step" and isinstance(r.get("step"), int)]
    if not step_recs:
        out.append("  trial evidence: no step records yet")
        return out, True
    # The latest step record in time: where the running (or last) attempt is now.
    last = max(enumerate(step_recs), key=lambda ir: (ir[1].get("time") or 0, ir[0]))[1]
    committed = newest["trial"] or 0
    gap = max(last["step"] - committed, 0)
    out.append(
        f"  trial evidence: last step record {last['step']} (attempt {last.get('attempt', '?')}), "
        f"newest committed {newest['trial'] if newest['trial'] is not None else 'none'}: "
        f"gap {gap} step{'s' if gap != 1 else ''}"
    )
    for r in records:
        if r.get("event") == "preempt":
            out.append(
                f"  preempt at step {r.get('step')}: save {r.get('save_ms')} ms, "
                f"grace left {r.get('grace_left_s')} s, exit {r.get('exit')}"
            )
    return out, True
