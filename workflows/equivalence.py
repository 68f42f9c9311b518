"""The equivalence drill as an Argo Workflow, written with Hera, and the drill's entry point (`main`; its
parser and `run` are workflows/cli.py's, which never imports this module: running this file executes it once).

    python workflows/equivalence.py render [-p name=value ...]   every object, as a multi-document YAML stream
    python workflows/equivalence.py write-templates         regenerate templates/*.yaml
    python workflows/equivalence.py run [--out DIR] [-p name=value ...]      run the rendered spec here
    python workflows/equivalence.py submit [-p name=value ...]               submit to an Argo server

`render` and `submit` render for the cluster that BATON_TARGET (or --target) names: workflows/targets.py.

The DAG: `reference`, `reference-replay` and `trial` train the same config from scratch under their
own prefixes; `evict` runs beside the trial and evicts it at computed points; the trial comes back
through its retry strategy; `verify` counts the trial's records; `compare` checks every tensor and
writes the report. Parameters reach the steps only as argv elements and env values, never through a
shell, so a value with quotes or `$(...)` stays data.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: `python workflows/equivalence.py ...`
    sys.path.insert(0, str(REPO))

import yaml  # noqa: E402
from hera.workflows import (  # noqa: E402
    DAG,
    Artifact,
    Container,
    CronWorkflow,
    Env,
    Parameter,
    RetryStrategy,
    Suspend,
    Workflow,
)
from hera.workflows import models as m  # noqa: E402

from steps.lib.contract import (  # noqa: E402
    HELPER_RETRY_EXPRESSION,
    POD_GROUP_COUNT,
    POD_GROUP_LABEL,
    REPORT_FILES,
    RETRY_EXPRESSION,
    ROLES,
    TASKS,
    drill_root,
    evictions_file,
    evidence_root,
    report_root,
    role_root,
    rounds_root,
    verify_file,
)
from workflows import targets  # noqa: E402
from workflows.params import (  # noqa: E402,F401
    PARAMETERS,
    QUEUE_LABEL,
    default_retry_limit,
    drill_deadline_s,
    parse_params,
    resolve_params,
    set_deadline,
    set_queue_label,
    values_of,
)

NAME = "baton-equivalence"
SERVICE_ACCOUNT = "baton-drill"
# The overlays ship this ConfigMap (MinIO on kind, GCS on GKE): compare's output artifacts need a repository.
ARTIFACT_REPOSITORY = ("artifact-repositories", "default-v1")
# The retry expressions and Argo's messages they match: steps/lib/contract.py.
HELPER_RETRY_LIMIT = "3"
REPORT_DIR = "/tmp/baton-report/{{workflow.name}}"
# Numbers that compare writes to <out>/metrics/<name> (its output parameters; -1: not measured), exposed as
# Prometheus gauges by `publish`, a suspend template of duration 0 after compare: no pod (nothing to delete,
# nothing to retry), the numbers as its inputs. Argo evaluates a template's metrics on every attempt node,
# substituting the whole metric before `when`, with unresolved variables an error: on a retried template, an
# attempt that left no outputs (a deleted pod, a lost VM) or `{{retries}}` (unresolved on an attempt) adds a
# MetricsError condition. An input is set when the node is created, on every node.
COMPARE_METRICS = {
    "trial_retries": "Retries the last drill's trial took: one per attempt after its first",
    "preemptions": "Clean preemptions (committed saves, exit 75) of the last drill's trial",
    "replayed_steps": "Steps the last drill's trial trained twice (0 when resume lost nothing)",
    "max_save_ms": "Slowest preemption save of the last drill's trial, in milliseconds",
    "min_grace_left_s": "Least grace left after a preemption save in the last drill's trial, in seconds",
}


class _MetricSuspend(Suspend):
    """A suspend template with its metrics: Hera 7.1's Suspend accepts `metrics` but drops them when it
    builds the template (hera/workflows/suspend.py, `_build_template`); Argo evaluates them on any node."""

    def _build_template(self) -> m.Template:
        template = super()._build_template()
        template.metrics = self._build_metrics()
        return template


def p(name: str) -> str:
    return "{{workflow.parameters." + name + "}}"


ROOT = drill_root(p("bucket"), p("prefix"), "{{workflow.name}}")
EVIDENCE = evidence_root(ROOT)
GRACE_PATCH = '{"terminationGracePeriodSeconds": ' + p("grace") + "}"


def _pod_name_env() -> m.EnvVar:
    return m.EnvVar(
        name="BATON_POD_NAME",
        value_from=m.EnvVarSource(field_ref=m.ObjectFieldSelector(field_path="metadata.name")),
    )


def _pod_ip_env() -> m.EnvVar:
    return m.EnvVar(
        name="BATON_POD_IP",
        value_from=m.EnvVarSource(field_ref=m.ObjectFieldSelector(field_path="status.podIP")),
    )


def _round_key_env() -> m.EnvVar:
    """The secret that signs a group's round files (steps/lib/group.py): the Workflow's uid, which only the
    Workflow holds; it is never written to the bucket."""
    return m.EnvVar(name="BATON_ROUND_KEY", value="{{workflow.uid}}")


NODE = "{{inputs.parameters.node}}"
# Kueue's plain-pod groups (steps/lib/contract.py): no Workload, hence no quota, until total-count pods of the group
# exist; a retried pod of an admitted group joins it as a replacement. With a queue, the release exit handler
# frees a group that did not succeed (workflows/params.py, set_release_handler).


def _train_args(role: str, nodes: int = 1) -> list[str]:
    group = (
        [
            "--nnodes",
            p("nodes"),
            "--node-rank",
            NODE,
            "--rendezvous",
            rounds_root(ROOT, role),
            "--master-port",
            p("store_port"),
            "--rendezvous-timeout",
            p("rendezvous_timeout"),
        ]
        if nodes > 1
        else []
    )
    return [
        "-m",
        "steps.train",
        "--nproc",
        p("ranks"),
        *group,
        "--shutdown-timeout",
        p("grace"),
        "--trainer",
        p("trainer"),
        "--config",
        p("config"),
        "--evidence",
        evidence_root(ROOT, role),
        "--set",
        f"checkpoint.uri={role_root(ROOT, role)}",
        "--set",
        f"total_steps={p('total_steps')}",
        "--set",
        f"seed={p('seed')}",
        "--set",
        f"model.dropout={p('dropout')}",
        "--set",
        f"checkpoint.every_steps={p('every_steps')}",
    ]


def _group(role: str, nodes: int) -> dict[str, Any]:
    """A training template's labels and annotations in a group of `nodes` pods: Kueue's pod group, one
    per role and workflow (never per attempt), and the pod's node."""
    if nodes == 1:
        return {}
    return dict(
        labels={POD_GROUP_LABEL: "{{workflow.name}}-" + role, "baton.dev/node": NODE},
        annotations={POD_GROUP_COUNT: p("nodes")},
    )


