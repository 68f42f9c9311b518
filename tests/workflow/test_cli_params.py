"""`run`'s parameters as a user gives them: a relative -p config, and the list in `run --help`."""

from __future__ import annotations

import pytest

from workflows.cli import config_from_here, main


def test_a_relative_config_is_taken_from_the_callers_folder(tmp_path):
    (tmp_path / "ft.yaml").write_text("name: x\n")
    assert config_from_here("ft.yaml", tmp_path) == str(tmp_path / "ft.yaml")
    assert config_from_here(str(tmp_path / "ft.yaml"), tmp_path / "elsewhere") == str(tmp_path / "ft.yaml")


def test_a_missing_config_is_named_before_any_pod_starts(tmp_path):
    with pytest.raises(SystemExit, match="-p config=nope.yaml: no such file in"):
        config_from_here("nope.yaml", tmp_path)
    with pytest.raises(SystemExit, match="no such file"):
        config_from_here("/nowhere/ft.yaml", tmp_path)


def test_run_help_lists_every_parameter(capsys):
    from workflows.params import PARAMETERS

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in PARAMETERS) and "chaos_seed" in out
