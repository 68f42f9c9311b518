"""The local runner's half that reads a rendered Argo Workflow: what it supports, the checks that refuse
anything else before a pod starts (``UnsupportedSpec``, naming the field), and the substitution of
parameters into argv, env, paths and the grace. ``workflows/local/runner.py`` runs the plan this builds; its
docstring lists what is supported.
"""

from __future__ import annotations

import random
import re
import string
import uuid
from dataclasses import dataclass, field
from typing import Any

import yaml

import workflows.local.argo_expr as argo_expr
from steps.lib.contract import POD_GROUP_LABEL, QUEUE_LABEL, RELEASE_TEMPLATE

# Fields that the runner accepts and ignores because they have no meaning on one machine.
ACCEPTED_WITHOUT_EFFECT: dict[str, frozenset[str]] = {
    "metadata": frozenset({"labels", "annotations", "namespace"}),
    "spec": frozenset(
        {
            "serviceAccountName",
            "podGC",
            "ttlStrategy",
            "artifactRepositoryRef",
            "workflowMetadata",
            "podMetadata",
            "metrics",
        }
    ),
    "template": frozenset({"metrics", "metadata"}),
    "container": frozenset({"image", "imagePullPolicy", "resources"}),
    "artifact": frozenset({"archive", "s3", "gcs"}),
}
_SUPPORTED: dict[str, frozenset[str]] = {
    "workflow": frozenset({"apiVersion", "kind", "metadata", "spec"}),
    "metadata": frozenset({"name", "generateName"}),
    "spec": frozenset({"entrypoint", "arguments", "templates", "activeDeadlineSeconds", "onExit"}),
    "arguments": frozenset({"parameters"}),
    "wf_param": frozenset({"name", "value", "description", "enum"}),
    "template": frozenset(
        {
            "name",
            "dag",
            "container",
            "suspend",
            "inputs",
            "outputs",
            "retryStrategy",
            "podSpecPatch",
            "activeDeadlineSeconds",
        }
    ),
    "suspend": frozenset({"duration"}),
    "dag": frozenset({"tasks"}),
    "task": frozenset(
        {"name", "template", "dependencies", "depends", "arguments", "continueOn", "withSequence"}
    ),
    "withSequence": frozenset({"count"}),
    "continueOn": frozenset({"failed", "error"}),
    "task_param": frozenset({"name", "value"}),
    "container": frozenset({"command", "args", "env"}),
    "env": frozenset({"name", "value", "valueFrom"}),
    "inputs": frozenset({"parameters"}),
    "input_param": frozenset({"name", "default"}),
    "outputs": frozenset({"artifacts", "parameters"}),
    "output_param": frozenset({"name", "valueFrom"}),
    "valueFrom": frozenset({"path", "default"}),
    "artifact": frozenset({"name", "path"}),
    "retryStrategy": frozenset({"limit", "retryPolicy", "expression"}),
    "podSpecPatch": frozenset({"terminationGracePeriodSeconds"}),
}
POLICY_RETRIES = {
    "Always": {"Failed", "Error"},
    "OnFailure": {"Failed"},
    "OnError": {"Error"},
    "OnTransientError": {"Error"},
}
_REF = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_TASK_OUTPUT = re.compile(r"tasks\.([A-Za-z0-9][A-Za-z0-9_.-]*?)\.outputs\.parameters\.([A-Za-z0-9_-]+)")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # also used as file names
DEFAULT_GRACE_S = 30.0
# Every local pod shares this host's network: its address is loopback.
POD_IP = "127.0.0.1"
FIELD_REFS = ("metadata.name", "status.podIP")


class UnsupportedSpec(ValueError):
    """The spec uses something the local runner does not implement, or is invalid; nothing has run."""


# ----------------------------------------------------------------------------------------------- validation
@dataclass
class _Retry:
    limit: int | None
    policy: str
    expr: argo_expr.Expr | None


POD_NAME_PREFIX_MAX = 253 - 10 - 1  # pod_name.go: maxK8sResourceNameLength - k8sNamingHashLength - 1