PUBLISH = "publish"
"""The DAG's leaf (its template and task): the drill's metrics, from compare's outputs."""


def _define_dag(nodes: int = 1) -> None:
    """Templates and the DAG, inside an active Workflow or CronWorkflow context; above one node, each
    training task expands into a group of `nodes` pods (docs/multinode.md)."""
    from hera.workflows import Gauge, NoneArchiveStrategy

    # The roles and the DAG's task names are the contract's (steps/lib/contract.py); the trial, evict, verify and
    # compare templates are named as their tasks.
    reference, replay, trial_role = ROLES
    reference_task, replay_task, trial_task, evict_task, verify_task, compare_task = TASKS

    # Prometheus metrics (Argo prefixes `argo_workflows_`), gauges only: Argo may evaluate a finished node's
    # metrics on more than one path, which a gauge's Set survives and a counter would count twice. Only
    # the DAG and compare carry metrics, and they use only variables that resolve on every node: `{{status}}`, `{{duration}}` and compare's output parameters (which
    # default to -1 when their file is missing; compare is retried, see COMPARE_METRICS).
    done = "{{status}} == Succeeded"
    passed_help = "1 if the last equivalence drill passed (every step succeeded), 0 if it did not"
    common: dict[str, Any] = dict(image=p("image"), command=["python"], pod_spec_patch=GRACE_PATCH)
    # Every training pod can meet a Spot preemption (on GKE all three run on the Spot pool): each resumes
    # from its own checkpoints, so each retries the same way. No template metrics here: see COMPARE_METRICS.
    trainer_retry = RetryStrategy(retry_policy="Always", limit=p("retry_limit"), expression=RETRY_EXPRESSION)
    helper_retry = RetryStrategy(
        retry_policy="Always", limit=HELPER_RETRY_LIMIT, expression=HELPER_RETRY_EXPRESSION
    )
    node_input = [Parameter(name="node")] if nodes > 1 else []
    node_env = [_pod_ip_env(), _round_key_env()] if nodes > 1 else []
    train = Container(
        name="train",
        inputs=[Parameter(name="role"), *node_input],
        args=_train_args("{{inputs.parameters.role}}", nodes),
        env=[Env(name="BATON_GRACE", value=p("grace")), _pod_name_env(), *node_env],
        retry_strategy=trainer_retry,
        **_group("{{inputs.parameters.role}}", nodes),
        **common,
    )
    trial = Container(
        name=trial_task,
        inputs=node_input,
        args=_train_args(trial_role, nodes),
        env=[
            Env(name="BATON_GRACE", value=p("grace")),
            _pod_name_env(),
            *node_env,
            Env(name="BATON_DISABLE_SIGTERM_HANDLER", value=p("disable_sigterm_handler")),
        ],
        retry_strategy=trainer_retry,
        **_group(trial_role, nodes),
        **common,
    )
    evict = Container(
        name=evict_task,
        image=p("image"),
        command=["python"],
        args=[
            "-m",
            "steps.evict",
            "--evidence",
            evidence_root(ROOT, trial_role),
            "--total-steps",
            p("total_steps"),
            "--evictions",
            p("evictions"),
            "--seed",
            p("seed"),
            "--jitter",
            p("jitter"),
            "--every-steps",
            p("every_steps"),
            "--workflow",
            "{{workflow.name}}",
            *(["--nodes", p("nodes"), "--node", p("evict_node")] if nodes > 1 else []),
            "--how",
            p("eviction"),
            "--out",
            evictions_file(ROOT),
        ],
        retry_strategy=helper_retry,
    )
    verify = Container(
        name=verify_task,
        image=p("image"),
        command=["python"],
        args=[
            "-m",
            "steps.verify",
            "--evidence",
            evidence_root(ROOT, trial_role),
            "--total-steps",
            p("total_steps"),
            "--evictions",
            evictions_file(ROOT),
            "--out",
            verify_file(ROOT),
            "--no-fail",
        ],
        retry_strategy=helper_retry,
    )
    compare = Container(
        name=compare_task,
        image=p("image"),
        command=["python"],
        args=[
            "-m",
            "steps.compare",
            "--reference",
            role_root(ROOT, reference),
            "--replay",
            role_root(ROOT, replay),
            "--trial",
            role_root(ROOT, trial_role),
            "--evidence",
            EVIDENCE,
            "--verify",
            verify_file(ROOT),
            "--evictions",
            evictions_file(ROOT),
            "--total-steps",
            p("total_steps"),
            "--tier",
            p("tier"),
            "--out",
            REPORT_DIR,
            "--report-uri",
            report_root(ROOT),
        ],
        # Not archived: the Argo UI shows report.md and loss.png as they are.
        outputs=[
            Artifact(name=f.replace(".", "-"), path=f"{REPORT_DIR}/{f}", archive=NoneArchiveStrategy())
            for f in REPORT_FILES
        ]
        + [
            Parameter(name=name, value_from=m.ValueFrom(path=f"{REPORT_DIR}/metrics/{name}", default="-1"))
            for name in COMPARE_METRICS
        ],
        retry_strategy=helper_retry,
    )
    publish = _MetricSuspend(
        name=PUBLISH,
        duration="0",
        inputs=[Parameter(name=name) for name in COMPARE_METRICS],
        metrics=[
            Gauge(
                name=f"baton_drill_{name}",
                value="{{inputs.parameters." + name + "}}",
                realtime=False,
                help=help_,
            )
            for name, help_ in COMPARE_METRICS.items()
        ],
    )
    with DAG(
        name="drill",
        metrics=[
            Gauge(name="baton_drill_passed", value="1", when=done, realtime=False, help=passed_help),
            Gauge(
                name="baton_drill_passed",
                value="0",
                when="{{status}} != Succeeded",
                realtime=False,
                help=passed_help,
            ),
            Gauge(
                name="baton_drill_seconds",
                value="{{duration}}",
                realtime=False,
                help="Wall time of the last equivalence drill, from its first step to its last",
            ),
        ],
    ):
        # Plain `dependencies`, not `depends` expressions: the simplest semantics, and the one the local
        # runner implements. Every training task and evict continue on failure, so that verify and
        # compare still write a report when one dies for good (the negative control, or a trainer that
        # breaks the contract: the report names the role and the clause); compare then fails, and with it
        # the drill (publish, the leaf, never starts; Argo fails a DAG whose task failed without continueOn).
        keep_going = m.ContinueOn(failed=True, error=True)
        # Above one node: N tasks per role (`trial(0:0)`, `trial(1:1)`, ...), each retried on its own.
        each = dict(with_sequence=m.Sequence(count=p("nodes"))) if nodes > 1 else {}
        node_arg = {"node": "{{item}}"} if nodes > 1 else {}
        train(name=reference_task, arguments={"role": reference, **node_arg}, continue_on=keep_going, **each)
        train(name=replay_task, arguments={"role": replay, **node_arg}, continue_on=keep_going, **each)
        trial(
            name=trial_task, continue_on=keep_going, **({"arguments": node_arg} if nodes > 1 else {}), **each
        )
        evict(name=evict_task, continue_on=keep_going)
        verify(name=verify_task, dependencies=[trial_task, evict_task])
        compare(name=compare_task, dependencies=[reference_task, replay_task, verify_task])
        publish(
            name=PUBLISH,
            dependencies=[compare_task],
            arguments={
                name: "{{tasks." + compare_task + ".outputs.parameters." + name + "}}"
                for name in COMPARE_METRICS
            },
        )


