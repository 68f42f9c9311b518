"""The equivalence drill as an Argo Workflow, written with Hera, and its command line.

    python workflows/equivalence.py render [-p name=value ...]   every object, as a multi-document YAML stream
    python workflows/equivalence.py write-templates         regenerate templates/*.yaml
    python workflows/equivalence.py run [--out DIR] [-p name=value ...]      run the rendered spec here
    python workflows/equivalence.py submit [-p name=value ...]               submit to an Argo server

The DAG: `reference`, `reference-replay` and `trial` train the same config from scratch under their
own prefixes; `evict` runs beside the trial and evicts it at computed points; the trial comes back
through its retry strategy; `verify` counts the trial's records; `compare` checks every tensor and
writes the report. Parameters reach the steps only as argv elements and env values, never through a
shell, so a value with quotes or `$(...)` stays data.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
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
    Workflow,
)
from hera.workflows import models as m  # noqa: E402

from workflows.params import (  # noqa: E402,F401
    PARAMETERS,
    QUEUE_LABEL,
    parse_params,
    resolve_params,
    set_queue_label,
    values_of,
)

NAME = "baton-equivalence"
SERVICE_ACCOUNT = "baton-drill"
# The overlays ship this ConfigMap (MinIO on kind, GCS on GKE): compare's output artifacts need a repository.
ARTIFACT_REPOSITORY = ("artifact-repositories", "default-v1")
# How Argo records the end of an attempt that met an eviction, a preemption or a lost node (ARGO-FACTS):
# exit 75 is a trainer that saved in time, whatever the message; the messages are a kubelet's graceful node
# shutdown (GKE Spot), a pod object gone before the controller saw its status (a deletion, an eviction, a
# Kueue preemption), a VM lost without a graceful shutdown (exit -1), and a kubelet pressure eviction.
# A crash (exit 1, "main: Error (exit code 1)") matches none of them and is never retried. Exit 143 is a pod
# deleted in its first instants, before steps.train's SIGTERM handler existed: nothing was started, let alone
# trained (steps.train itself answers 75 for a SIGTERM that came before any step, 0 for one after `done`).
DISRUPTIONS = ("imminent node shutdown", "pod deleted", "neither main nor wait container completed successfully",
               "The node was low on resource")
RETRY_EXPRESSION = f"asInt(lastRetry.exitCode) == 75 || asInt(lastRetry.exitCode) == 143 || lastRetry.message matches '{'|'.join(DISRUPTIONS)}'"
# evict, verify and compare: no trainer, so no exit 75; a SIGTERM they do not handle ends them with 143. Each is
# idempotent: evict resumes its own record, verify rewrites verify.json whole, compare writes report.json last.
HELPER_RETRY_EXPRESSION = f"asInt(lastRetry.exitCode) == 143 || lastRetry.message matches '{'|'.join(DISRUPTIONS)}'"
HELPER_RETRY_LIMIT = "3"
REPORT_DIR = "/tmp/baton-report/{{workflow.name}}"
REPORT_FILES = ("report.json", "report.md", "loss.png")
# Numbers that compare writes to <out>/metrics/<name>, exposed as Prometheus gauges (-1: not measured).
# Published by compare, not by the trial's own metrics: Argo evaluates a template's metrics on every failed
# attempt, where `{{retries}}` does not resolve (a MetricsError condition per eviction). compare is retried
# too (its pod can be preempted like any other), but its metrics use only its output parameters, which take
# their default (-1) where the file is missing: a failed attempt sets the gauges to -1 (or, for a pod deleted
# before Argo saw its outputs, adds one MetricsError condition), and the attempt that succeeds, evaluated last,
# sets them to the drill's figures.
COMPARE_METRICS = {
    "trial_retries": "Retries the last drill's trial took: one per attempt after its first",
    "preemptions": "Clean preemptions (committed saves, exit 75) of the last drill's trial",
    "replayed_steps": "Steps the last drill's trial trained twice (0 when resume lost nothing)",
    "max_save_ms": "Slowest preemption save of the last drill's trial, in milliseconds",
    "min_grace_left_s": "Least grace left after a preemption save in the last drill's trial, in seconds",
}

def p(name: str) -> str:
    return "{{workflow.parameters." + name + "}}"


ROOT = f"{p('bucket')}/{p('prefix')}/{{{{workflow.name}}}}"
EVIDENCE = f"{ROOT}/evidence"
GRACE_PATCH = '{"terminationGracePeriodSeconds": ' + p("grace") + "}"


def _pod_name_env() -> m.EnvVar:
    return m.EnvVar(name="BATON_POD_NAME",
                    value_from=m.EnvVarSource(field_ref=m.ObjectFieldSelector(field_path="metadata.name")))


def _train_args(role: str) -> list[str]:
    return ["-m", "steps.train", "--nproc", p("ranks"), "--shutdown-timeout", p("grace"),
            "--trainer", p("trainer"), "--config", p("config"), "--evidence", f"{EVIDENCE}/{role}",
            "--set", f"checkpoint.uri={ROOT}/{role}",
            "--set", f"total_steps={p('total_steps')}",
            "--set", f"seed={p('seed')}",
            "--set", f"model.dropout={p('dropout')}",
            "--set", f"checkpoint.every_steps={p('every_steps')}"]


def _define_dag() -> None:
    """Templates and the DAG, inside an active Workflow or CronWorkflow context."""
    from hera.workflows import Gauge, NoneArchiveStrategy

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
    helper_retry = RetryStrategy(retry_policy="Always", limit=HELPER_RETRY_LIMIT, expression=HELPER_RETRY_EXPRESSION)
    train = Container(name="train", inputs=[Parameter(name="role")], args=_train_args("{{inputs.parameters.role}}"),
                      env=[Env(name="BATON_GRACE", value=p("grace")), _pod_name_env()],
                      retry_strategy=trainer_retry, **common)
    trial = Container(
        name="trial", args=_train_args("trial"),
        env=[Env(name="BATON_GRACE", value=p("grace")), _pod_name_env(),
             Env(name="BATON_DISABLE_SIGTERM_HANDLER", value=p("disable_sigterm_handler"))],
        retry_strategy=trainer_retry, **common)
    evict = Container(name="evict", image=p("image"), command=["python"],
                      args=["-m", "steps.evict", "--evidence", f"{EVIDENCE}/trial",
                            "--total-steps", p("total_steps"), "--evictions", p("evictions"),
                            "--seed", p("seed"), "--jitter", p("jitter"), "--every-steps", p("every_steps"),
                            "--workflow", "{{workflow.name}}",
                            "--how", p("eviction"), "--out", f"{ROOT}/evictions.json"],
                      retry_strategy=helper_retry)
    verify = Container(name="verify", image=p("image"), command=["python"],
                       args=["-m", "steps.verify", "--evidence", f"{EVIDENCE}/trial",
                             "--total-steps", p("total_steps"), "--evictions", f"{ROOT}/evictions.json",
                             "--out", f"{ROOT}/verify.json", "--no-fail"],
                       retry_strategy=helper_retry)
    compare = Container(
        name="compare", image=p("image"), command=["python"],
        args=["-m", "steps.compare", "--reference", f"{ROOT}/reference", "--replay", f"{ROOT}/replay",
              "--trial", f"{ROOT}/trial", "--evidence", EVIDENCE, "--verify", f"{ROOT}/verify.json",
              "--evictions", f"{ROOT}/evictions.json", "--total-steps", p("total_steps"), "--tier", p("tier"),
              "--out", REPORT_DIR, "--report-uri", f"{ROOT}/report"],
        # Not archived: the Argo UI shows report.md and loss.png as they are.
        outputs=[Artifact(name=f.replace(".", "-"), path=f"{REPORT_DIR}/{f}", archive=NoneArchiveStrategy())
                 for f in REPORT_FILES]
        + [Parameter(name=name, value_from=m.ValueFrom(path=f"{REPORT_DIR}/metrics/{name}", default="-1"))
           for name in COMPARE_METRICS],
        retry_strategy=helper_retry,
        metrics=[Gauge(name=f"baton_drill_{name}", value="{{outputs.parameters." + name + "}}", realtime=False,
                       help=help_) for name, help_ in COMPARE_METRICS.items()])
    with DAG(name="drill", metrics=[
            Gauge(name="baton_drill_passed", value="1", when=done, realtime=False, help=passed_help),
            Gauge(name="baton_drill_passed", value="0", when="{{status}} != Succeeded", realtime=False,
                  help=passed_help),
            Gauge(name="baton_drill_seconds", value="{{duration}}", realtime=False,
                  help="Wall time of the last equivalence drill, from its first step to its last")]):
        # Plain `dependencies`, not `depends` expressions: the simplest semantics, and the one the local
        # runner implements. Every training task and evict continue on failure, so that verify and
        # compare still write a report when one dies for good (the negative control, or a trainer that
        # breaks the contract: the report names the role and the clause); compare, the only leaf, then
        # fails and with it the drill (Argo decides a DAG's phase by its leaves).
        keep_going = m.ContinueOn(failed=True, error=True)
        train(name="reference", arguments={"role": "reference"}, continue_on=keep_going)
        train(name="reference-replay", arguments={"role": "replay"}, continue_on=keep_going)
        trial(name="trial", continue_on=keep_going)
        evict(name="evict", continue_on=keep_going)
        verify(name="verify", dependencies=["trial", "evict"])
        compare(name="compare", dependencies=["reference", "reference-replay", "verify"])


def _arguments() -> list[Parameter]:
    return [Parameter(name=k, value=v, description=d) for k, v, d in ((k, *PARAMETERS[k]) for k in PARAMETERS)]


def _artifact_repository() -> m.ArtifactRepositoryRef:
    config_map, key = ARTIFACT_REPOSITORY
    return m.ArtifactRepositoryRef(config_map=config_map, key=key)


def build_workflow() -> Workflow:
    with Workflow(generate_name=f"{NAME}-", entrypoint="drill", service_account_name=SERVICE_ACCOUNT,
                  arguments=_arguments(), labels={"app.kubernetes.io/part-of": "baton"},
                  artifact_repository_ref=_artifact_repository()) as w:
        _define_dag()
    return w


def build_cron(schedule: str = "0 3 * * *") -> CronWorkflow:
    with CronWorkflow(name=f"{NAME}-nightly", schedules=[schedule], concurrency_policy="Forbid",
                      starting_deadline_seconds=600, successful_jobs_history_limit=3, failed_jobs_history_limit=5,
                      timezone="Etc/UTC", entrypoint="drill", service_account_name=SERVICE_ACCOUNT,
                      arguments=_arguments(), labels={"app.kubernetes.io/part-of": "baton"},
                      artifact_repository_ref=_artifact_repository()) as w:
        _define_dag()
    return w


def rendered() -> list[dict[str, Any]]:
    return [build_workflow().to_dict(), build_cron().to_dict()]


def with_params(obj: dict[str, Any], params: dict[str, str]) -> dict[str, Any]:
    """A rendered object with `params` (already resolved) as its parameters' values, and its pods in the
    Kueue queue that `queue` names (none when it is empty)."""
    spec = obj["spec"].get("workflowSpec", obj["spec"])
    for prm in spec["arguments"]["parameters"]:
        if prm["name"] in params:
            prm["value"] = params[prm["name"]]
    set_queue_label(obj, values_of(params)["queue"])
    return obj


def to_yaml(objs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objs, sort_keys=False, width=120)


# Paths under templates/: the CronWorkflow is a resource of the kustomize base, the one-off Workflow is not.
TEMPLATE_FILES = {"Workflow": "workflow-equivalence.yaml", "CronWorkflow": "base/cronworkflow-equivalence.yaml"}


def write_templates(folder: Path = REPO / "templates") -> list[Path]:
    header = "# Generated by `python workflows/equivalence.py write-templates`; a test regenerates and diffs it.\n"
    out = []
    for obj in rendered():
        path = folder / TEMPLATE_FILES[obj["kind"]]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(header + to_yaml([obj]))
        out.append(path)
    return out


# ---- commands ----------------------------------------------------------------------------------------

def cmd_run(args: argparse.Namespace) -> int:
    from workflows.local import UnsupportedSpec, run_workflow

    out = Path(args.out).resolve()
    if out.exists() and any(out.iterdir()):
        if not args.force:
            raise SystemExit(f"error: {out} is not empty (use --force to clear it)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    local, rest = _local_params(args.param)
    chaos_n, chaos_seed = int(local.get("chaos", "0")), int(local.get("chaos_seed", random.SystemRandom().randrange(2**31)))
    overrides = parse_params(rest)
    if "trainer" in overrides:
        overrides["trainer"] = script_from_here(overrides["trainer"], Path.cwd())
    if chaos_n and "retry_limit" not in overrides:  # room for every eviction and every chaos deletion, and more
        evictions = int(values_of(overrides)["evictions"]) if values_of(overrides)["evictions"].isdigit() else 0
        overrides["retry_limit"] = str(evictions + chaos_n + 5)
    params = resolve_params(overrides)
    params.setdefault("bucket", f"file://{out}/bucket")
    chaos = None
    if chaos_n:
        from workflows.chaos import Chaos

        chaos = Chaos(chaos_n, chaos_seed, CHAOS_TASKS, step_tasks=TRAINING_TASKS,
                      total_steps=int(values_of(params)["total_steps"]), long_tasks={"evict": 20.0})
        print(f"chaos: {chaos_n} pod deletion(s), seed {chaos_seed} (-p chaos_seed={chaos_seed} repeats the plan)",
              file=sys.stderr)
    spec = build_workflow().to_dict()
    set_queue_label(spec, values_of(params)["queue"])  # no local effect; the spec is what a cluster would get
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    try:
        result = run_workflow(spec, out / "argo", params, cwd=REPO, env=env, progress=sys.stderr, chaos=chaos)
    except UnsupportedSpec as e:
        raise SystemExit(f"error: {e}") from None
    by_artifact = {f.replace(".", "-"): f for f in REPORT_FILES}
    for node in result.nodes:
        for name, path in node.artifacts.items():
            if name in by_artifact and path.is_file():
                shutil.copy(path, out / by_artifact[name])
    # A failed compare saves no artifacts here; its report is in the bucket all the same.
    bucket_report = Path(params["bucket"].removeprefix("file://")) / values_of(params)["prefix"] / result.name / "report"
    for f in REPORT_FILES:
        if not (out / f).exists() and (bucket_report / f).is_file():
            shutil.copy(bucket_report / f, out / f)
    report_path = out / "report.json"
    if report_path.exists():
        report = json.loads(report_path.read_text())
        if result.chaos is not None:  # the runner's doing, not the workflow's: only this copy has it
            report["chaos"] = result.chaos
            report_path.write_text(json.dumps(report, indent=1, sort_keys=True, default=str))
        print(drill_summary(report))
    else:
        print(f"no report: the workflow ended {result.phase}; logs in {out / 'argo' / 'logs'}")
    print(f"workflow {result.phase}; report and logs in {out}")
    return 0 if result.phase == "Succeeded" else 1


def script_from_here(trainer: str, cwd: Path) -> str:
    """`-p trainer='my_train.py ARGS'` as the caller means it: a relative script path that exists from the
    caller's folder is made absolute (the local pods run in baton's root). `baton`, `hf`, `-m module` and
    paths that do not exist here are left as they are (on a cluster the path is the image's)."""
    import shlex

    if trainer in ("baton", "hf"):
        return trainer
    try:
        argv = shlex.split(trainer)
    except ValueError:
        return trainer  # steps.train refuses it, with the reason
    i = 1 if argv and Path(argv[0]).name in ("python", "python3") else 0
    if len(argv) > i and not argv[i].startswith("-") and not Path(argv[i]).is_absolute() and (cwd / argv[i]).is_file():
        argv[i] = str((cwd / argv[i]).resolve())
        return shlex.join(argv)
    return trainer


# `run` only: the local runner's own options, not workflow parameters (a cluster has its own chaos).
LOCAL_PARAMETERS = {
    "chaos": "pods to delete at random among every step of the drill, at random moments (workflows/chaos.py)",
    "chaos_seed": "the seed of those choices (default: drawn, and printed and recorded in report.json)",
}
CHAOS_TASKS = ["reference", "reference-replay", "trial", "evict", "verify", "compare"]
TRAINING_TASKS = frozenset({"reference", "reference-replay", "trial"})


def _local_params(items: list[str]) -> tuple[dict[str, str], list[str]]:
    local, rest = {}, []
    for item in items:
        name, sep, value = item.partition("=")
        if sep and name in LOCAL_PARAMETERS:
            if not value.isdigit():
                raise SystemExit(f"error: -p {name} must be a non-negative integer, got {value!r}")
            local[name] = value
        else:
            rest.append(item)
    return local, rest


def drill_summary(report: dict[str, Any]) -> str:
    from steps.report import summary

    return summary(report)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python workflows/equivalence.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    rd = sub.add_parser("render", help="print every object as a multi-document YAML stream")
    rd.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                    help="parameter values to render (checked as for submit; -p queue=Q adds the Kueue label)")
    sub.add_parser("write-templates", help="regenerate templates/*.yaml")
    r = sub.add_parser("run", help="run the rendered workflow on this machine")
    r.add_argument("--out", default="out/drill", help="folder for the report, logs and the local bucket")
    r.add_argument("--force", action="store_true", help="clear --out first if it is not empty")
    r.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a workflow parameter, or one of the runner's own: chaos=N (delete N pods at random, "
                        "workflows/chaos.py), chaos_seed=S")
    from workflows.argo import add_server_arguments

    s = sub.add_parser("submit", help="submit the workflow to an Argo server (see workflows/argo.py)")
    s.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE")
    s.add_argument("--from-file", metavar="FILE",
                   help="submit the Workflow (or a CronWorkflow's workflowSpec) in FILE ('-': stdin) instead, "
                        "e.g. from 'kubectl kustomize templates/overlays/kind'")
    add_server_arguments(s)
    st = sub.add_parser("status", help="a submitted drill's nodes beside its checkpoint store")
    st.add_argument("name", help="the workflow's name, as submit printed it")
    add_server_arguments(st)
    args = ap.parse_args(argv)
    if args.command == "render":
        params = resolve_params(parse_params(args.param)) if args.param else {}
        sys.stdout.write(to_yaml([with_params(obj, params) for obj in rendered()]))
        return 0
    if args.command == "write-templates":
        for path in write_templates():
            print(f"wrote {path.relative_to(REPO)}")
        return 0
    if args.command == "run":
        return cmd_run(args)
    if args.command == "submit":
        from workflows.argo import submit

        return submit(args, lambda: build_workflow().to_dict())
    if args.command == "status":
        from workflows.argo import status

        return status(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
