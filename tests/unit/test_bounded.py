"""Numbers from outside the code are read by one rule (trainer/bounded.py): a bad environment variable,
workflow parameter or step flag is one line naming it and its range, exit 1, at the start of every entry
point; never a traceback, never a value the code cannot use.

Each attack has its control: the value reaches a conversion or a timer that fails on it as the code
stood (Python's int() of thousands of digits, float() of nan, a timedelta of 1e300 s), and a good value
of the same variable runs.
"""

from __future__ import annotations

import subprocess
from datetime import timedelta

import pytest

from tests.helpers import PY, REPO, TINY_YAML, base_env
from trainer.bounded import Bound, OutOfRange, parse
from trainer.env import MAX_GRACE_S

HUGE = "9" * 5000


@pytest.mark.parametrize(
    "raw, bound, value",
    [
        ("12", Bound(0, 100, integer=True), 12),
        (" 7 ", Bound(0, 100, integer=True), 7),
        ("0.5", Bound(0, 1, below=True), 0.5),
        ("1e3", Bound(0, 1e4), 1000.0),
        (".5", Bound(0, 1), 0.5),
    ],
)
def test_good_numbers_are_read(raw, bound, value):
    assert parse(raw, "x", bound) == value


@pytest.mark.parametrize(
    "raw, bound",
    [
        ("nan", Bound(0, 10)),
        ("inf", Bound(0, 10)),
        ("-inf", Bound(-10, 10)),
        ("1_0", Bound(0, 100)),
        ("0x10", Bound(0, 100, integer=True)),
        ("1.5", Bound(0, 10, integer=True)),
        ("11", Bound(0, 10)),
        ("-1", Bound(0, 10)),
        ("0", Bound(0, 10, above=True)),
        ("1", Bound(0, 1, below=True)),
        ("", Bound(0, 1)),
        (HUGE, Bound(0, 10, integer=True)),
        ("1e300", Bound(0, 10)),
        ("²", Bound(0, 10, integer=True)),
    ],
)
def test_bad_numbers_are_refused_naming_where_and_the_range(raw, bound):
    with pytest.raises(OutOfRange) as e:
        parse(raw, "BATON_X", bound)
    assert str(e.value).startswith("BATON_X must be ") and len(str(e.value)) < 200, str(e.value)


def test_the_controls_the_old_readers_met():
    """What each refused value did as the code stood: Python's own conversions take or choke on them."""
    with pytest.raises(ValueError, match="Exceeds the limit"):
        int(HUGE)  # the parameters' check was `[0-9]+`, then int(): a traceback inside the conversion
    assert float("nan") != float("nan") and float("1_0") == 10.0  # float() takes both
    with pytest.raises(OverflowError):
        timedelta(seconds=1e300 / 2)  # trainer/faults.py's collective timeout: half the grace
    assert timedelta(seconds=MAX_GRACE_S / 2)  # what the range allows


def _run(cmd: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=base_env(**env), cwd=REPO, timeout=180)


def _one_line(p: subprocess.CompletedProcess, *words: str) -> None:
    err = p.stderr.strip()
    assert p.returncode == 1 and "Traceback" not in err and len(err.splitlines()) == 1, (
        p.returncode,
        err[-3000:],
    )
    assert err.startswith("error: ") and all(w in err for w in words), err


