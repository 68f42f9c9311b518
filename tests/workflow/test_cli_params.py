"""`run`'s parameters as a user gives them: a relative -p config, and the list in `run --help`; and the
entry point, `python workflows/equivalence.py`, which executes that file once."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import PY, REPO, base_env
from workflows.cli import config_from_here
from workflows.equivalence import main


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


# A sitecustomize that records, when the interpreter exits, every name under which sys.modules holds a module
# object made from the file SCRIPT_ONCE_FILE: one name per execution of that file's top level.
_RECORD_MODULES = """
import atexit, os, sys
from pathlib import Path


def _record():
    target = Path(os.environ["SCRIPT_ONCE_FILE"]).resolve()
    names = sorted(name for name, mod in list(sys.modules.items())
                   if getattr(mod, "__file__", None) and Path(mod.__file__).resolve() == target)
    Path(os.environ["SCRIPT_ONCE_OUT"]).write_text(",".join(names))


atexit.register(_record)
"""


def module_objects(script: Path, args: list[str], tmp: Path) -> list[str]:
    """The names of the module objects that `python SCRIPT ARGS` held of SCRIPT when it exited."""
    hook = tmp / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_RECORD_MODULES)
    out = tmp / "modules"
    env = base_env(SCRIPT_ONCE_FILE=str(script), SCRIPT_ONCE_OUT=str(out))
    env["PYTHONPATH"] = os.pathsep.join([str(hook), env["PYTHONPATH"]])
    p = subprocess.run(
        [PY, str(script), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    return out.read_text().split(",")


def test_running_equivalence_py_executes_it_once(tmp_path):
    """`python workflows/equivalence.py render`: the file runs as __main__ and is never imported again as
    workflows.equivalence (workflows/cli.py takes the workflow from it and never imports it)."""
    assert module_objects(REPO / "workflows" / "equivalence.py", ["render"], tmp_path) == ["__main__"]


def test_control_an_entry_point_that_its_command_line_imports_runs_twice(tmp_path):
    """The check above can fail: the old pattern (the command line imports the entry point's module, whose
    __main__ block imports the command line) leaves two module objects of one file."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "entry.py").write_text(
        "import sys\nfrom pathlib import Path\n\nsys.path.insert(0, str(Path(__file__).resolve().parent.parent))\n"
        "BUILT = 'the workflow'\n\nif __name__ == '__main__':\n    from pkg.cli import main\n\n    sys.exit(main())\n"
    )
    (pkg / "cli.py").write_text(
        "from pkg.entry import BUILT\n\n\ndef main():\n    return 0 if BUILT else 1\n"
    )
    assert module_objects(pkg / "entry.py", [], tmp_path) == ["__main__", "pkg.entry"]
