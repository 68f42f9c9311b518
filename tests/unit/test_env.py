"""baton's environment variables, read by one strict rule (trainer/env.py): a spelling baton does not read
is refused by name, never taken for "off". The negative control it guards: BATON_SWAP_RANK_STATE=true was
once read as off (only "1" was), so a control asked for that way ran as a normal trial."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from tests.helpers import PY, REPO, base_env
from trainer import env


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("1", True),
        ("true", True),
        ("Yes", True),
        ("ON", True),
        ("", False),
        ("0", False),
        ("false", False),
        ("no", False),
        ("off", False),
    ],
)
def test_a_flag_reads_every_usual_spelling(monkeypatch, raw, expected):
    monkeypatch.setenv("BATON_SWAP_RANK_STATE", raw)
    assert env.flag("BATON_SWAP_RANK_STATE") is expected


@pytest.mark.parametrize("raw", ["2", "enabled", "tru", "y"])
def test_any_other_spelling_of_a_flag_is_refused_by_name(monkeypatch, raw):
    monkeypatch.setenv("BATON_DISABLE_SIGTERM_HANDLER", raw)
    with pytest.raises(env.EnvError, match=f"BATON_DISABLE_SIGTERM_HANDLER must be one of .* got '{raw}'"):
        env.flag("BATON_DISABLE_SIGTERM_HANDLER")


def test_numbers_are_finite_and_bounded(monkeypatch):
    monkeypatch.setenv("BATON_GRACE", "12.5")
    assert env.number("BATON_GRACE") == 12.5
    for bad in ("abc", "nan", "inf", "-1", "1e300", "1_0", "9" * 5000):
        monkeypatch.setenv("BATON_GRACE", bad)
        with pytest.raises(env.EnvError, match="BATON_GRACE must be a finite number >= 0 and <= 86400"):
            env.number("BATON_GRACE")
    monkeypatch.delenv("BATON_GRACE")
    assert env.number("BATON_GRACE") == 30.0
    monkeypatch.setenv("BATON_S3_MAX_ATTEMPTS", "0")
    with pytest.raises(
        env.EnvError, match="BATON_S3_MAX_ATTEMPTS must be an integer >= 1 and <= 100, got '0'"
    ):
        env.number("BATON_S3_MAX_ATTEMPTS")


def test_the_pods_pid_1_refuses_a_bad_variable_in_one_line(tmp_path):
    """steps.train reads BATON_EVIDENCE_FLUSH_S before it starts anything: a bad value is one line and
    exit 1, no traceback. Control: a good one runs the trainer."""
    bad = subprocess.run(
        [PY, "-m", "steps.train", "--trainer", "-c pass"],
        capture_output=True,
        text=True,
        env=base_env(BATON_EVIDENCE_FLUSH_S="soon"),
        cwd=REPO,
        timeout=120,
    )
    assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
    assert "error: BATON_EVIDENCE_FLUSH_S must be a finite number >= 0 and <= 3600, got 'soon'" in bad.stderr
    script = tmp_path / "ran.py"
    script.write_text("print('ran')\n")
    good = subprocess.run(
        [PY, "-m", "steps.train", "--trainer", str(script)],
        capture_output=True,
        text=True,
        env=base_env(BATON_EVIDENCE_FLUSH_S="1"),
        cwd=REPO,
        timeout=120,
    )
    assert "ran" in good.stdout, good.stderr[-1000:]


def _key_value(node: ast.expr, names: dict[str, str]) -> str | None:
    """The string a key expression stands for: a constant, or a name bound to one (in the module, or imported)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id)
    return None


def _string_names(tree: ast.Module) -> dict[str, str]:
    """Module-level names bound to a string: `X = "..."`, and `from M import Y [as X]` where M.Y is a string."""
    import importlib

    names: dict[str, str] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            names.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                try:
                    value = getattr(importlib.import_module(node.module), a.name, None)
                except ImportError:
                    continue
                if isinstance(value, str):
                    names[a.asname or a.name] = value
    return names


def baton_reads(source: str) -> list[int]:
    """Lines where `source` reads a BATON_ variable from os.environ or os.getenv itself, by literal or by a
    name bound to one (read on the syntax: `os.environ.get(K)`, `os.environ[K]`, `os.getenv(K)`)."""
    tree = ast.parse(source)
    names = _string_names(tree)

    def is_environ(n: ast.expr) -> bool:
        return (
            isinstance(n, ast.Attribute)
            and n.attr == "environ"
            and isinstance(n.value, ast.Name)
            and n.value.id == "os"
        )

    lines = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            f = node.func
            if (f.attr == "get" and is_environ(f.value)) or (
                f.attr == "getenv" and isinstance(f.value, ast.Name) and f.value.id == "os"
            ):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and is_environ(node.value):
            key = node.slice
        value = _key_value(key, names) if key is not None else None
        if value is not None and value.startswith("BATON_"):
            lines.append(node.lineno)
    return lines


def test_baton_variables_are_read_in_trainer_env_only():
    """One home for the rule: no other module of the product reads a BATON_ variable from os.environ itself,
    by literal or through a name (tests/faultfs, the test seams, are outside the product and read their own)."""
    offenders = [
        f"{p.relative_to(REPO)}:{line}"
        for folder in ("trainer", "steps", "baton", "workflows", "gpu")
        for p in sorted((REPO / folder).rglob("*.py"))
        if p != REPO / "trainer" / "env.py"
        for line in baton_reads(p.read_text())
    ]
    assert offenders == [], offenders
    assert Path(env.__file__).name == "env.py"


def test_a_baton_read_past_trainer_env_is_found_however_it_is_spelled():
    """Controls: the old literal form, and the two that the regular expression before this check missed
    (steps/evict.py's and workflows/targets.py's: a constant, an imported name)."""
    assert baton_reads('import os\nx = os.environ.get("BATON_GRACE")\n') == [2]
    assert baton_reads('import os\nK = "BATON_TARGET"\nv = os.environ.get(K, "")\n') == [3]
    assert baton_reads("import os\nfrom steps.lib.local_pods import ENV as P\nd = os.environ[P]\n") == [3]
    assert baton_reads('import os\nv = os.getenv("BATON_X")\nw = os.environ.get("LOCAL_RANK")\n') == [2]
