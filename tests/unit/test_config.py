"""Config: YAML + --set, validation that names the key, fingerprint and run_id."""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers import PY, REPO, TINY_YAML, base_env
from trainer.config import ConfigError, load_config


def test_tiny_config_loads_with_the_keys_other_tools_rely_on():
    cfg = load_config(
        TINY_YAML,
        [
            "model.dropout=0.1",
            "seed=3",
            "total_steps=12",
            "checkpoint.every_steps=4",
            "checkpoint.uri=s3://bucket/x",
            "name=exp",
        ],
    )
    assert (cfg.model.dropout, cfg.seed, cfg.total_steps, cfg.checkpoint.every_steps) == (0.1, 3, 12, 4)
    assert cfg.checkpoint.uri == "s3://bucket/x" and cfg.model.path and cfg.name == "exp"
    assert cfg.run_id == f"exp-{cfg.fingerprint[:12]}"


@pytest.mark.parametrize(
    "override, key",
    [
        ("optim.lrr=0.1", "optim.lrr"),
        ("bogus=1", "bogus"),
        ("optim.lr=abc", "optim.lr"),
        ("seed=1.5", "seed"),
        ("total_steps=true", "total_steps"),
        ("model.dropout=1.5", "model.dropout"),
        ("data.batch_size=0", "data.batch_size"),
        ("optim.betas=[0.9]", "optim.betas"),
        ("model=3", "model"),
        ("name=has space", "name"),
    ],
)
def test_bad_values_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        load_config(TINY_YAML, [override])


def test_missing_required_section_names_the_key(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: x\ndata: {uri: a.txt}\ncheckpoint: {uri: /tmp/x}\n")
    with pytest.raises(ConfigError, match="'model.path'"):
        load_config(p)


def test_fingerprint_covers_what_is_computed_and_nothing_else():
    base = load_config(TINY_YAML)
    for o in [
        "model.dropout=0.1",
        "seed=1",
        "optim.lr=0.01",
        "data.batch_size=2",
        "data.grad_accum=4",
        "total_steps=41",
        "optim.warmup_steps=2",
        "model.dtype=bfloat16",
        "data.seq_len=32",
    ]:
        assert load_config(TINY_YAML, [o]).fingerprint != base.fingerprint, o
    for o in [
        "checkpoint.uri=/elsewhere",
        "checkpoint.every_steps=3",
        "checkpoint.keep_last=9",
        "log_every=5",
        "data.num_workers=2",
    ]:
        assert load_config(TINY_YAML, [o]).fingerprint == base.fingerprint, o
    assert load_config(TINY_YAML, ["name=other"]).run_id.split("-")[-1] == base.run_id.split("-")[-1]


def test_cli_refuses_bad_config_with_exit_1_and_names_the_key():
    p = subprocess.run(
        [PY, "-m", "trainer", "--config", str(TINY_YAML), "--set", "optim.lrr=1"],
        capture_output=True,
        text=True,
        env=base_env(),
        cwd=REPO,
        timeout=60,
    )
    assert p.returncode == 1
    assert "optim.lrr" in p.stderr and "unknown key" in p.stderr
    p = subprocess.run(
        [PY, "-m", "trainer", "--config", "/nonexistent.yaml"],
        capture_output=True,
        text=True,
        env=base_env(),
        cwd=REPO,
        timeout=60,
    )
    assert p.returncode == 1 and "does not exist" in p.stderr


@pytest.mark.parametrize(
    ("base", "twin"),
    [
        ("trainer/configs/tiny.yaml", "trainer/configs/tiny-workers.yaml"),
        ("examples/hf_trainer/config.yaml", "examples/hf_trainer/config-workers.yaml"),
    ],
)
def test_each_workers_config_is_its_base_with_two_loader_workers(base, twin, tmp_path):
    """The shipped twins the e2e drills run (they are in the image; a file written at test time is not): the
    base with data.num_workers 2 and nothing else, so that an edit to one without the other fails here."""
    import yaml

    from tests.helpers import with_workers

    want = yaml.safe_load(with_workers(REPO / base, tmp_path / "want.yaml").read_text())
    assert yaml.safe_load((REPO / twin).read_text()) == want
    assert load_config(REPO / twin).data.num_workers == 2 and load_config(REPO / base).data.num_workers != 2


def test_the_tiny_model_folder_is_readable_by_other_users(tiny_model):
    """The image builds the tiny model as root and runs as uid 1000: a folder left 0700 by mkdtemp, then a
    model.safetensors left 0600, failed every step there (seen on the local cluster's real node). Each has the
    mode a plain mkdir or open gives."""
    import os
    import stat

    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(tiny_model.stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE(tiny_model.stat().st_mode) & 0o005 == 0o005  # others may list and enter it
    files = [p for p in tiny_model.iterdir() if p.is_file()]
    assert "model.safetensors" in {p.name for p in files}
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {p.name: 0o666 & ~umask for p in files}
