"""A user's own HF script under the drill, with no friction: `python x.py` and `-m pkg.mod` as given, a
relative path found from where the user stands, `baton_args()` instead of argparse boilerplate, no DDP
at one rank, and baton's package found even beside a user's own `trainer.py`."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from tests.helpers import CORPUS, PY, REPO, base_env, records


def test_python_and_module_forms_of_the_trainer_parameter():
    from steps.train import program

    assert program("python my_train.py --lr 3e-4") == ["my_train.py", "--lr", "3e-4"]
    assert program("python3 -m mypkg.train") == ["-m", "mypkg.train"]
    assert program("my_train.py") == ["my_train.py"]


def test_a_relative_script_is_found_from_the_callers_folder(tmp_path):
    from workflows.cli import script_from_here

    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "my_train.py").write_text("")
    here = tmp_path / "jobs"
    assert script_from_here("my_train.py --note 'a b'", here) == f"{here / 'my_train.py'} --note 'a b'"
    assert script_from_here("python my_train.py", here) == f"python {here / 'my_train.py'}"
    for as_is in ("baton", "hf", "-m pkg.train", "not_here.py", "/abs/train.py"):
        assert script_from_here(as_is, here) == as_is


@pytest.mark.parametrize("launcher", ["direct", "torchrun"])
def test_a_users_script_beside_its_own_trainer_py_runs_one_rank_without_ddp(tmp_path, tiny_model, launcher):
    """The script imports baton.hf, parses its arguments with baton_args(), and sits beside a trainer.py
    of the user's (which must not shadow baton's package). Run by steps.train at one rank, its model is
    not wrapped in DistributedDataParallel, under either launcher (both give it a world of one)."""
    (tmp_path / "trainer.py").write_text('raise SystemExit("the user\'s own trainer.py was imported")\n')
    script = tmp_path / "my_train.py"
    script.write_text(
        textwrap.dedent("""
        import os, runpy, sys
        from baton.hf import baton_args
        cfg = baton_args()  # what the drill passes: --config and --set
        import transformers
        train = transformers.Trainer.train
        def wrapped(self, *a, **k):
            out = train(self, *a, **k)
            print(f"wrapped as {type(self.model_wrapped).__name__}", file=sys.stderr)
            return out
        transformers.Trainer.train = wrapped
        sys.argv = [sys.argv[0], *sys.argv[1:]]
        runpy.run_path(os.path.join(os.environ["BATON_REPO"], "examples/hf_trainer/train.py"), run_name="__main__")
    """)
    )
    cmd = [
        PY,
        "-m",
        "steps.train",
        "--nproc",
        "1",
        "--launcher",
        launcher,
        "--trainer",
        f"python {script}",
        "--config",
        str(REPO / "examples/hf_trainer/config.yaml"),
    ]
    for s in (
        f"model.path={tiny_model}",
        f"checkpoint.uri={tmp_path / 'ckpt'}",
        f"data.uri={CORPUS}",
        "total_steps=2",
    ):
        cmd += ["--set", s]
    p = subprocess.run(
        cmd, capture_output=True, text=True, cwd=tmp_path, env=base_env(BATON_REPO=str(REPO)), timeout=600
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "wrapped as Qwen2ForCausalLM" in p.stderr, p.stderr[-2000:]
    assert [r["event"] for r in records(p.stdout)][-1] == "done"


def test_baton_args_leaves_the_scripts_own_flags_alone(tmp_path):
    """A user's script with flags of its own: baton_args() parses --config and --set and ignores the rest,
    which the script's own parser reads with parse_known_args. Control: a bad baton key is still refused."""
    import argparse

    from trainer.hf import baton_args

    argv = [
        "--lr",
        "0.5",
        "--config",
        str(REPO / "trainer" / "configs" / "tiny.yaml"),
        "--set",
        "total_steps=7",
        "--warmup",
        "3",
    ]
    cfg = baton_args(argv)
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float)
    ap.add_argument("--warmup", type=int)
    mine, _ = ap.parse_known_args(argv)
    assert cfg.total_steps == 7 and (mine.lr, mine.warmup) == (0.5, 3)
    with pytest.raises(SystemExit):
        baton_args([*argv, "--set", "no_such_key=1"])


def test_a_scripts_config_needs_only_the_keys_the_drill_sets(tmp_path):
    """A script that builds its own model and data: a config of one line, with the drill's --set keys.
    Control: baton's own trainer still requires name, model.path and data.uri, naming the first."""
    from trainer.config import ConfigError, load_config
    from trainer.hf import baton_args

    config = tmp_path / "ft.yaml"
    config.write_text("seed: 3\n")
    drill = [
        "--set",
        "checkpoint.uri=file:///x/trial",
        "--set",
        "total_steps=5",
        "--set",
        "model.dropout=0.1",
    ]
    cfg = baton_args(["--config", str(config), *drill])
    assert (cfg.seed, cfg.total_steps, cfg.name, cfg.checkpoint.uri) == (3, 5, "hf", "file:///x/trial")
    with pytest.raises(ConfigError, match="config key 'name': is required"):
        load_config(config, [o for o in drill if o != "--set"])
    with pytest.raises(ConfigError, match="config key 'model.path': is required"):
        load_config(config, ["name=x", "data.uri=/c", "checkpoint.uri=/k"])


def test_without_baton_first_a_users_trainer_py_shadows_baton_s_package(tmp_path):
    """Why baton/__init__.py rebinds `trainer`: Python puts the script's folder first on sys.path, so a user's own
    `trainer.py` there is what `import trainer` finds (the control), unless `baton` was imported first."""
    (tmp_path / "trainer.py").write_text('raise SystemExit("the user\'s own trainer.py was imported")\n')
    script = tmp_path / "job.py"
    script.write_text("import trainer\nprint(trainer.__file__)\n")
    plain = subprocess.run(
        [PY, str(script)], capture_output=True, text=True, cwd=tmp_path, env=base_env(), timeout=120
    )
    assert plain.returncode != 0 and "the user's own trainer.py was imported" in plain.stderr  # the control
    script.write_text("import baton\nimport trainer\nprint(trainer.__file__)\n")
    first = subprocess.run(
        [PY, str(script)], capture_output=True, text=True, cwd=tmp_path, env=base_env(), timeout=120
    )
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.strip() == str(REPO / "trainer" / "__init__.py")
