"""Each pinned version has one home: Kubernetes, etcd and Argo in infra/local/versions.env, Kueue and JobSet in
infra/local/kueue.env (read by infra/local/pins.py and by the scripts that source them), the forward-checked
Argo release in tests/crd.py, and torch in pyproject.toml (the Makefile reads it there). No other file of the repository's code spells one out.

The check reads each file's syntax, so that prose never counts and code always does: Python's string
constants (docstrings left out), the words of shell, env, Makefile and Dockerfile lines (comments left out, as
the shell drops them), and the scalars of YAML, JSON, TOML and Terraform. The two go.mod files must name the
pinned versions in Go's own syntax (Go cannot read versions.env), and they are checked to agree instead.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hcl2
import pytest
import yaml

from infra.local import pins
from tests.crd import FORWARD
from tests.helpers import REPO

_DEPENDENCIES = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
TORCH = next(d.split("==", 1)[1].strip() for d in _DEPENDENCIES if re.match(r"torch\s*==", d))
"""torch's pin, whose home is pyproject.toml: the Makefile reads it there; the Dockerfile's default for a bare
`docker build` and the house rule's own check (tests/unit/test_infra.py) are checked to agree with it."""
HOMES = {
    **{name: {home.relative_to(REPO).as_posix() for home in pins.HOMES} for name in pins.VERSIONS},
    "FORWARD": {"tests/crd.py"},
    "TORCH": {"pyproject.toml", "Dockerfile", "tests/unit/test_infra.py"},
}
SPELLINGS = {**pins.VERSIONS, "FORWARD": FORWARD, "TORCH": TORCH}
# Not the repository's code: vendored trees and recordings keep their sources' own words, prose may name a
# version (it says where the pin lives), and the install manifest is the release's, checked against the pin by
# tests/unit/test_infra.py.
NOT_CODE = (
    "infra/local/argo-ui/",
    "tests/argo/",
    "tests/kueue/",
    "tests/workflow/fixtures/",
    "docs/gpu/",
    "infra/argo/install.yaml",
    "infra/local/etcd/main.go",
)
PROSE = (".md", ".txt", ".png", ".log", ".sum", ".gitignore", ".dockerignore")
GO_MOD = {"infra/local/kube/go.mod", "infra/local/etcd/go.mod"}


def occurs(version: str, text: str) -> bool:
    """`version` (v1.2.3, with or without its v) as a whole inside one token or scalar: v1.2.30 is not v1.2.3."""
    number = re.escape(version.removeprefix("v"))
    return re.search(rf"(?<![\w.])v?{number}(?!\.?\d)", text) is not None


def _python_strings(text: str) -> Iterator[tuple[int, str]]:
    tree = ast.parse(text)
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }  # no effect: documentation
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def _shell_words(text: str) -> Iterator[tuple[int, str]]:
    """Each line's words as the shell splits them, its comments dropped (a line that shlex cannot split alone,
    such as one inside a multi-line string, is split with the lines that follow it)."""
    pending, start = "", 0
    for n, line in enumerate(text.splitlines(), 1):
        pending, start = (pending + "\n" + line, start) if pending else (line, n)
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:
            continue
        for word in words:
            yield start, word
        pending = ""
    if pending:
        raise ValueError(f"line {start}: unbalanced quotes to the end of the file")