def _arguments(nodes: int = 1) -> list[Parameter]:
    values = {k: v for k, (v, _) in PARAMETERS.items()} | {"nodes": str(nodes)}
    return [Parameter(name=k, value=values[k], description=PARAMETERS[k][1]) for k in PARAMETERS]


def _artifact_repository() -> m.ArtifactRepositoryRef:
    config_map, key = ARTIFACT_REPOSITORY
    return m.ArtifactRepositoryRef(config_map=config_map, key=key)


# Every drill ends: a deadline from its size (or -p deadline=SECONDS; workflows/params.py), so that one that
# never schedules (a Spot stockout, an image that cannot be pulled, a Kueue quota stall) fails instead of
# blocking every later nightly drill (concurrencyPolicy Forbid). Pods that succeeded go at once, failed ones
# stay for their logs until the workflow itself goes (a day after success, a week after failure).
POD_GC = m.PodGC(strategy="OnPodSuccess")
TTL = m.TTLStrategy(seconds_after_success=24 * 3600, seconds_after_failure=7 * 24 * 3600)


def _ending() -> dict[str, Any]:
    return dict(active_deadline_seconds=drill_deadline_s(values_of({})), pod_gc=POD_GC, ttl_strategy=TTL)


def build_workflow(nodes: int = 1) -> Workflow:
    with Workflow(
        generate_name=f"{NAME}-",
        entrypoint="drill",
        service_account_name=SERVICE_ACCOUNT,
        arguments=_arguments(nodes),
        labels={"app.kubernetes.io/part-of": "baton"},
        artifact_repository_ref=_artifact_repository(),
        **_ending(),
    ) as w:
        _define_dag(nodes)
    return w


