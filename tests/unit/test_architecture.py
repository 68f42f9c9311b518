"""The rooms of the house, checked from the source: no import circle (type-checking and function-level
imports included), the trainer imports neither the steps nor the workflow layer, the loop and the HF
callback reach checkpointing only through its front door, no other room knows the checkpoint layout,
and the training loop reads no environment and runs no test code."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("baton", "trainer", "steps", "workflows")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}


def _imports(path: Path, known: set[str]) -> set[str]:
    """Every project module `path` imports, anywhere in it (functions and `if TYPE_CHECKING:` included),
    but for its `if __name__ == "__main__":` block (an entry point, not a dependency)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name)
            and node.test.left.id == "__name__"
        ):
            skip |= {id(n) for n in ast.walk(node)}
    this = _module_name(path)
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:  # relative: from the package of `this`
                pkg = this.rsplit(".", node.level)[0] if path.name != "__init__.py" else this
                base = f"{pkg}.{node.module}"
            if base in known:
                out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known}
    out.discard(this)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(path, set(mods)) for name, path in mods.items()}


def test_there_is_no_import_circle(graph):
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(n) :] + [n]))
            if n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_a_planted_circle_is_found():
    """The check above can fail: a graph with a circle through a function-level import is refused."""
    with pytest.raises(AssertionError, match="import circle: a -> b -> a"):
        test_there_is_no_import_circle({"a": {"b"}, "b": {"a"}})


def test_the_layers_import_downwards_only(graph):
    for m, deps in graph.items():
        if m.startswith("trainer"):
            assert not {d for d in deps if d.startswith(("steps", "workflows"))}, m
        if m.startswith("steps"):
            assert not {d for d in deps if d.startswith("workflows")}, m


def _is_command(path: Path) -> bool:
    """Whether a module runs as a command: it has an `if __name__ == "__main__":` block (read on the syntax)."""
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name)
            and node.test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators)
        ):
            return True
    return False


def steps_misplaced(root: Path) -> list[str]:
    """Modules of steps/ that are not pod commands, and modules of steps/lib/ that are."""
    top = [p for p in sorted(root.glob("*.py")) if p.name != "__init__.py" and not _is_command(p)]
    lib = [p for p in sorted((root / "lib").glob("*.py")) if _is_command(p)]
    return [f"{p.relative_to(root.parent)}: a library among the pod commands" for p in top] + [
        f"{p.relative_to(root.parent)}: a command among the libraries" for p in lib
    ]


def test_steps_holds_the_pod_commands_and_steps_lib_what_they_share():
    assert not steps_misplaced(REPO / "steps")


def test_a_library_planted_among_the_pod_commands_is_found(tmp_path):
    root = tmp_path / "steps"
    (root / "lib").mkdir(parents=True)
    (root / "train.py").write_text('def main():\n    pass\n\n\nif __name__ == "__main__":\n    main()\n')
    (root / "lib" / "judge.py").write_text("X = 1\n")
    assert not steps_misplaced(root)  # the control: as the tree is
    (root / "helpers.py").write_text("Y = 2\n")
    (root / "lib" / "run.py").write_text(
        'if "__main__" == __name__:\n    pass\nif __name__ == "__main__":\n    pass\n'
    )
    assert steps_misplaced(root) == [
        "steps/helpers.py: a library among the pod commands",
        "steps/lib/run.py: a command among the libraries",
    ]


@pytest.mark.parametrize("module", ["trainer.loop", "trainer.hf"])
def test_the_loop_and_the_hf_callback_use_only_the_front_door(graph, module):
    inner = {d for d in graph[module] if d.startswith("trainer.checkpoint.")}
    assert not inner, f"{module} reaches inside trainer/checkpoint/: {sorted(inner)}"


OUTSIDE_CHECKPOINT = ("trainer", "steps", "workflows", "gpu", "baton", "bench", "examples")


def front_door_violations(files: dict[str, str], exported: set[str]) -> list[str]:
    """Imports of a checkpoint submodule, or of a name the package does not export, in `files` (name ->
    source), read on the syntax."""
    out = []
    for name, text in files.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.startswith("trainer.checkpoint."):
                    out.append(f"{name}:{node.lineno} imports from {node.module}")
                elif node.module == "trainer.checkpoint":
                    out += [
                        f"{name}:{node.lineno} imports {a.name}, which trainer.checkpoint does not export"
                        for a in node.names
                        if a.name not in exported
                    ]
            elif isinstance(node, ast.Import):
                out += [
                    f"{name}:{node.lineno} imports {a.name}"
                    for a in node.names
                    if a.name.startswith("trainer.checkpoint.")
                ]
    return out


