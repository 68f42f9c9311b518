#!/usr/bin/env python3
"""Argo's install manifest for the pinned release (infra/local/versions.env), as the release makes it: the
one file `make gke-up` and `make e2e-kind` apply (infra/argo/install.yaml, committed; its digest pinned as
ARGO_INSTALL_SHA256 beside the version).

    python3 -m infra.scripts.argo_install check [MANIFESTS]   render again and compare, byte for byte
    python3 -m infra.scripts.argo_install write [MANIFESTS]   render into infra/argo/install.yaml

MANIFESTS is the `manifests/` folder of the release's Go module, which infra/local/build.sh verifies (its
h1: hashes and the tag's commit) and keeps in its cache as argo-manifests/ (the default). The recipe is the
release's own (Argo's Makefile, `make manifests VERSION=...`, run by .github/workflows/release.yaml):

    kubectl kustomize --load-restrictor=LoadRestrictionsNone manifests/cluster-install \\
      | hack/manifests/auto-gen-msg.sh | sed 's/:latest/:VERSION/'

Why not download the published asset: this machine cannot reach github.com, so its digest was never read
here (docs/cluster.md). The sources are the release's, checked by hash; the rendering is kubectl's kustomize.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

from infra.local.pins import ARGO_VERSION, PINS

REPO = Path(__file__).resolve().parents[2]


INSTALL = REPO / "infra" / "argo" / "install.yaml"
HEADER = "# This is an auto-generated file. DO NOT EDIT\n"  # hack/manifests/auto-gen-msg.sh's one line
_LATEST = re.compile(r":latest")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def default_manifests() -> Path:
    built = subprocess.run(
        ["bash", str(REPO / "infra" / "local" / "build.sh"), "--print-dir"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(built.stdout.strip()) / "argo-manifests"


def render(manifests: Path) -> bytes:
    """The release's install.yaml from its `manifests/` folder."""
    if not (manifests / "cluster-install" / "kustomization.yaml").is_file():
        raise SystemExit(
            f"error: {manifests} is not Argo's manifests/ folder (no cluster-install/kustomization.yaml); "
            "build it with `make cluster-build`"
        )
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise SystemExit("error: kubectl is not on PATH (its kustomize renders the manifest)")
    out = subprocess.run(
        [kubectl, "kustomize", "--load-restrictor=LoadRestrictionsNone", str(manifests / "cluster-install")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode != 0:
        raise SystemExit(
            f"error: kubectl kustomize {manifests / 'cluster-install'}: {out.stderr.strip()[-300:]}"
        )
    # sed 's/:latest/:VERSION/' replaces the first match on each line.
    lines = [_LATEST.sub(f":{ARGO_VERSION}", line, count=1) for line in out.stdout.splitlines(keepends=True)]
    return (HEADER + "".join(lines)).encode()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m infra.scripts.argo_install", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("command", choices=["check", "write"])
    ap.add_argument(
        "manifests", nargs="?", type=Path, help="Argo's manifests/ folder (default: the build cache's)"
    )
    args = ap.parse_args(argv)
    fresh = render(args.manifests or default_manifests())
    pinned = PINS["ARGO_INSTALL_SHA256"]
    if args.command == "write":
        INSTALL.write_bytes(fresh)
        print(
            f"wrote {INSTALL.relative_to(REPO)}: sha256 {digest(fresh)}"
            + (
                ""
                if digest(fresh) == pinned
                else f"; pin it as ARGO_INSTALL_SHA256 in infra/local/versions.env (it says {pinned})"
            )
        )
        return 0
    committed = INSTALL.read_bytes()
    problems = []
    if committed != fresh:
        problems.append(
            f"{INSTALL.relative_to(REPO)} is not the render of Argo {ARGO_VERSION}'s manifests "
            f"(sha256 {digest(committed)}, the render's {digest(fresh)}); run: {ap.prog} write"
        )
    if digest(committed) != pinned:
        problems.append(
            f"ARGO_INSTALL_SHA256 in infra/local/versions.env is {pinned}, the file's is {digest(committed)}"
        )
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if not problems:
        print(f"{INSTALL.relative_to(REPO)}: Argo {ARGO_VERSION}'s install manifest, sha256 {pinned}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