@dataclass
class Task:
    name: str
    template: str
    path: str  # of the template, for messages
    tmpl: dict
    deps: list[str]
    inputs: dict[str, str]
    retry: _Retry | None
    deadline_s: float | None
    continue_on: frozenset[str] = frozenset()  # node statuses (Failed, Error) its dependents accept
    late_inputs: dict[str, str] = field(
        default_factory=dict
    )  # inputs naming a dependency's outputs: at start
    group: str = ""  # the DAG task as written: a withSequence item's name is `<group>(<i>:<i>)`, as Argo's
    item: str | None = None  # the withSequence item ({{item}})
    root: bool = False  # the entrypoint itself is this container: Argo's root node, named as the workflow
    kueue_group: bool = False  # its pods are in a Kueue pod group and a queue (labels; no Kueue runs here)

    def __post_init__(self) -> None:
        self.group = self.group or self.name

    @property
    def slug(self) -> str:
        """The name in log file names and artifact folders: `trial-1` for the item `trial(1:1)`."""
        return self.name if self.item is None else f"{self.group}-{self.item}"

    def pod_name(self, workflow: str, attempt: int) -> str:
        """Argo's v2 pod name (workflow/util/pod_name.go, the default): `<workflow>-<template>-<FNV-1a 32 of
        the node's name>`, where an attempt of a retried task is the node `<workflow>.<task>(<attempt>)` and a
        task without a retryStrategy is the node `<workflow>.<task>` itself (a container entrypoint's node is
        the workflow's own). Pinned in a test to names the real controller gave."""
        node = (workflow if self.root else f"{workflow}.{self.name}") + (
            f"({attempt})" if self.retry is not None else ""
        )
        if node == workflow:  # pod_name.go: the root node's pod is named as the workflow
            return workflow
        h = 2166136261
        for b in node.encode():
            h = ((h ^ b) * 16777619) & 0xFFFFFFFF
        return f"{f'{workflow}-{self.template}'[:POD_NAME_PREFIX_MAX]}-{h}"

    @property
    def suspend(self) -> bool:
        """A suspend template of duration 0: a node with no pod, which succeeds as it starts."""
        return "suspend" in self.tmpl


@dataclass
class Plan:
    name: str
    wf_ctx: dict[str, str]
    tasks: dict[str, Task]
    deadline_s: float | None
    pod_labels: dict[str, str] = field(default_factory=dict)  # spec.podMetadata's, under each template's own


def _refuse(path: str, what: str = "") -> UnsupportedSpec:
    return UnsupportedSpec(f"{path}: {what}{' ' if what else ''}not supported by the local runner")


def _check(obj: Any, path: str, kind: str) -> dict:
    if not isinstance(obj, dict):
        raise UnsupportedSpec(f"{path}: expected a mapping, got {type(obj).__name__}")
    allowed = _SUPPORTED[kind] | ACCEPTED_WITHOUT_EFFECT.get(kind, frozenset())
    for key in obj:
        if key not in allowed:
            raise _refuse(f"{path}.{key}" if path else key)
    return obj


def _list(obj: Any, path: str) -> list:
    if obj is None:
        return []
    if not isinstance(obj, list):
        raise UnsupportedSpec(f"{path}: expected a list")
    return obj


def _name(obj: dict, path: str) -> str:
    name = obj.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise UnsupportedSpec(f"{path}.name: missing, or not a name the local runner can use ({name!r})")
    return name