def test_every_room_outside_the_checkpoint_package_uses_its_exported_names_only():
    import trainer.checkpoint

    files = {
        str(p.relative_to(REPO)): p.read_text()
        for pkg in OUTSIDE_CHECKPOINT
        for p in (REPO / pkg).rglob("*.py")
        if "checkpoint" not in p.relative_to(REPO).parts[1:2]
    }
    assert "trainer/loop.py" in files and "bench/digest.py" in files
    assert not front_door_violations(files, set(trainer.checkpoint.__all__))
    for name in trainer.checkpoint.__all__:  # every exported name resolves
        assert getattr(trainer.checkpoint, name) is not None, name


def test_a_planted_side_door_is_found():
    ok = "from trainer.checkpoint import Store, digest\n"
    assert not front_door_violations({"a.py": ok}, {"Store", "digest"})  # the control
    planted = {
        "a.py": "def f():\n    from trainer.checkpoint.store import Store\n",
        "b.py": "import trainer.checkpoint.read\n",
        "c.py": "from trainer.checkpoint import _template\n",
    }
    assert front_door_violations(planted, {"Store"}) == [
        "a.py:2 imports from trainer.checkpoint.store",
        "b.py:1 imports trainer.checkpoint.read",
        "c.py:1 imports _template, which trainer.checkpoint does not export",
    ]


DOOR = {"begin", "resume", "save", "wait_for_staging"}
"""The checkpointer's members the training loop may use (trainer/checkpoint/checkpointer.py's docstring)."""


def checkpointer_members(source: str) -> set[str]:
    """The attributes the source reads of `self.ckpt`, on the syntax."""
    return {
        n.attr
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Attribute)
        and n.value.attr == "ckpt"
        and isinstance(n.value.value, ast.Name)
        and n.value.value.id == "self"
    }


def test_the_loop_goes_through_four_checkpointer_calls():
    assert checkpointer_members((REPO / "trainer" / "loop.py").read_text()) == DOOR


def test_a_fifth_checkpointer_member_in_the_loop_is_found():
    source = "class T:\n    def run(self):\n        self.ckpt.save(b, 'periodic')\n        self.ckpt.wait_for_staging()\n"
    assert checkpointer_members(source) <= DOOR  # the control
    planted = source + "        if self.ckpt.pending is not None:\n            self.ckpt.drain()\n"
    assert checkpointer_members(planted) - DOOR == {"pending", "drain"}


def test_no_other_room_knows_the_checkpoint_layout():
    """The folder names (`step-`, `runs/`, `checkpoint-N`) and the commit marker are built in
    trainer/checkpoint/ only: every other room asks the package (trainer.checkpoint.open_root, ...)."""
    needles = (
        '"step-',
        "'step-",
        "/step-",
        '"runs"',
        "/runs/",
        'f"checkpoint-',
        '_COMMIT"',
        'manifest.json"',
    )
    for pkg in ("steps", "workflows", "gpu", "trainer"):
        for p in (REPO / pkg).rglob("*.py"):
            if "checkpoint" in p.relative_to(REPO).parts[:2]:
                continue
            tree = ast.parse(p.read_text())
            # Documentation (a docstring, a field's docstring) is a bare string statement: it may name them.
            docstrings = {
                id(n.value)
                for n in ast.walk(tree)
                if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
            }
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and id(node) not in docstrings
                ):
                    text = f'"{node.value}"'
                    hits = [n for n in needles if n in text]
                    assert not hits, f"{p.relative_to(REPO)}:{node.lineno} builds a checkpoint path: {hits}"


def test_the_training_loop_reads_no_environment():
    from trainer.loop import Trainer

    source = inspect.getsource(Trainer.run) + inspect.getsource(Trainer._boundary_flags)
    assert "os.environ" not in source and "getenv" not in source
    for module in ("trainer.loop", "trainer.hf"):
        text = (REPO / (module.replace(".", "/") + ".py")).read_text()
        assert (
            "BATON_PAUSE_AFTER_STEP" not in text and "BATON_NOISE" not in text and "BATON_TEST_" not in text
        )
