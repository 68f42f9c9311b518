"""The equivalence drill as an Argo Workflow, written with Hera, and its command line.

    python workflows/equivalence.py render                  every object, as a multi-document YAML stream
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

NAME = "baton-equivalence"
SERVICE_ACCOUNT = "baton-drill"
# The overlays ship this ConfigMap (MinIO on kind, GCS on GKE): compare's output artifacts need a repository.
ARTIFACT_REPOSITORY = ("artifact-repositories", "default-v1")
RETRY_EXPRESSION = "asInt(lastRetry.exitCode) == 75 || lastRetry.message matches 'imminent node shutdown|pod deleted'"
REPORT_DIR = "/tmp/baton-report/{{workflow.name}}"
REPORT_FILES = ("report.json", "report.md", "loss.png")
# Numbers that compare writes to <out>/metrics/<name>, exposed as Prometheus gauges (-1: not measured).
COMPARE_METRICS = {
    "replayed_steps": "Steps the last drill's trial trained twice (0 when resume lost nothing)",
    "max_save_ms": "Slowest preemption save of the last drill's trial, in milliseconds",
    "min_grace_left_s": "Least grace left after a preemption save in the last drill's trial, in seconds",
}

# name -> (default, description). The order is the order users see in the Argo UI.
PARAMETERS: dict[str, tuple[str, str]] = {
    "config": ("trainer/configs/tiny.yaml", "trainer config file, inside the image"),
    "total_steps": ("200", "optimizer steps of every run"),
    "evictions": ("3", "evictions of the trial"),
    "retry_limit": ("8", "retries of the trial; must exceed evictions (the CLI sets evictions + 5)"),
    "seed": ("0", "training seed, and the seed of the eviction jitter"),
    "jitter": ("false", "true: eviction points jittered inside their bands"),
    "dropout": ("0.1", "attention dropout, so that a lost RNG state cannot hide"),
    "every_steps": ("10", "periodic checkpoint interval, in steps"),
    "grace": ("30", "seconds between SIGTERM and SIGKILL: pod grace, BATON_GRACE, torchrun --shutdown-timeout"),
    "ranks": ("1", "ranks per pod (torchrun --nproc-per-node)"),
    "bucket": ("s3://baton-drills", "checkpoint and evidence store (file://, s3://, gs://)"),
    "prefix": ("drills", "prefix under the bucket; each drill writes under <bucket>/<prefix>/<workflow name>"),
    "image": ("baton:cpu", "container image for every step"),
    "disable_sigterm_handler": ("0", "1: the trial ignores its SIGTERM handler (the drill's negative control)"),
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
            "--config", p("config"), "--evidence", f"{EVIDENCE}/{role}",
            "--set", f"checkpoint.uri={ROOT}/{role}",
            "--set", f"total_steps={p('total_steps')}",
            "--set", f"seed={p('seed')}",
            "--set", f"model.dropout={p('dropout')}",
            "--set", f"checkpoint.every_steps={p('every_steps')}"]


def _define_dag() -> None:
    """Templates and the DAG, inside an active Workflow or CronWorkflow context."""
    from hera.workflows import Gauge, NoneArchiveStrategy

    # Prometheus metrics (Argo prefixes `argo_workflows_`), gauges only: Argo may evaluate a finished node's
    # metrics on more than one path, which a gauge's Set survives and a counter would count twice.
    # `{{retries}}` exists only on the retry node, whose status is Succeeded only once the trial is done.
    done = "{{status}} == Succeeded"
    passed_help = "1 if the last equivalence drill passed (every step succeeded), 0 if it did not"
    common: dict[str, Any] = dict(image=p("image"), command=["python"], pod_spec_patch=GRACE_PATCH)
    train = Container(name="train", inputs=[Parameter(name="role")], args=_train_args("{{inputs.parameters.role}}"),
                      env=[Env(name="BATON_GRACE", value=p("grace")), _pod_name_env()], **common)
    trial = Container(
        name="trial", args=_train_args("trial"),
        env=[Env(name="BATON_GRACE", value=p("grace")), _pod_name_env(),
             Env(name="BATON_DISABLE_SIGTERM_HANDLER", value=p("disable_sigterm_handler"))],
        retry_strategy=RetryStrategy(retry_policy="Always", limit=p("retry_limit"), expression=RETRY_EXPRESSION),
        metrics=[Gauge(name="baton_drill_trial_retries", value="{{retries}}", when=done, realtime=False,
                       help="Retries the last successful drill's trial took: one per eviction it came back from"),
                 Gauge(name="baton_drill_trial_seconds", value="{{duration}}", when=done, realtime=False,
                       help="Wall time of the last successful drill's trial, every attempt and restart included")],
        **common)
    evict = Container(name="evict", image=p("image"), command=["python"],
                      args=["-m", "steps.evict", "--evidence", f"{EVIDENCE}/trial",
                            "--total-steps", p("total_steps"), "--evictions", p("evictions"),
                            "--seed", p("seed"), "--jitter", p("jitter"), "--workflow", "{{workflow.name}}",
                            "--out", f"{ROOT}/evictions.json"])
    verify = Container(name="verify", image=p("image"), command=["python"],
                       args=["-m", "steps.verify", "--evidence", f"{EVIDENCE}/trial",
                             "--total-steps", p("total_steps"), "--evictions", f"{ROOT}/evictions.json",
                             "--out", f"{ROOT}/verify.json", "--no-fail"])
    compare = Container(
        name="compare", image=p("image"), command=["python"],
        args=["-m", "steps.compare", "--reference", f"{ROOT}/reference", "--replay", f"{ROOT}/replay",
              "--trial", f"{ROOT}/trial", "--evidence", EVIDENCE, "--verify", f"{ROOT}/verify.json",
              "--evictions", f"{ROOT}/evictions.json", "--total-steps", p("total_steps"),
              "--out", REPORT_DIR, "--report-uri", f"{ROOT}/report"],
        # Not archived: the Argo UI shows report.md and loss.png as they are.
        outputs=[Artifact(name=f.replace(".", "-"), path=f"{REPORT_DIR}/{f}", archive=NoneArchiveStrategy())
                 for f in REPORT_FILES]
        + [Parameter(name=name, value_from=m.ValueFrom(path=f"{REPORT_DIR}/metrics/{name}", default="-1"))
           for name in COMPARE_METRICS],
        metrics=[Gauge(name=f"baton_drill_{name}", value="{{outputs.parameters." + name + "}}", realtime=False,
                       help=help_) for name, help_ in COMPARE_METRICS.items()])
    with DAG(name="drill", metrics=[
            Gauge(name="baton_drill_passed", value="1", when=done, realtime=False, help=passed_help),
            Gauge(name="baton_drill_passed", value="0", when="{{status}} != Succeeded", realtime=False,
                  help=passed_help),
            Gauge(name="baton_drill_seconds", value="{{duration}}", realtime=False,
                  help="Wall time of the last equivalence drill, from its first step to its last")]):
        # Plain `dependencies` (every one must succeed), not `depends` expressions: the simplest
        # semantics, and the one the local runner implements.
        train(name="reference", arguments={"role": "reference"})
        train(name="reference-replay", arguments={"role": "replay"})
        trial(name="trial")
        evict(name="evict")
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


# ---- parameters --------------------------------------------------------------------------------------

def parse_params(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"error: -p {item!r}: expected name=value")
        if name not in PARAMETERS:
            raise SystemExit(f"error: -p {name}: unknown parameter (known: {', '.join(PARAMETERS)})")
        out[name] = value
    return out


def values_of(params: dict[str, str]) -> dict[str, str]:
    """Every parameter's value: the defaults with `params` over them."""
    return {k: v for k, (v, _) in PARAMETERS.items()} | params


