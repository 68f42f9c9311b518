"""The pinned versions, read from their one home: infra/local/versions.env (Kubernetes, etcd, Argo: the local
control plane, and the Argo release every cluster path installs) and infra/local/kueue.env (Kueue, JobSet).
Both are shell files that build.sh, build-kueue.sh and infra/scripts/lib.sh source; the Python that needs a
version reads it here. tests/unit/test_pins.py fails when a version appears anywhere else in code."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
HOMES = (HERE / "versions.env", HERE / "kueue.env")


def read(path: Path) -> dict[str, str]:
    """`NAME=value` assignments of a sourced env file (no quoting or expansion in these files: a value with
    either is refused, so that bash and this reader cannot read two different values)."""
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.isidentifier() or any(c in value for c in "\"'$`\\ #"):
            raise ValueError(f"{path}:{n}: expected NAME=value with a plain value, got {line!r}")
        out[name] = value
    return out


PINS: dict[str, str] = {k: v for home in HOMES for k, v in read(home).items()}
K8S_VERSION = PINS["K8S_VERSION"]
ETCD_VERSION = PINS["ETCD_VERSION"]
ARGO_VERSION = PINS["ARGO_VERSION"]
KUEUE_VERSION = PINS["KUEUE_VERSION"]
JOBSET_VERSION = PINS["JOBSET_VERSION"]
VERSIONS = {k: v for k, v in PINS.items() if k.endswith("_VERSION")}
"""Every pinned version by name: what no other file may spell out."""
