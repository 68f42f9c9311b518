"""Bad input gets one clear line naming what is wrong, exit 1, and no traceback; numbers that are not
finite stop the run instead of training on garbage; credentials in URIs never reach a message."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.helpers import PY, REPO, TINY_YAML, base_env, run, trainer_cmd


def _strict(line: str):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(line, parse_constant=refuse)


def _one_line_error(rc: int, err: str, *needles: str) -> None:
    assert rc == 1 and "Traceback" not in err, err[-2000:]
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    for needle in needles:
        assert needle in line, line


@pytest.mark.parametrize("kind", ["binary file", "directory", "unreachable bucket"])
def test_a_corpus_that_cannot_be_read_is_one_line_naming_data_uri(kind, tiny_model, tmp_path):
    if kind == "binary file":
        uri = tmp_path / "corpus.txt"
        uri.write_bytes(os.urandom(4096) + b"\xff\xfe")
        needle = "is not UTF-8 text"
    elif kind == "directory":
        uri, needle = tmp_path, "is a directory"
    else:
        uri, needle = "s3://someone:hunter2hunter2@corpus-bucket/corpus.txt", "config key 'data.uri'"
    cmd = trainer_cmd(tiny_model, tmp_path / "ckpt") + ["--set", f"data.uri={uri}"]
    rc, _, err = run(cmd, env=base_env(BATON_S3_ENDPOINT="http://127.0.0.1:9", AWS_MAX_ATTEMPTS="1"))
    _one_line_error(rc, err, "config key 'data.uri'", needle)
    assert "hunter2" not in err


def test_a_binary_config_file_is_one_line(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_bytes(b"\x00\x01\xfe\xff" * 64)
    rc, _, err = run([PY, "-m", "trainer", "--config", str(cfg)])
    _one_line_error(rc, err, "is not text")


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_a_config_number_that_is_not_finite_is_refused_naming_the_key(value):
    rc, _, err = run([PY, "-m", "trainer", "--config", str(TINY_YAML), "--set", f"optim.lr={value}"])
    _one_line_error(rc, err, "optim.lr", "must be a finite number")


def test_a_loss_that_stops_being_finite_ends_the_run_with_1_naming_the_step(tiny_model, tmp_path):
    """lr 1e+30 (finite, accepted) blows the weights up after the first update: the loss of a later step
    is not finite. The run stops there with 1, its records stay valid JSON, and nothing after the last
    good step is saved. Control: the same run at lr 1e-3 finishes."""
    ckpt = tmp_path / "ckpt"
    cmd = trainer_cmd(
        tiny_model,
        ckpt,
        "optim.lr=1.0e+30",
        "optim.warmup_steps=0",
        "checkpoint.every_steps=1",
        "total_steps=6",
    )
    p = subprocess.run(cmd, capture_output=True, text=True, env=base_env(), cwd=REPO, timeout=300)
    rc, err = p.returncode, p.stderr
    recs = [_strict(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert rc == 1, err[-2000:]
    (failed,) = [r for r in recs if r["event"] == "failed"]
    assert failed["reason"] == "non_finite" and f"step {failed['step']}:" in failed["error"]
    assert "is not finite" in err and "Traceback" not in err
    bad = failed["step"]
    stepped = [r["step"] for r in recs if r["event"] == "step"]
    assert stepped == list(range(1, bad)), "the bad step has no step record"
    saved = sorted(int(p.parent.name.removeprefix("step-")) for p in ckpt.glob("runs/*/step-*/_COMMIT"))
    assert saved and max(saved) < bad
    assert not [r for r in recs if r["event"] == "done"]
    rc, _, err = run(trainer_cmd(tiny_model, tmp_path / "control", "optim.warmup_steps=0", "total_steps=6"))
    assert rc == 0, err[-2000:]
