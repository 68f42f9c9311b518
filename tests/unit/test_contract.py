"""The drill's contract (steps/lib/contract.py) is defined once: no other product module spells its file names
or the signal exit codes, the retry expression is built from trainer/exits.py's codes, and the module stays
torch-free (steps.train, the pod's PID 1, and the local runner read it). Each check is run against a
planted copy that breaks it, so that it can fail."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from steps.lib import contract
from trainer import exits

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("trainer", "steps", "workflows", "gpu", "bench", "infra")
FILE_NAMES = (contract.EVICTIONS_JSON, contract.VERIFY_JSON, *contract.REPORT_FILES)
HOMES = {REPO / "steps" / "lib" / "contract.py", REPO / "trainer" / "exits.py"}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for stmt in body:  # a module's, a class's or a function's docstring, and a field's (after it)
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    out.add(id(stmt.value))
    return out


def spellings(source: str) -> list[str]:
    """Each string constant of `source` that is one of the contract's file names (alone, or as a path's last
    part), and each integer constant 75, 137 or 143; docstrings aside (help text may quote them)."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in skip:
            continue
        v = node.value
        if isinstance(v, str) and any(v == n or v.endswith("/" + n) for n in FILE_NAMES):
            found.append(v)
        elif type(v) is int and v in (exits.EXIT_PREEMPTED, exits.EXIT_SIGKILL, exits.EXIT_SIGTERM):
            found.append(str(v))
    return found


def test_no_product_module_spells_the_contracts_file_names_or_the_retry_exit_codes():
    offenders = {}
    for pkg in PRODUCT:
        for path in (REPO / pkg).rglob("*.py"):
            if path in HOMES or ".venv" in path.parts:
                continue
            found = spellings(path.read_text())
            if found:
                offenders[str(path.relative_to(REPO))] = found
    assert offenders == {}


def test_the_check_finds_a_planted_spelling():
    """Controls: what the drill's code once held (equivalence.py's paths, verify's 137, report.py's names)."""
    assert spellings('x = f"{ROOT}/evictions.json"') == ["/evictions.json"]
    assert spellings("if code == 137:\n    pass") == ["137"]
    assert spellings("if p.returncode not in (0, 75):\n    pass") == ["75"]  # bench/common.py's, once
    assert spellings('for n in ("report.md", "loss.png"):\n    pass') == ["report.md", "loss.png"]
    assert spellings('"""Writes report.json."""\nhelp = "where verify.json goes"') == []


def test_the_retry_expression_is_built_from_the_exit_codes_and_the_messages():
    expr = contract.RETRY_EXPRESSION
    for code in (exits.EXIT_PREEMPTED, exits.EXIT_SIGTERM, exits.EXIT_SIGKILL):
        assert f"asInt(lastRetry.exitCode) == {code}" in expr
    for message in contract.DISRUPTIONS:
        assert message in expr and message in contract.HELPER_RETRY_EXPRESSION
    # Each disruption is a part of the message Argo writes, as the local runner writes it.
    assert contract.DISRUPTIONS[0] in contract.NODE_SHUTDOWN and contract.DISRUPTIONS[2] in contract.LOST_VM
    assert contract.SIGKILLED == "main: Error (exit code 137)" and exits.signal_exit(-9) == 137
    assert exits.signal_exit(-15) == 143 and exits.signal_exit(3) == 3 and exits.signal_exit(None) == -1


def test_the_contract_imports_no_torch_and_nothing_of_the_workflows():
    code = (
        "import sys, steps.lib.contract, steps.lib.local_pods; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'workflows', 'hera', 'numpy')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    # Control: the same probe sees torch when a module that needs it is imported.
    code = code.replace("steps.lib.local_pods", "trainer.rng")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert "torch" in out.stdout


def role_and_task_literals(source: str) -> list[str]:
    """String constants of `source` that are a role or a task name of the contract (docstrings aside)."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    names = set(contract.ROLES) | set(contract.TASKS)
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and id(n) not in skip and n.value in names
    ]


def test_the_drill_definition_names_roles_and_tasks_through_the_contract_only():
    assert role_and_task_literals((REPO / "workflows" / "equivalence.py").read_text()) == []


def test_a_planted_role_literal_in_the_drill_definition_is_found():
    """Controls: what workflows/equivalence.py once held."""
    assert role_and_task_literals('train(name=reference_task, arguments={"role": "reference"})') == [
        "reference"
    ]
    assert role_and_task_literals('Container(name="evict", args=[evidence_root(ROOT, "trial")])') == [
        "evict",
        "trial",
    ]
    assert (
        role_and_task_literals('Container(name="train", args=["--role", role])') == []
    )  # a template, not a task


def tiny_shapes(source: str) -> list[int]:
    """Lines of `source` that spell the tiny network's shape again: a call or dict with trainer/tiny.py's hidden
    size and layer count together (read on the syntax)."""
    from trainer.tiny import TINY_ARCH

    want = {"hidden_size": TINY_ARCH["hidden_size"], "num_hidden_layers": TINY_ARCH["num_hidden_layers"]}
    found = []
    for node in ast.walk(ast.parse(source)):
        pairs: dict[str, object] = {}
        if isinstance(node, ast.Call):
            pairs = {
                k.arg: k.value.value for k in node.keywords if k.arg and isinstance(k.value, ast.Constant)
            }
        elif isinstance(node, ast.Dict):
            pairs = {
                k.value: v.value
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
            }
        if all(pairs.get(k) == v for k, v in want.items()):
            found.append(node.lineno)
    return found


def test_the_tiny_networks_shape_has_one_home():
    offenders = {
        str(p.relative_to(REPO)): lines
        for pkg in PRODUCT
        for p in (REPO / pkg).rglob("*.py")
        if p != REPO / "trainer" / "tiny.py" and (lines := tiny_shapes(p.read_text()))
    }
    assert offenders == {}
    assert tiny_shapes((REPO / "trainer" / "tiny.py").read_text())  # its home spells it


def test_a_second_spelling_of_the_tiny_shape_is_found():
    """Control: gpu/model.py's TINY_SHAPE as it was (a dict of its own, vocab 1024)."""
    planted = "T = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=1024)\n"
    assert tiny_shapes(planted) == [1]
    assert tiny_shapes('T = {"hidden_size": 64, "num_hidden_layers": 2}\n') == [1]
    assert tiny_shapes("T = dict(hidden_size=896, num_hidden_layers=24)\n") == []