def resolve_params(overrides: dict[str, str]) -> dict[str, str]:
    """Overrides, plus a retry limit that follows the evictions; checked before anything runs."""
    params = dict(overrides)
    values = values_of(params)
    for k in ("total_steps", "evictions", "retry_limit", "seed", "grace", "ranks", "every_steps"):
        try:
            int(values[k])
        except ValueError:
            raise SystemExit(f"error: parameter {k} must be an integer, got {values[k]!r}") from None
    if "retry_limit" not in params:
        params["retry_limit"] = str(int(values["evictions"]) + 5)
        values["retry_limit"] = params["retry_limit"]
    if int(values["retry_limit"]) <= int(values["evictions"]):
        raise SystemExit(f"error: retry_limit ({values['retry_limit']}) must exceed evictions ({values['evictions']})")
    from steps.evict import eviction_points

    try:
        eviction_points(int(values["total_steps"]), int(values["evictions"]))
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    return params


# ---- commands ----------------------------------------------------------------------------------------

def cmd_run(args: argparse.Namespace) -> int:
    from workflows.local import UnsupportedSpec, run_workflow

    out = Path(args.out).resolve()
    if out.exists() and any(out.iterdir()):
        if not args.force:
            raise SystemExit(f"error: {out} is not empty (use --force to clear it)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    params = resolve_params(parse_params(args.param))
    params.setdefault("bucket", f"file://{out}/bucket")
    spec = build_workflow().to_dict()
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    try:
        result = run_workflow(spec, out / "argo", params, cwd=REPO, env=env, progress=sys.stderr)
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
        print(drill_summary(report))
    else:
        print(f"no report: the workflow ended {result.phase}; logs in {out / 'argo' / 'logs'}")
    print(f"workflow {result.phase}; report and logs in {out}")
    return 0 if result.phase == "Succeeded" else 1


def drill_summary(report: dict[str, Any]) -> str:
    s = report["steps"]
    lines = [f"step records {s['total']} total, {s['distinct']} distinct",
             f"resumed from {s['resumed_from']}",
             f"replayed {s['replayed']} steps",
             f"preemptions {s['preemptions']}"]
    for pr in report.get("preempt", []):
        lines.append(f"  step {pr['step']}: save {pr['save_ms']} ms, grace left {pr['grace_left_s']} s, "
                     f"exit {pr['exit']}")
    for problem in report.get("verify_problems", []):
        lines.append(f"problem: {problem}")
    if report["tier"] == 1:
        lines.append(f"bit-identical: {report['tensors']} tensors" if report["equivalent"] else
                     f"NOT bit-identical: {report.get('equal_tensors', 0)}/{report['tensors']} tensors equal, "
                     f"max |diff| {report['max_abs_diff']:.3g}")
    else:
        lines.append(f"tier 2: max |diff| {report['max_abs_diff']:.3g} against a floor of {report['floor']:.3g}: "
                     + ("within the floor" if report["equivalent"] else "ABOVE the floor"))
    lines.append("drill PASSED" if report.get("passed") else "drill FAILED")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python workflows/equivalence.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("render", help="print every object as a multi-document YAML stream")
    sub.add_parser("write-templates", help="regenerate templates/*.yaml")
    r = sub.add_parser("run", help="run the rendered workflow on this machine")
    r.add_argument("--out", default="out/drill", help="folder for the report, logs and the local bucket")
    r.add_argument("--force", action="store_true", help="clear --out first if it is not empty")
    r.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE")
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
        sys.stdout.write(to_yaml(rendered()))
        return 0
    if args.command == "write-templates":
        for path in write_templates():
            print(f"wrote {path.relative_to(REPO)}")
        return 0
    if args.command == "run":
        return cmd_run(args)
    if args.command == "submit":
        from workflows.argo import submit

        return submit(args)
    if args.command == "status":
        from workflows.argo import status

        return status(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