def build_cron(schedule: str = "0 3 * * *", nodes: int = 1) -> CronWorkflow:
    with CronWorkflow(
        name=f"{NAME}-nightly",
        schedules=[schedule],
        concurrency_policy="Forbid",
        starting_deadline_seconds=600,
        successful_jobs_history_limit=3,
        failed_jobs_history_limit=5,
        timezone="Etc/UTC",
        entrypoint="drill",
        service_account_name=SERVICE_ACCOUNT,
        arguments=_arguments(nodes),
        labels={"app.kubernetes.io/part-of": "baton"},
        artifact_repository_ref=_artifact_repository(),
        **_ending(),
    ) as w:
        _define_dag(nodes)
    return w


def rendered(nodes: int = 1) -> list[dict[str, Any]]:
    """The Workflow and the CronWorkflow; `nodes` shapes the DAG, so it is fixed when they are rendered."""
    return [build_workflow(nodes).to_dict(), build_cron(nodes=nodes).to_dict()]


def with_params(obj: dict[str, Any], params: dict[str, str]) -> dict[str, Any]:
    """A rendered object with `params` (already resolved) as its parameters' values, and its pods in the
    Kueue queue that `queue` names (none when it is empty)."""
    spec = obj["spec"].get("workflowSpec", obj["spec"])
    for prm in spec["arguments"]["parameters"]:
        if prm["name"] in params:
            prm["value"] = params[prm["name"]]
    set_queue_label(obj, values_of(params)["queue"])
    set_deadline(obj, values_of(params))
    return obj