def _scalars(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield str(k)
            yield from _scalars(v)
    elif isinstance(node, list):
        for v in node:
            yield from _scalars(v)
    elif node is not None:
        yield str(node)


def tokens(path: str, text: str) -> Iterator[tuple[int, str]]:
    """(line, token) of what the file's syntax makes code or data; line 0 where the parser gives none."""
    name = Path(path).name
    if name.endswith(".py"):
        yield from _python_strings(text)
    elif name.endswith((".sh", ".env")) or name in ("Makefile", "Dockerfile", "run"):
        yield from _shell_words(text)
    elif name.endswith((".yaml", ".yml")):
        for doc in yaml.safe_load_all(text):
            yield from ((0, s) for s in _scalars(doc))
    elif name.endswith(".json"):
        yield from ((0, s) for s in _scalars(json.loads(text)))
    elif name.endswith(".toml"):
        yield from ((0, s) for s in _scalars(tomllib.loads(text)))
    elif name.endswith(".tf"):
        parsed = hcl2.loads(text)
        parsed.pop("__comments__", None)  # python-hcl2 keeps the comments beside the body
        yield from ((0, s) for s in _scalars(parsed))
    else:
        raise AssertionError(
            f"{path}: no reader for this kind of file; add one to tests/unit/test_pins.py, "
            "or list it as prose or not code"
        )


def second_spellings(path: str, text: str) -> list[str]:
    return [
        f"{path}:{line or '?'}: {token!r} spells {name} ({SPELLINGS[name]})"
        for line, token in tokens(path, text)
        for name, version in SPELLINGS.items()
        if occurs(version, token) and path not in HOMES[name]
    ]


def _tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    return [p for p in out.split("\0") if p and (REPO / p).is_file()]


def test_each_pinned_version_is_spelled_in_its_home_only():
    files = [
        p for p in _tracked() if not p.startswith(NOT_CODE) and not p.endswith(PROSE) and p not in GO_MOD
    ]
    assert len(files) > 200, files  # the repository's code, not an empty listing
    found = [hit for p in files for hit in second_spellings(p, (REPO / p).read_text())]
    assert not found, "a pinned version spelled outside its home:\n" + "\n".join(found)


def test_each_home_spells_its_version():
    for name, version in SPELLINGS.items():
        for home in HOMES[name]:
            if any(occurs(version, token) for _, token in tokens(home, (REPO / home).read_text())):
                break
        else:
            raise AssertionError(f"{name} {version} is in none of {HOMES[name]}")


@pytest.mark.parametrize(
    ("path", "text", "caught"),
    [
        ("a.py", 'IMAGE = "quay.io/argoproj/argoexec:{v}"\n', True),
        ("a.py", 'VERSION = f"{v}-baton-kubelet"\n', True),
        ("a.py", 'def f():\n    """Built from {v}."""\n    return 1  # {v}\n', False),
        ("a.py", 'X = "{v}0"\n', False),  # another version
        ("a.sh", 'ARGO_VERSION="{v}"\n', True),
        ("a.sh", "cat <<EOF\nversion {v}\nEOF\n", True),
        ("a.sh", '# built from {v}\necho "it\'s\n{v} here"\n', True),
        ("a.sh", "# built from {v}\nexit 0\n", False),
        ("Makefile", "e2e:\n\tKUEUE={v} pytest # {v}\n", True),
        ("Makefile", "install:\n\tpip install -q torch=={t}\n", True),  # the Makefile's torch, once
        ("Makefile", "# torch is pinned to {t}\ninstall:\n\tpip install -q '$(TORCH)'\n", False),
        ("a.yaml", "image: quay.io/argoproj/argocli:{v}\n", True),
        ("a.yaml", "# argocli {v}\nimage: quay.io/argoproj/argocli\n", False),
        ("a.json", '{{"tag": "{v}"}}', True),
        ("a.tf", 'variable "v" {{\n  default = "{v}"\n}}\n', True),
        ("a.tf", '# {v}\nvariable "v" {{\n  default = "x"\n}}\n', False),
    ],
)
def test_the_reader_catches_code_and_passes_prose(path, text, caught):
    """Planted spellings, one per syntax the check reads: each one in code is caught, each one in prose is not."""
    version = pins.ARGO_VERSION
    assert bool(second_spellings(path, text.format(v=version, t=TORCH))) is caught


def _go_mod(text: str) -> dict[str, dict[str, str]]:
    """go.mod's require and replace directives, blocks or single lines, comments dropped (Go's syntax)."""
    out: dict[str, dict[str, str]] = {"require": {}, "replace": {}}
    block = None
    for raw in text.splitlines():
        words = raw.split("//")[0].split()
        if not words:
            continue
        if words[-1] == "(" and len(words) == 2:
            block = words[0]
            continue
        if words == [")"]:
            block = None
            continue
        verb = block if block else words.pop(0)
        if verb == "require":
            out["require"][words[0]] = words[1]
        elif verb == "replace":
            arrow = words.index("=>")
            out["replace"][words[0]] = words[arrow + 2] if len(words) > arrow + 2 else words[arrow + 1]
    return out


def test_the_go_mod_files_name_the_pinned_versions():
    kube = _go_mod((REPO / "infra/local/kube/go.mod").read_text())
    assert kube["require"]["k8s.io/kubernetes"] == pins.K8S_VERSION
    staging = "v0." + pins.K8S_VERSION.split(".", 1)[1]  # v1.N.M's staging modules are tagged v0.N.M
    assert kube["replace"] and set(kube["replace"].values()) == {staging}, kube["replace"]
    etcd = _go_mod((REPO / "infra/local/etcd/go.mod").read_text())
    assert etcd["require"]["go.etcd.io/etcd/server/v3"] == pins.ETCD_VERSION


def test_the_pins_reader_refuses_what_bash_would_read_differently(tmp_path):
    env = tmp_path / "x.env"
    for line in ('A="v1"', "A=$B", "A=v1 # c", "A=`x`", "not an assignment"):
        env.write_text(line + "\n")
        with pytest.raises(ValueError, match="plain value"):
            pins.read(env)
    env.write_text("# comment\n\nA=v1.2.3\n")
    assert pins.read(env) == {"A": "v1.2.3"}
