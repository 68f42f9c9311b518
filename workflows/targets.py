"""Which cluster a rendered or submitted drill is for: a target names an overlay under templates/overlays/ (local,
local-kueue, kind, gke, gke-kueue), which gives the drill that cluster's bucket, its credentials and its image.

    BATON_TARGET=local python workflows/equivalence.py submit      (or --target local)

`make cluster-up` and `make gke-up` print the line that sets it. Unset, `render` and `submit` use the base
Workflow, which names no bucket credentials: on a cluster its steps cannot reach the bucket, so `submit` says so
in one line. `--from-file` takes the Workflow from a file instead, and then no target applies.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from trainer import env

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "templates"
OVERLAYS = TEMPLATES / "overlays"
TARGET_ENV = "BATON_TARGET"
KUSTOMIZE_TIMEOUT_S = 120


class TargetError(SystemExit):
    """A target that cannot be used, said in one line (exit 1)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"error: {message}")


def targets() -> list[str]:
    """The overlays: each folder of templates/overlays/ with a kustomization.yaml."""
    return sorted(p.name for p in OVERLAYS.iterdir() if (p / "kustomization.yaml").is_file())


def chosen(flag: str | None) -> str | None:
    """`--target`, else BATON_TARGET, else None; a name that is no overlay is refused, naming where it came from."""
    where, value = ("--target", flag) if flag else (TARGET_ENV, env.text(TARGET_ENV))
    if not value:
        return None
    if value not in targets():
        raise TargetError(
            f"{where} {value!r} is not a target; the targets are the overlays in templates/overlays/: "
            f"{', '.join(targets())}"
        )
    return value


def announce(target: str | None, flag: str | None) -> str:
    """The one line that says which cluster the drill was rendered for (stderr: stdout is the command's own)."""
    if target is None:
        return (
            f"target: none ({TARGET_ENV} unset): the base Workflow, whose steps get no bucket credentials on a "
            f"cluster; set {TARGET_ENV} to one of {', '.join(targets())}, as `make cluster-up` and `make gke-up` "
            "print it"
        )
    return f"target: {target} ({'--target' if flag else TARGET_ENV}): templates/overlays/{target}"


def overlay_objects(target: str, write_base: Callable[[Path], Any]) -> list[dict[str, Any]]:
    """Every object of overlay `target`, built by kubectl's kustomize from a copy of templates/ whose base files
    `write_base(folder)` wrote (the drill's shape follows -p nodes, so the committed one-node base may not do)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise TargetError(
            f"target {target}: kubectl is not on PATH (its kustomize builds templates/overlays/{target})"
        )
    missing = _missing(OVERLAYS / target)
    if missing:
        raise TargetError(
            f"target {target}: {missing.relative_to(REPO)} is missing (a gke overlay's cluster values: "
            "make gke-up writes them from Terraform's outputs, infra/scripts/cluster_overlay.py)"
        )
    with tempfile.TemporaryDirectory(prefix="baton-render-") as tmp:
        tree = Path(tmp) / "templates"
        shutil.copytree(TEMPLATES, tree, symlinks=True)  # generated Components (make gke-up's) come along
        write_base(tree)
        try:
            built = subprocess.run(
                [kubectl, "kustomize", str(tree / "overlays" / target)],
                capture_output=True,
                text=True,
                timeout=KUSTOMIZE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise TargetError(
                f"target {target}: kubectl kustomize did not finish in {KUSTOMIZE_TIMEOUT_S} s"
            ) from None
    if built.returncode != 0:
        why = " ".join(built.stderr.replace(str(tree), "templates").split())[-400:]
        raise TargetError(f"target {target}: kubectl kustomize templates/overlays/{target} failed: {why}")
    return [d for d in yaml.safe_load_all(built.stdout) if isinstance(d, dict)]


def _missing(folder: Path, seen: frozenset[Path] = frozenset()) -> Path | None:
    """The first folder that the kustomization in `folder` (or one it includes) lists and that is not there."""
    if folder in seen:
        return None
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text()) or {}
    for entry in [*(spec.get("resources") or []), *(spec.get("components") or [])]:
        path = (folder / entry).resolve()
        if not path.exists():
            return path
        if path.is_dir() and (path / "kustomization.yaml").is_file():
            found = _missing(path, seen | {folder})
            if found:
                return found
    return None


def for_target(target: str, workflow: dict[str, Any], objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The drill's Workflow and CronWorkflow as overlay `target` has them: the overlays patch the nightly
    CronWorkflow, and the one-off Workflow (the base's, whose spec is the CronWorkflow's workflowSpec) takes its
    spec and namespace from there."""
    crons = [
        d
        for d in objects
        if d.get("kind") == "CronWorkflow" and d.get("apiVersion") == "argoproj.io/v1alpha1"
    ]
    if len(crons) != 1:
        raise TargetError(f"target {target}: the overlay holds {len(crons)} CronWorkflows, not one")
    cron = crons[0]
    wf = {**workflow, "metadata": dict(workflow.get("metadata") or {}), "spec": cron["spec"]["workflowSpec"]}
    if (cron.get("metadata") or {}).get("namespace"):
        wf["metadata"]["namespace"] = cron["metadata"]["namespace"]
    return [wf, cron]