ENTRY_POINTS = {
    "trainer": [PY, "-m", "trainer", "--config", str(TINY_YAML)],
    "steps.train": [PY, "-m", "steps.train", "--trainer", "-c pass"],
    "steps.evict": [PY, "-m", "steps.evict", "--evidence", "x", "--total-steps", "10", "--evictions", "1"],
    "steps.verify": [PY, "-m", "steps.verify", "--evidence", "x", "--total-steps", "10"],
    "steps.compare": [
        PY,
        "-m",
        "steps.compare",
        "--reference",
        "a",
        "--replay",
        "b",
        "--trial",
        "c",
        "--evidence",
        "d",
        "--verify",
        "e",
        "--total-steps",
        "10",
        "--out",
        "f",
    ],
    "steps.release": [PY, "-m", "steps.release", "--workflow", "w"],
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize(
    "name, raw",
    [
        ("BATON_GRACE", "nan"),
        ("BATON_GRACE", "1e300"),
        ("BATON_GRACE", "-1"),
        ("BATON_S3_MAX_ATTEMPTS", HUGE),
    ],
)
def test_every_entry_point_refuses_a_bad_variable_in_one_line(entry, name, raw):
    _one_line(_run(ENTRY_POINTS[entry], **{name: raw}), name, "must be")


def test_the_trainer_refuses_a_bad_grace_where_it_used_to_print_a_traceback(tmp_path):
    """Control: the same start with a good grace gets past the variables (to the config it lacks)."""
    good = _run(ENTRY_POINTS["trainer"] + ["--set", "checkpoint.uri="], BATON_GRACE="12")
    assert good.returncode == 1 and "checkpoint.uri" in good.stderr and "BATON_GRACE" not in good.stderr, (
        good.stderr
    )


@pytest.mark.parametrize(
    "cmd, words",
    [
        (
            ["steps.train", "--shutdown-timeout", "1e300", "--trainer", "-c pass"],
            ["--shutdown-timeout", "<= 86400"],
        ),
        (["steps.train", "--nproc", HUGE, "--trainer", "-c pass"], ["--nproc", "<= 1024"]),
        (["steps.train", "--rendezvous-timeout", "inf", "--trainer", "-c pass"], ["--rendezvous-timeout"]),
        (
            [
                "steps.evict",
                "--evidence",
                "x",
                "--total-steps",
                "1000000000000",
                "--evictions",
                "100000000000",
            ],
            ["--total-steps", "<= 10000000"],
        ),
        (
            [
                "steps.evict",
                "--evidence",
                "x",
                "--total-steps",
                "10",
                "--evictions",
                "1",
                "--nodes",
                "2",
                "--node",
                HUGE,
            ],
            ["--node", "<= 1"],
        ),
        (["steps.verify", "--evidence", "x", "--total-steps", "nan"], ["--total-steps"]),
        (["steps.release", "--workflow", "w", "--retry-wait", "1e300"], ["--retry-wait"]),
    ],
)
def test_a_step_refuses_a_bad_number_flag_in_one_line(cmd, words):
    _one_line(_run([PY, "-m", *cmd]), *words)


@pytest.mark.parametrize(
    "command", [["render"], ["run", "--out", "OUT"], ["submit", "--argo-server", "127.0.0.1:9"]]
)
@pytest.mark.parametrize(
    "param, words",
    [
        ("total_steps=" + HUGE, ["parameter total_steps", "<= 10000000"]),
        ("grace=1e300", ["parameter grace"]),
        ("deadline=" + HUGE, ["parameter deadline"]),
    ],
)
def test_the_workflow_cli_refuses_a_number_parameter_in_one_line(tmp_path, command, param, words):
    cmd = [
        PY,
        "workflows/equivalence.py",
        *[str(tmp_path / "d") if c == "OUT" else c for c in command],
        "-p",
        param,
    ]
    _one_line(_run(cmd), *words)


def test_the_workflow_cli_renders_good_numbers_as_the_pods_read_them():
    """Control for the refusals above: in range, a number goes through, written as Python writes it."""
    p = _run([PY, "workflows/equivalence.py", "render", "-p", "total_steps=+0040", "-p", "dropout=0.25"])
    assert p.returncode == 0, p.stderr
    assert "value: '40'" in p.stdout and "value: '0.25'" in p.stdout, p.stdout[:2000]


def _documented(text: str, name: str, default: float, bound: Bound) -> bool:
    row = next((line for line in text.splitlines() if line.startswith(f"| `{name}` |")), "")
    return f"| {default:g} |" in row and f"{bound.low:g} to {bound.high:g} |" in row


def test_docs_give_every_variables_default_and_range():
    """docs/config.md's table says what trainer/env.py reads. Control: a range that moved is seen."""
    from trainer import env

    text = (REPO / "docs" / "config.md").read_text()
    for name, (default, bound) in env.NUMBERS.items():
        assert _documented(text, name, default, bound), name
    assert all(f"`{name}`" in text for name in env.FLAGS)
    default, bound = env.NUMBERS["BATON_GRACE"]
    assert not _documented(text, "BATON_GRACE", default, Bound(bound.low, bound.high + 1))
