"""The overlays a cluster gets, built without one: templates/ copied aside, with the gke overlays' cluster values
generated from recorded Terraform outputs by the generator `make gke-up` runs (infra/scripts/cluster_overlay.py)."""

from __future__ import annotations

import atexit
import functools
import importlib.util
import shutil
import tempfile
from pathlib import Path
from types import ModuleType

from tests.helpers import REPO

TERRAFORM_OUTPUT = REPO / "tests" / "fixtures" / "terraform-output.json"  # recorded `terraform output -json`
CLUSTER_IMAGE = "us-central1-docker.pkg.dev/acme-ml-42/baton/baton:abc123-cuda"


def cluster_overlay() -> ModuleType:
    """infra/scripts/cluster_overlay.py, the generator make gke-up runs (a script, not a package)."""
    spec = importlib.util.spec_from_file_location(
        "cluster_overlay", REPO / "infra" / "scripts" / "cluster_overlay.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def generated_templates() -> Path:
    """A copy of templates/ whose gke overlays hold the generated cluster values (removed at exit)."""
    gen = cluster_overlay()
    root = Path(tempfile.mkdtemp(prefix="baton-overlays-"))
    atexit.register(shutil.rmtree, root, True)
    shutil.copytree(REPO / "templates", root / "templates", ignore=shutil.ignore_patterns(gen.FOLDER))
    gen.write(
        root / "templates" / "overlays" / "gke" / gen.FOLDER, gen.outputs(TERRAFORM_OUTPUT), CLUSTER_IMAGE
    )
    return root / "templates"


def overlays() -> Path:
    return generated_templates() / "overlays"
