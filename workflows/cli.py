"""The drill's command line: render, write-templates, run (here, through the local runner), submit and
status (an Argo server). `python workflows/equivalence.py ...` is its entry point.

This module holds the parser and `run`; `main` in workflows/equivalence.py runs the commands. It never
imports that module: `run` is given the workflow, as `submit` is, so that running the file executes it once
(as `__main__`) and no import goes in a circle (tests/workflow/test_cli_params.py checks both).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from steps.lib.contract import REPORT_FILES, REPORT_JSON, TASKS, TRAINING_TASKS, drill_root, report_root
from trainer.bounded import ArgParser, Bound
from trainer.untrusted import printable
from workflows.params import (
    default_retry_limit,
    number,
    parse_params,
    resolve_params,
    set_deadline,
    set_queue_label,
    values_of,
)

REPO = Path(__file__).resolve().parent.parent


def cmd_run(args: argparse.Namespace, build: Callable[[int], dict]) -> int:
    """`run`: the workflow that `build(nodes)` renders, on this machine."""
    from workflows.local import UnsupportedSpec, run_workflow

    out = Path(args.out).resolve()
    if out.exists() and any(out.iterdir()):
        if not args.force:
            raise SystemExit(f"error: {out} is not empty (use --force to clear it)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    local, rest = _local_params(args.param)
    chaos_n, chaos_seed = (
        int(local.get("chaos", "0")),
        int(local.get("chaos_seed", random.SystemRandom().randrange(2**31))),
    )
    overrides = parse_params(rest)
    if "trainer" in overrides:
        overrides["trainer"] = script_from_here(overrides["trainer"], Path.cwd())
    if "config" in overrides:
        overrides["config"] = config_from_here(overrides["config"], Path.cwd())
    if (
        chaos_n and "retry_limit" not in overrides
    ):  # room for every eviction and every chaos deletion, and more
        evictions = int(number(values_of(overrides), "evictions"))
        overrides["retry_limit"] = str(default_retry_limit(evictions, chaos_n))
    params = resolve_params(overrides)
    params.setdefault("bucket", f"file://{out}/bucket")
    params.setdefault(
        "store_port", "0"
    )  # every local pod is 127.0.0.1: a fixed port would clash between roles
    chaos = None
    if chaos_n:
        from workflows.local import Chaos

        chaos = Chaos(
            chaos_n,
            chaos_seed,
            list(TASKS),
            step_tasks=frozenset(TRAINING_TASKS),
            total_steps=int(values_of(params)["total_steps"]),
            long_tasks={"evict": 20.0},
        )
        print(
            f"chaos: {chaos_n} pod deletion(s), seed {chaos_seed} (-p chaos_seed={chaos_seed} repeats the plan)",
            file=sys.stderr,
        )
    spec = build(int(values_of(params)["nodes"]))
    set_queue_label(spec, values_of(params)["queue"])  # no local effect; the spec is what a cluster would get
    set_deadline(spec, values_of(params))
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    try:
        result = run_workflow(
            spec,
            out / "argo",
            params,
            cwd=REPO,
            env=env,
            progress=sys.stderr,
            chaos=chaos,
            unschedulable=frozenset(filter(None, local.get("unschedulable", "").split(","))),
        )
    except UnsupportedSpec as e:
        raise SystemExit(f"error: {e}") from None
    by_artifact = {f.replace(".", "-"): f for f in REPORT_FILES}
    for node in result.nodes:
        for name, path in node.artifacts.items():
            if name in by_artifact and path.is_file():
                shutil.copy(path, out / by_artifact[name])
    # A failed compare saves no artifacts here; its report is in the bucket all the same.
    bucket_report = Path(
        report_root(
            drill_root(params["bucket"].removeprefix("file://"), values_of(params)["prefix"], result.name)
        )
    )
    for f in REPORT_FILES:
        if not (out / f).exists() and (bucket_report / f).is_file():
            shutil.copy(bucket_report / f, out / f)
    report_path = out / REPORT_JSON
    if report_path.exists():
        report = json.loads(report_path.read_text())
        if result.chaos is not None:  # the runner's doing, not the workflow's: only this copy has it
            report["chaos"] = result.chaos
            report_path.write_text(json.dumps(report, indent=1, sort_keys=True, default=str))
        print(printable(drill_summary(report)))
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
    if (
        len(argv) > i
        and not argv[i].startswith("-")
        and not Path(argv[i]).is_absolute()
        and (cwd / argv[i]).is_file()
    ):
        argv[i] = str((cwd / argv[i]).resolve())
        return shlex.join(argv)
    return trainer


def config_from_here(config: str, cwd: Path) -> str:
    """`-p config=ft.yaml` as the caller means it, like `-p trainer`: a relative path is taken from the caller's
    folder and made absolute (the local pods run in baton's root). A config that does not exist there is
    an error naming it, before any pod starts."""
    path = Path(config)
    if path.is_absolute():
        if not path.is_file():
            raise SystemExit(f"error: -p config={config}: no such file")
        return config
    if (cwd / path).is_file():
        return str((cwd / path).resolve())
    raise SystemExit(
        f"error: -p config={config}: no such file in {cwd} (a relative path is taken from the "
        "folder you run from)"
    )


# `run` only: the local runner's own options, not workflow parameters (a cluster has its own chaos).
LOCAL_PARAMETERS = {
    "chaos": "pods to delete at random among every step of the drill, at random moments (workflows/local/chaos.py)",
    "chaos_seed": "the seed of those choices (default: drawn, and printed and recorded in report.json)",
    "unschedulable": "tasks (comma-separated) whose pods stay Pending, as on a cluster with no room for them: the "
    "drill then ends by its deadline (-p deadline=SECONDS)",
}

LOCAL_BOUNDS = {"chaos": Bound(0, 1000, integer=True), "chaos_seed": Bound(0, 2**63 - 1, integer=True)}


def _local_params(items: list[str]) -> tuple[dict[str, str], list[str]]:
    local, rest = {}, []
    for item in items:
        name, sep, value = item.partition("=")
        if sep and name in LOCAL_PARAMETERS:
            if name == "unschedulable":
                unknown = sorted(set(value.split(",")) - set(TASKS))
                if unknown:
                    raise SystemExit(
                        f"error: -p unschedulable: no task named {', '.join(unknown)} "
                        f"(tasks: {', '.join(TASKS)})"
                    )
            else:
                value = str(number({name: value}, name, LOCAL_BOUNDS[name]))
            local[name] = value
        else:
            rest.append(item)
    return local, rest


def parameters_help() -> str:
    """The -p parameters, for `run --help`: the workflow's (workflows/params.py, with their defaults) and the
    runner's own."""
    from workflows.params import PARAMETERS

    lines = ["workflow parameters (-p NAME=VALUE; default in brackets):"]
    for name, (default, help_text) in PARAMETERS.items():
        lines.append(f"  {name:<24} {help_text} [{default}]")
    lines.append("the local runner's own:")
    lines += [f"  {name:<24} {help_text}" for name, help_text in LOCAL_PARAMETERS.items()]
    return "\n".join(lines)


def drill_summary(report: dict[str, Any]) -> str:
    from steps.lib.report import summary

    return summary(report)


TARGET_HELP = (
    "the cluster to render for: an overlay of templates/overlays/ (default: $BATON_TARGET, which make "
    "cluster-up and make gke-up print; unset: the base Workflow, with no bucket credentials)"
)


def parser() -> argparse.ArgumentParser:
    """Every command's arguments; equivalence.main parses with it and runs the command."""
    ap = ArgParser(
        prog="python workflows/equivalence.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True)
    rd = sub.add_parser("render", help="print every object as a multi-document YAML stream")
    rd.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="parameter values to render (checked as for submit; -p queue=Q adds the Kueue label)",
    )
    rd.add_argument("--target", metavar="OVERLAY", help=TARGET_HELP)
    sub.add_parser("write-templates", help="regenerate templates/*.yaml")
    r = sub.add_parser(
        "run",
        help="run the rendered workflow on this machine",
        epilog=parameters_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("--out", default="out/drill", help="folder for the report, logs and the local bucket")
    r.add_argument("--force", action="store_true", help="clear --out first if it is not empty")
    r.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a workflow parameter, or one of the runner's own: chaos=N (delete N pods at random, "
        "workflows/local/chaos.py), chaos_seed=S",
    )
    from workflows.argo import add_server_arguments

    s = sub.add_parser("submit", help="submit the workflow to an Argo server (see workflows/argo.py)")
    s.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE")
    s.add_argument(
        "--from-file",
        metavar="FILE",
        help="submit the Workflow (or a CronWorkflow's workflowSpec) in FILE ('-': stdin) instead, "
        "e.g. from 'kubectl kustomize templates/overlays/kind'",
    )
    s.add_argument("--target", metavar="OVERLAY", help=TARGET_HELP)
    add_server_arguments(s)
    st = sub.add_parser("status", help="a submitted drill's nodes beside its checkpoint store")
    st.add_argument("name", help="the workflow's name, as submit printed it")
    add_server_arguments(st)
    return ap