def _scalar(value: Any, path: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise UnsupportedSpec(f"{path}: expected a string, got {value!r}")
    return str(value)


def _seconds(value: Any, path: str, ctx: dict[str, str] | None = None) -> float:
    if isinstance(value, str) and ctx is not None:  # Argo substitutes parameters into IntOrString fields too
        value = _subst(value, ctx, path)
    if isinstance(value, bool) or not (isinstance(value, int) or isinstance(value, str) and value.isdigit()):
        raise UnsupportedSpec(f"{path}: expected a non-negative integer, got {value!r}")
    return float(value)


def _subst(text: Any, ctx: dict[str, str], path: str) -> str:
    if not isinstance(text, str):
        raise UnsupportedSpec(f"{path}: expected a string, got {text!r}")

    def one(m: re.Match) -> str:
        if m.group(1) not in ctx:
            raise UnsupportedSpec(
                f"{path}: cannot resolve {m.group(0)} (the local runner knows: "
                f"{', '.join('{{' + k + '}}' for k in sorted(ctx))})"
            )
        return ctx[m.group(1)]

    return _REF.sub(one, text)  # one pass: substituted values are data, never re-expanded


def resolve_late_inputs(task: Task, outputs: dict[str, dict[str, str]]) -> dict[str, str]:
    """The task's inputs, with references to its dependencies' output parameters substituted from
    `outputs` (task -> {parameter: value}, of each dependency's last attempt)."""
    ctx = {f"tasks.{t}.outputs.parameters.{k}": v for t, ps in outputs.items() for k, v in ps.items()}
    return {
        **task.inputs,
        **{k: _subst(v, ctx, f"{task.path}: input {k}") for k, v in task.late_inputs.items()},
    }


def pod_ctx(plan: Plan, task: Task, pod_name: str, retries: int) -> dict[str, str]:
    ctx = dict(plan.wf_ctx, **{f"inputs.parameters.{k}": v for k, v in task.inputs.items()})
    ctx["pod.name"] = pod_name
    if task.retry is not None:
        ctx["retries"] = str(retries)
    return ctx


def pod_grace(task: Task, ctx: dict[str, str]) -> float:
    raw = task.tmpl.get("podSpecPatch")
    if raw is None:
        return DEFAULT_GRACE_S
    path = f"{task.path}.podSpecPatch"
    try:
        patch = yaml.safe_load(_subst(raw, ctx, path))
    except yaml.YAMLError as exc:
        raise UnsupportedSpec(f"{path}: not JSON or YAML: {exc}") from None
    _check(patch, path, "podSpecPatch")
    value = patch.get("terminationGracePeriodSeconds")
    return DEFAULT_GRACE_S if value is None else _seconds(value, f"{path}.terminationGracePeriodSeconds")


def argv_env(plan: Plan, task: Task, ctx: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    c, path = task.tmpl["container"], f"{task.path}.container"
    argv = [
        _subst(a, ctx, f"{path}.{k}[{i}]")
        for k in ("command", "args")
        for i, a in enumerate(_list(c.get(k), f"{path}.{k}"))
    ]
    env: dict[str, str] = {}
    for i, e in enumerate(_list(c.get("env"), f"{path}.env")):
        epath = f"{path}.env[{i}]"
        _check(e, epath, "env")
        if "valueFrom" in e:
            ref = e["valueFrom"].get("fieldRef") if isinstance(e["valueFrom"], dict) else None
            if (
                e["valueFrom"] != {"fieldRef": ref}
                or not isinstance(ref, dict)
                or ref.get("fieldPath") not in FIELD_REFS
                or ref.keys() - {"fieldPath", "apiVersion"}
            ):
                raise UnsupportedSpec(
                    f"{epath}.valueFrom: only fieldRef.fieldPath metadata.name and "
                    "status.podIP are supported by the local runner"
                )
            env[_name(e, epath)] = ctx["pod.name"] if ref["fieldPath"] == "metadata.name" else POD_IP
        else:
            env[_name(e, epath)] = _subst(e.get("value", ""), ctx, f"{epath}.value")
    return argv, env


def artifact_paths(task: Task, ctx: dict[str, str]) -> dict[str, str]:
    path = f"{task.path}.outputs"
    out: dict[str, str] = {}
    for i, a in enumerate(
        _list(_check(task.tmpl.get("outputs", {}), path, "outputs").get("artifacts"), f"{path}.artifacts")
    ):
        apath = f"{path}.artifacts[{i}]"
        _check(a, apath, "artifact")
        out[_name(a, apath)] = _subst(a.get("path"), ctx, f"{apath}.path")
    return out


def out_params(task: Task, ctx: dict[str, str]) -> dict[str, tuple[str, str | None]]:
    """Output parameters: name -> (file path, default). Read after the attempt, like Argo's executor."""
    path = f"{task.path}.outputs"
    out: dict[str, tuple[str, str | None]] = {}
    for i, prm in enumerate(
        _list(_check(task.tmpl.get("outputs", {}), path, "outputs").get("parameters"), f"{path}.parameters")
    ):
        ppath = f"{path}.parameters[{i}]"
        _check(prm, ppath, "output_param")
        vf = _check(prm.get("valueFrom"), f"{ppath}.valueFrom", "valueFrom")
        if "path" not in vf:
            raise _refuse(f"{ppath}.valueFrom: only valueFrom.path is supported by the local runner")
        default = vf.get("default")
        out[_name(prm, ppath)] = (
            _subst(vf["path"], ctx, f"{ppath}.valueFrom.path"),
            None if default is None else _scalar(default, f"{ppath}.valueFrom.default"),
        )
    return out


def _retry(tmpl: dict, path: str, ctx: dict[str, str] | None) -> _Retry | None:
    """``ctx`` None: check the shape only (a template no task uses)."""
    rs = tmpl.get("retryStrategy")
    if rs is None:
        return None
    path += ".retryStrategy"
    _check(rs, path, "retryStrategy")
    limit = rs.get("limit")
    if limit is not None and (ctx is not None or not isinstance(limit, str) or "{{" not in limit):
        limit = int(_seconds(limit, f"{path}.limit", ctx))
    expr = None
    if rs.get("expression") is not None:
        try:
            expr = argo_expr.parse(rs["expression"])
        except argo_expr.ExprError as exc:
            raise UnsupportedSpec(f"{path}.expression: {exc}; not supported by the local runner") from None
    policy = rs.get("retryPolicy") or ("Always" if expr else "OnFailure")
    if policy not in POLICY_RETRIES:
        raise UnsupportedSpec(f"{path}.retryPolicy: {policy!r} is not one of {', '.join(POLICY_RETRIES)}")
    return _Retry(limit, policy, expr)


def _depends(text: Any, path: str) -> list[str]:
    parts = [p.strip() for p in str(text).split("&&")]
    if not all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*?(\.Succeeded)?", p) for p in parts):
        raise _refuse(path, "anything but 'a && b' (or a.Succeeded) is")
    return [p.removesuffix(".Succeeded") for p in parts]


def build_plan(spec: dict, params: dict[str, str] | None) -> Plan:
    _check(spec, "", "workflow")
    if spec.get("apiVersion") != "argoproj.io/v1alpha1" or spec.get("kind") != "Workflow":
        raise UnsupportedSpec("apiVersion/kind: expected argoproj.io/v1alpha1 Workflow")
    meta = _check(spec.get("metadata", {}), "metadata", "metadata")
    if meta.get("name"):
        name = str(meta["name"])
    elif meta.get("generateName"):
        suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        name = str(meta["generateName"]) + suffix
    else:
        raise UnsupportedSpec("metadata: needs name or generateName")
    s = _check(spec.get("spec"), "spec", "spec")
    # The one exit handler accepted, without effect: the release of Kueue pod groups' quota (steps/release.py).
    # No Kueue runs here, so there is nothing to release; any other handler would be work not done, refused.
    if s.get("onExit") not in (None, RELEASE_TEMPLATE):
        raise _refuse("spec.onExit")

    wf_params: dict[str, str] = {}
    args = _check(s.get("arguments", {}), "spec.arguments", "arguments")
    for i, p in enumerate(_list(args.get("parameters"), "spec.arguments.parameters")):
        ppath = f"spec.arguments.parameters[{i}]"
        pname = _name(_check(p, ppath, "wf_param"), ppath)
        wf_params[pname] = p.get("value")
    for k, v in (params or {}).items():
        if k not in wf_params:
            known = ", ".join(wf_params) or "none"
            raise ValueError(f"unknown workflow parameter {k!r} (the spec has: {known})")
        wf_params[k] = v
    for i, p in enumerate(_list(args.get("parameters"), "spec.arguments.parameters")):
        ppath, value = f"spec.arguments.parameters[{i}]", wf_params[p["name"]]
        if value is None:
            raise UnsupportedSpec(f"{ppath}.value: parameter {p['name']!r} has no value and none was given")
        value = wf_params[p["name"]] = _scalar(value, f"{ppath}.value")
        if "enum" in p and value not in [str(x) for x in _list(p["enum"], f"{ppath}.enum")]:
            raise UnsupportedSpec(f"{ppath}: value {value!r} is not in enum {p['enum']!r}")
    # workflow.uid: new at each run, as the API server's is; the drill signs its round files with it.
    wf_ctx = {
        "workflow.name": name,
        "workflow.uid": str(uuid.uuid4()),
        **{f"workflow.parameters.{k}": v for k, v in wf_params.items()},
    }
    deadline = s.get("activeDeadlineSeconds")
    deadline = None if deadline is None else _seconds(deadline, "spec.activeDeadlineSeconds")
    pod_meta = s.get("podMetadata") or {}
    plan = Plan(
        name, wf_ctx, {}, deadline, dict(pod_meta.get("labels") or {}) if isinstance(pod_meta, dict) else {}
    )

    templates: dict[str, tuple[str, dict]] = {}
    for i, t in enumerate(_list(s.get("templates"), "spec.templates")):
        path = f"spec.templates[{i}]"
        tname = _name(_check(t, path, "template"), path)
        if tname in templates:
            raise UnsupportedSpec(f"{path}.name: duplicate template {tname!r}")
        if sum(k in t for k in ("dag", "container", "suspend")) != 1:
            raise UnsupportedSpec(
                f"{path}: needs exactly one of dag, container or suspend (the local runner's kinds)"
            )
        if "suspend" in t:
            _check(t["suspend"], f"{path}.suspend", "suspend")
            if str(t["suspend"].get("duration", "")) != "0" or "retryStrategy" in t:
                raise _refuse(
                    f"{path}.suspend", 'a suspend template other than duration "0" without retries is'
                )
        elif "dag" in t:
            extra = sorted(t.keys() - {"name", "dag"} - ACCEPTED_WITHOUT_EFFECT["template"])
            if extra:
                raise _refuse(f"{path}.{extra[0]}")
            _check(t["dag"], f"{path}.dag", "dag")
        else:
            _check(t["container"], f"{path}.container", "container")
            if not _list(t["container"].get("command"), f"{path}.container.command"):
                raise UnsupportedSpec(
                    f"{path}.container.command: required by the local runner "
                    "(it cannot use an image's entrypoint)"
                )
            _retry(t, path, None)
        templates[tname] = (path, t)

    entry = s.get("entrypoint")
    if entry not in templates:
        raise UnsupportedSpec(f"spec.entrypoint: unknown template {entry!r}")
    epath, etmpl = templates[entry]
    if "container" in etmpl:
        raw_tasks, tpath = [{"name": entry, "template": entry}], "spec.entrypoint"
    else:
        raw_tasks, tpath = _list(etmpl["dag"].get("tasks"), f"{epath}.dag.tasks"), f"{epath}.dag.tasks"
    groups: dict[str, list[str]] = {}  # a task as written -> the tasks it expands into
    for i, rt in enumerate(raw_tasks):
        path = f"{tpath}[{i}]"
        group = _name(_check(rt, path, "task"), path)
        if group in groups:
            raise UnsupportedSpec(f"{path}.name: duplicate task {group!r}")
        items: list[str | None] = [None]
        if "withSequence" in rt:
            seq = _check(rt["withSequence"], f"{path}.withSequence", "withSequence")
            if "count" not in seq:
                raise _refuse(f"{path}.withSequence", "anything but count is")
            items = [
                str(k)
                for k in range(
                    int(
                        _seconds(
                            _scalar(seq["count"], f"{path}.withSequence.count"),
                            f"{path}.withSequence.count",
                            wf_ctx,
                        )
                    )
                )
            ]
        groups[group] = []
        for item in items:
            task_name = group if item is None else f"{group}({item}:{item})"  # Argo's generateNodeName
            groups[group].append(task_name)
            _plan_task(plan, templates, rt, path, group, task_name, item)

    for tname, task in plan.tasks.items():
        task.deps = [member for d in task.deps for member in groups.get(d, [d])]
        for d in task.deps:
            if d not in plan.tasks:
                raise UnsupportedSpec(f"task {tname!r}: unknown dependency {d!r}")
    _check_acyclic(plan.tasks)
    return plan


def _plan_task(
    plan: Plan,
    templates: dict[str, tuple[str, dict]],
    rt: dict,
    path: str,
    group: str,
    task_name: str,
    item: str | None,
) -> None:
    """One task (or one withSequence item of it) into `plan`."""
    name, wf_ctx = plan.name, plan.wf_ctx
    ref = rt.get("template")
    if ref not in templates:
        raise UnsupportedSpec(f"{path}.template: unknown template {ref!r}")
    tmpl_path, tmpl = templates[ref]
    if "dag" in tmpl:
        raise _refuse(f"{path}.template", f"{ref!r} is a dag; nested DAGs are")
    deps = [str(d) for d in _list(rt.get("dependencies"), f"{path}.dependencies")]
    if "depends" in rt:
        deps += _depends(rt["depends"], f"{path}.depends")
    given: dict[str, str] = {}
    late: dict[str, str] = {}
    targs = _check(rt.get("arguments", {}), f"{path}.arguments", "arguments")
    for j, p in enumerate(_list(targs.get("parameters"), f"{path}.arguments.parameters")):
        ppath = f"{path}.arguments.parameters[{j}]"
        value = _scalar(p.get("value"), f"{ppath}.value")
        pname = _name(_check(p, ppath, "task_param"), ppath)
        refs = [m.group(1) for m in _REF.finditer(value)]
        if refs and all(_TASK_OUTPUT.fullmatch(r) for r in refs):  # a dependency's outputs, known at start
            for r in refs:
                if _TASK_OUTPUT.fullmatch(r).group(1) not in deps:
                    raise UnsupportedSpec(f"{ppath}.value: {r} names a task this one does not depend on")
            late[pname] = value
            given[pname] = value
        else:  # `{{item}}` only in a task's arguments, as in Argo (validate.go)
            given[pname] = _subst(
                value, {**wf_ctx, **({"item": item} if item is not None else {})}, f"{ppath}.value"
            )
    inputs: dict[str, str] = {}
    ins = _check(tmpl.get("inputs", {}), f"{tmpl_path}.inputs", "inputs")
    for j, p in enumerate(_list(ins.get("parameters"), f"{tmpl_path}.inputs.parameters")):
        ppath = f"{tmpl_path}.inputs.parameters[{j}]"
        pname = _name(_check(p, ppath, "input_param"), ppath)
        if pname in given:
            inputs[pname] = given.pop(pname)
        elif "default" in p:
            inputs[pname] = _subst(_scalar(p["default"], f"{ppath}.default"), wf_ctx, f"{ppath}.default")
        else:
            raise UnsupportedSpec(f"{path}.arguments: no value for input {pname!r} of {ref!r}")
    if given:
        raise UnsupportedSpec(f"{path}.arguments.parameters: {sorted(given)} are not inputs of {ref!r}")
    ictx = dict(wf_ctx, **{f"inputs.parameters.{k}": v for k, v in inputs.items()})
    tdl = tmpl.get("activeDeadlineSeconds")
    con = _check(rt.get("continueOn", {}), f"{path}.continueOn", "continueOn")
    for k, v in con.items():
        if not isinstance(v, bool):
            raise UnsupportedSpec(f"{path}.continueOn.{k}: expected true or false, got {v!r}")
    task = Task(
        task_name,
        ref,
        tmpl_path,
        tmpl,
        deps,
        inputs,
        _retry(tmpl, tmpl_path, ictx),
        None if tdl is None else _seconds(tdl, f"{tmpl_path}.activeDeadlineSeconds", ictx),
        frozenset(st for k, st in (("failed", "Failed"), ("error", "Error")) if con.get(k)),
        {k: v for k, v in late.items() if k in inputs},
        group,
        item,
        root=path.startswith("spec.entrypoint["),
    )
    labels = {**plan.pod_labels, **((tmpl.get("metadata") or {}).get("labels") or {})}  # Argo's merge order
    task.kueue_group = bool(labels.get(POD_GROUP_LABEL)) and bool(labels.get(QUEUE_LABEL))
    if task.suspend:
        plan.tasks[task_name] = task
        return
    # Resolve everything now with stand-in per-attempt values, so a bad reference fails before any pod.
    ctx = pod_ctx(plan, task, task.pod_name(name, 0), 0)
    argv_env(plan, task, ctx)
    artifact_paths(task, ctx)
    out_params(task, ctx)
    pod_grace(task, ctx)
    plan.tasks[task_name] = task


def _check_acyclic(tasks: dict[str, Task]) -> None:
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(n: str, trail: list[str]) -> None:
        if state.get(n) == 2:
            return
        if state.get(n) == 1:
            raise UnsupportedSpec(f"dependency cycle: {' -> '.join(trail[trail.index(n) :] + [n])}")
        state[n] = 1
        for d in tasks[n].deps:
            visit(d, trail + [n])
        state[n] = 2

    for n in tasks:
        visit(n, [])
