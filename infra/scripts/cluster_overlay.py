#!/usr/bin/env python3
"""Write the gke overlays' cluster values, from Terraform's outputs: the kustomize Component
`templates/overlays/gke/generated-by-make-gke-up/` (git-ignored), which the committed gke and gke-kueue
overlays include. Without it they do not build (kustomize names the missing folder), so nothing with a
placeholder can be applied.

    terraform -chdir=infra/gke output -json > tf.json
    python3 infra/scripts/cluster_overlay.py tf.json --image IMAGE [--out DIR]

It holds: the KSA's Workload Identity annotation (`gsa_email`), Argo's artifact repository in the drill's
bucket (`bucket`), and the nightly CronWorkflow's `bucket` and `image` parameters. A second Component,
`templates/overlays/gke-kueue/generated-by-make-gke-up/`, scales the Kueue ClusterQueue's GPU-pool quotas
by Terraform's `drill_nodes` (pods per role of the largest drill; 1 when the output is absent). `make gke-up` runs it
and then `kubectl apply -k`; running it again writes the same files (idempotent). Python's standard
library only: every file is JSON, which YAML (and kustomize) reads as it is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDER = "generated-by-make-gke-up"
DEFAULT_OUT = REPO / "templates" / "overlays" / "gke" / FOLDER
KUEUE_OUT = REPO / "templates" / "overlays" / "gke-kueue" / FOLDER
CLUSTER_QUEUE = "baton"
# templates/components/kueue/kueue.yaml's quota for one node per role, by flavor (its index there) and
# resource: (flavor index, flavor, [(resource index, resource, quota for one node, unit)]). A drill of N nodes
# per role holds N times as many training pods; the system flavor (evict, verify, compare) stays.
ONE_NODE_QUOTA = (
    (0, "baton-spot-gpu", ((0, "cpu", 13, ""), (1, "memory", 50, "Gi"), (2, "nvidia.com/gpu", 3, ""))),
    (1, "baton-on-demand-gpu", ((0, "cpu", 9, ""), (1, "memory", 34, "Gi"), (2, "nvidia.com/gpu", 2, ""))),
)
CRON = "baton-equivalence-nightly"
KSA = "baton-drill"
# The CronWorkflow's parameters by position (workflows/params.py keeps the order; a `test` op pins each).
BUCKET_INDEX, IMAGE_INDEX = 10, 12
REQUIRED = ("bucket", "bucket_url", "gsa_email", "namespace", "ksa_name")


def outputs(path: Path) -> dict[str, str]:
    """`terraform output -json`: {name: {"value": ..., "type": ..., "sensitive": ...}} -> {name: value}."""
    raw = json.loads(path.read_text())
    values = {k: v["value"] if isinstance(v, dict) and "value" in v else v for k, v in raw.items()}
    values.setdefault("drill_nodes", 1)
    if (
        isinstance(values["drill_nodes"], bool)
        or not isinstance(values["drill_nodes"], int)
        or values["drill_nodes"] < 1
    ):
        raise SystemExit(
            f"error: {path}: Terraform output drill_nodes must be a whole number >= 1, "
            f"got {values['drill_nodes']!r}"
        )
    missing = [k for k in REQUIRED if not values.get(k)]
    if missing:
        raise SystemExit(
            f"error: {path}: Terraform outputs {', '.join(missing)} are missing (run `terraform apply` "
            "in infra/gke, or `make gke-up`)"
        )
    if values["namespace"] != "baton" or values["ksa_name"] != KSA:
        raise SystemExit(
            f"error: the overlays are written for namespace baton and KSA {KSA}; Terraform has "
            f"{values['namespace']}/{values['ksa_name']}"
        )
    return values


def files(values: dict[str, str], image: str) -> dict[str, object]:
    bucket, bucket_url = values["bucket"], values["bucket_url"]
    artifact_repository = (
        f"archiveLogs: true\ngcs:\n  bucket: {bucket}\n"
        '  keyFormat: "argo/{{workflow.name}}/{{pod.name}}"\n'
    )
    return {
        "kustomization.yaml": {
            "apiVersion": "kustomize.config.k8s.io/v1alpha1",
            "kind": "Component",
            "resources": ["artifact-repositories.yaml"],
            "patches": [
                {"path": "service-account.yaml"},
                {
                    "path": "drill-values.yaml",
                    "target": {"group": "argoproj.io", "kind": "CronWorkflow", "name": CRON},
                },
            ],
        },
        # Argo's artifact repository for namespace baton: compare's report artifacts go to the bucket; the
        # executor authenticates as the pod's KSA, i.e. the Google service account (Workload Identity).
        "artifact-repositories.yaml": {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "artifact-repositories",
                "namespace": "baton",
                "labels": {"app.kubernetes.io/part-of": "baton"},
                "annotations": {"workflows.argoproj.io/default-artifact-repository": "default-v1"},
            },
            "data": {"default-v1": artifact_repository},
        },
        "service-account.yaml": {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {
                "name": KSA,
                "namespace": "baton",
                "annotations": {"iam.gke.io/gcp-service-account": values["gsa_email"]},
            },
        },
        "drill-values.yaml": [
            {
                "op": "test",
                "path": f"/spec/workflowSpec/arguments/parameters/{BUCKET_INDEX}/name",
                "value": "bucket",
            },
            {
                "op": "replace",
                "path": f"/spec/workflowSpec/arguments/parameters/{BUCKET_INDEX}/value",
                "value": bucket_url,
            },
            {
                "op": "test",
                "path": f"/spec/workflowSpec/arguments/parameters/{IMAGE_INDEX}/name",
                "value": "image",
            },
            {
                "op": "replace",
                "path": f"/spec/workflowSpec/arguments/parameters/{IMAGE_INDEX}/value",
                "value": image,
            },
        ],
    }


def kueue_files(nodes: int) -> dict[str, object]:
    """The ClusterQueue's GPU quotas for `nodes` pods per role: each `test`ed against kueue.yaml's one-node
    value first, so that a change there stops the build instead of being scaled from a stale number."""
    ops: list[dict[str, object]] = []
    for fi, flavor, resources in ONE_NODE_QUOTA:
        ops.append({"op": "test", "path": f"/spec/resourceGroups/0/flavors/{fi}/name", "value": flavor})
        for ri, resource, one, unit in resources:
            at = f"/spec/resourceGroups/0/flavors/{fi}/resources/{ri}"
            ops += [
                {"op": "test", "path": f"{at}/name", "value": resource},
                {"op": "test", "path": f"{at}/nominalQuota", "value": f"{one}{unit}"},
                {"op": "replace", "path": f"{at}/nominalQuota", "value": f"{one * nodes}{unit}"},
            ]
    return {
        "kustomization.yaml": {
            "apiVersion": "kustomize.config.k8s.io/v1alpha1",
            "kind": "Component",
            "patches": [
                {
                    "path": "quota.yaml",
                    "target": {"group": "kueue.x-k8s.io", "kind": "ClusterQueue", "name": CLUSTER_QUEUE},
                }
            ],
        },
        "quota.yaml": ops,
    }


def write(out: Path, values: dict[str, str], image: str, kueue_out: Path | None = None) -> list[Path]:
    """The gke overlay's Component in `out`, and the gke-kueue overlay's in `kueue_out` (default: beside it)."""
    header = "# Written by infra/scripts/cluster_overlay.py (make gke-up) from Terraform's outputs; not committed.\n"
    written = []
    kueue_out = kueue_out or out.parent.parent / "gke-kueue" / FOLDER
    for folder, bodies in ((out, files(values, image)), (kueue_out, kueue_files(int(values["drill_nodes"])))):
        folder.mkdir(parents=True, exist_ok=True)
        for name, body in bodies.items():
            path = folder / name
            path.write_text(header + json.dumps(body, indent=1) + "\n")
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="cluster_overlay.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "terraform_output", type=Path, help="`terraform output -json` of infra/gke, saved to a file"
    )
    ap.add_argument("--image", required=True, help="the drill's image (the CUDA image gke-up pushed)")
    ap.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"the Component folder (default: {DEFAULT_OUT})"
    )
    ap.add_argument(
        "--kueue-out",
        type=Path,
        default=None,
        help=f"the gke-kueue overlay's Component folder (default: {KUEUE_OUT.relative_to(REPO)}, "
        "beside --out)",
    )
    args = ap.parse_args(argv)
    for path in write(args.out, outputs(args.terraform_output), args.image, args.kueue_out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