def to_yaml(objs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objs, sort_keys=False, width=120)


# Paths under templates/: the CronWorkflow is a resource of the kustomize base, the one-off Workflow is not.
TEMPLATE_FILES = {
    "Workflow": "workflow-equivalence.yaml",
    "CronWorkflow": "base/cronworkflow-equivalence.yaml",
}


def write_templates(folder: Path = REPO / "templates", nodes: int = 1) -> list[Path]:
    header = (
        "# Generated by `python workflows/equivalence.py write-templates`; a test regenerates and diffs it.\n"
    )
    out = []
    for obj in rendered(nodes):
        path = folder / TEMPLATE_FILES[obj["kind"]]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(header + to_yaml([obj]))
        out.append(path)
    return out


def rendered_for(target: str | None, nodes: int = 1) -> list[dict[str, Any]]:
    """The Workflow and the CronWorkflow for `target` (workflows/targets.py): the base's, or the overlay's."""
    if target is None:
        return rendered(nodes)
    objects = targets.overlay_objects(target, lambda folder: write_templates(folder, nodes))
    return targets.for_target(target, build_workflow(nodes).to_dict(), objects)


def main(argv: list[str] | None = None) -> int:
    """`python workflows/equivalence.py COMMAND ...`: the parser and `run` are workflows/cli.py's (which
    takes the workflow from here, as `submit` does, and never imports this module), `submit` and `status`
    workflows/argo.py's, `render` and `write-templates` this module's own."""
    from workflows import cli

    args = cli.parser().parse_args(argv)
    if args.command == "render":
        target = targets.chosen(args.target)
        params = resolve_params(parse_params(args.param)) if args.param else {}
        nodes = int(values_of(params)["nodes"])
        sys.stdout.write(to_yaml([with_params(obj, params) for obj in rendered_for(target, nodes)]))
        return 0
    if args.command == "write-templates":
        for path in write_templates():
            print(f"wrote {path.relative_to(REPO)}")
        return 0
    if args.command == "run":
        return cli.cmd_run(args, lambda nodes: build_workflow(nodes).to_dict())
    if args.command == "submit":
        from workflows.argo import submit

        nodes = int(values_of(resolve_params(parse_params(args.param), cluster=True))["nodes"])
        if args.from_file:
            if args.target:
                raise targets.TargetError("--target and --from-file: give one (the file is already rendered)")
            return submit(args, lambda: build_workflow(nodes).to_dict())
        target = targets.chosen(args.target)
        code = submit(args, lambda: rendered_for(target, nodes)[0])
        print(targets.announce(target, args.target), file=sys.stderr)  # after: an error stays one line
        return code
    if args.command == "status":
        from workflows.argo import status

        return status(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
