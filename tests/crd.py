"""Validate rendered objects against Argo's CRD openAPIV3Schema (the release every cluster path installs,
infra/local/versions.env, and FORWARD, the next major release, as a forward check), as the API server would:
int-or-string accepts both, preserve-unknown-fields accepts anything, and every other object
rejects unknown fields (kubectl's strict field validation)."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from infra.local.pins import ARGO_VERSION, KUEUE_VERSION

# Vendored in the repository (tests/argo/README.md, tests/kueue/README.md: source, version, license): a
# clone stands alone.
ARGO = Path(__file__).resolve().parent / "argo"
FORWARD = "v4.1.2"
"""Argo's v4 release: validated against (its CRDs in tests/argo/), never installed or run. The proven release is
ARGO_VERSION, whose CRDs are in tests/argo/ARGO_VERSION/ (a bumped pin without them fails here)."""
ARGO_VERSIONS = {FORWARD: ARGO, ARGO_VERSION: ARGO / ARGO_VERSION}  # each folder's README: source and license
CRD_FILES = {"Workflow": "crd-workflows.yaml", "CronWorkflow": "crd-cronworkflows.yaml"}
KUEUE = Path(__file__).resolve().parent / "kueue"
KUEUE_CRD_FILES = {
    "ClusterQueue": "crd-clusterqueues.yaml",
    "LocalQueue": "crd-localqueues.yaml",
    "ResourceFlavor": "crd-resourceflavors.yaml",
}


def _load(text: str) -> Any:
    """YAML through libyaml where PyYAML has it: a CRD is megabytes, 13 s in pure Python, about 1 s in C."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items() if not k.startswith("x-kubernetes-validations")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        node.get("type") == "object"
        and "properties" in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
        and "additionalProperties" not in node
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schema(kind: str, version: str = FORWARD) -> dict[str, Any]:
    crd = _load((ARGO_VERSIONS[version] / CRD_FILES[kind]).read_text())
    schema = copy.deepcopy(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    # The API server fills metadata itself; its schema here is a bare object.
    return _strict(schema)


@functools.cache
def kueue_schema(kind: str, version: str) -> dict[str, Any]:
    crd = _load((KUEUE / KUEUE_CRD_FILES[kind]).read_text())
    served = {v["name"]: v for v in crd["spec"]["versions"] if v.get("served")}
    assert version in served, (
        f"Kueue {KUEUE_VERSION} does not serve {kind} {version} (it serves {sorted(served)})"
    )
    schema = copy.deepcopy(served[version]["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    return _strict(schema)


def validate_kueue(obj: dict[str, Any]) -> None:
    """A Kueue object against the vendored CRD, at the version its apiVersion names, strictly."""
    group, _, version = obj["apiVersion"].partition("/")
    assert group == "kueue.x-k8s.io", obj["apiVersion"]
    jsonschema.validate(obj, kueue_schema(obj["kind"], version), cls=jsonschema.Draft7Validator)


def validate(obj: dict[str, Any], version: str = FORWARD) -> None:
    """Raise jsonschema.ValidationError on the first problem, against Argo `version`'s CRD."""
    assert obj.get("apiVersion") == "argoproj.io/v1alpha1", obj.get("apiVersion")
    _validator(obj["kind"], version).validate(obj)


@functools.cache
def _validator(kind: str, version: str) -> jsonschema.Draft7Validator:
    """Built once per kind and release: jsonschema.validate checks the (megabytes of) schema itself on
    every call, which costs about a second each."""
    schema = crd_schema(kind, version)
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)
