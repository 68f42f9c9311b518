"""baton's environment variables, read by one strict rule (trainer/env.py): a spelling baton does not read
is refused by name, never taken for "off". The negative control it guards: BATON_SWAP_RANK_STATE=true was
once read as off (only "1" was), so a control asked for that way ran as a normal trial."""

from __future__ import annotations

import re
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


def test_baton_variables_are_read_in_trainer_env_only():
    """One home for the rule: no other module of the product reads a BATON_ variable from os.environ itself
    (tests/faultfs, the test seams, are outside the product and read their own)."""
    pattern = re.compile(r"""(os\.environ(\.get)?\s*[\(\[]\s*|os\.getenv\(\s*)["']BATON_""")
    offenders = [
        f"{p.relative_to(REPO)}:{i}"
        for folder in ("trainer", "steps", "baton", "workflows")
        for p in sorted((REPO / folder).rglob("*.py"))
        if p != REPO / "trainer" / "env.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == [], offenders
    assert pattern.search('x = os.environ.get("BATON_GRACE")')  # control: the pattern sees the old form
    assert Path(env.__file__).name == "env.py"
