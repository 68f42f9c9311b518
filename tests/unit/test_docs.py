"""The README and docs/*.md name only what exists (issue 37 item 6): a repository path in backticks, in a
code block or in a link; a link's #anchor; a `make TARGET`; a config key of the reference (docs/config.md)
or of a `--set KEY=`; a `--flag` of `python -m steps.X`, `python workflows/equivalence.py` or any other
`python -m MODULE` / `python FILE.py` of this repository; a `-p NAME=` of the drill; a `BATON_*` variable.
And what the docs state twice agrees: a pinned component's version is its pin, and an `N min N s` figure is
one that docs/results.md states (once per table).

Pure text and `ast`: nothing here imports torch or the project but infra/local/pins.py (the pinned
versions' own reader, standard library only). docs/gpu/ is left out: it is what `make gpu-check` wrote on
one H200, copied as it was. Not checked: prose outside backticks and code blocks, the flags of programs
that are not this repository's (torchrun, kubectl, argo, pytest), which subcommand of `equivalence.py` a
flag belongs to (a flag of any subcommand passes), the values given to flags and parameters, and whether
what the docs *say* about a name is true. Each checker has a negative control below that plants a bad name
and requires the checker to report it.
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOP_FOLDERS = (
    "baton",
    "bench",
    "docs",
    "examples",
    "gpu",
    "infra",
    "steps",
    "templates",
    "tests",
    "trainer",
    "workflows",
    ".ci",
)
# Files a repository may have at its root: named bare, each must exist here.
ROOT_FILES = {
    "Makefile",
    "Dockerfile",
    "pyproject.toml",
    "README.md",
    "setup.py",
    "setup.cfg",
    "LICENSE",
    "requirements.txt",
    "CONTRIBUTING.md",
    "CHANGELOG.md",
    ".gitignore",
    ".dockerignore",
    "tox.ini",
}
CONFIG_SECTIONS = ("model", "data", "optim", "checkpoint", "notice", "cadence", "faults")
# Programs whose flags live in more than their own file.
FLAG_SOURCES = {
    "workflows/equivalence.py": ("workflows/equivalence.py", "workflows/cli.py", "workflows/argo.py")
}
DRILL_SUBCOMMANDS = ("run", "submit", "render", "status", "write-templates")


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


# ---- reading Markdown --------------------------------------------------------------------------------------

_FENCE = re.compile(r"^\s*```")
_SPAN = re.compile(r"`([^`]+)`")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def split_markdown(text: str) -> tuple[str, list[str]]:
    """(prose, code lines): fenced blocks' lines (a line ending in a backslash joined to the next) and
    indented command lines go to code; prose keeps its line count, with the fenced lines blanked."""
    prose, code, fenced, pending = [], [], False, ""
    for line in text.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
            prose.append("")
            continue
        if fenced:
            prose.append("")
            pending += line.strip()
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
            else:
                code.append(pending)
                pending = ""
            continue
        if re.match(r"^ {4,}(\S*python3?|make)\s", line):  # an indented code block's command
            code.append(line.strip())
            prose.append("")
            continue
        prose.append(line)
    return "\n".join(prose), code


def code_spans(prose: str) -> list[str]:
    """Inline code, paragraph by paragraph (a span may wrap onto the next line; one unpaired backtick
    cannot shift the pairs of the whole file)."""
    spans = []
    for para in re.split(r"\n\s*\n", prose):
        spans += [" ".join(s.split()) for s in _SPAN.findall(para)]
    return spans


def code_contexts(text: str) -> list[str]:
    prose, code = split_markdown(text)
    return code + code_spans(prose)


def links(text: str) -> list[str]:
    prose, _ = split_markdown(text)
    return [t for t in _LINK.findall(prose) if not re.match(r"^[a-z]+:", t)]  # http:, https:, mailto:


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (but - and _), spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    prose, _ = split_markdown(text)
    seen: dict[str, int] = {}
    out = set()
    for line in prose.split("\n"):
        m = _HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


# ---- what the repository defines ------------------------------------------------------------------------


@cache
def make_targets() -> frozenset[str]:
    targets: set[str] = set()
    for line in (REPO / "Makefile").read_text().split("\n"):
        m = re.match(r"^\.PHONY\s*:(.*)$", line)
        if m:
            targets.update(m.group(1).replace("\\", " ").split())
            continue
        m = re.match(r"^([A-Za-z0-9][\w.\- ]*?)\s*:(?!=)", line)
        if m:
            targets.update(m.group(1).split())
    return frozenset(targets)


def _dataclass_fields(path: Path) -> dict[str, list[tuple[str, str]]]:
    """{class name: [(field, annotation)]} of every @dataclass in `path`."""
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list):
            out[node.name] = [
                (st.target.id, ast.unparse(st.annotation))
                for st in node.body
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
            ]
    return out


@cache
def config_keys() -> frozenset[str]:
    """Every dotted key of `Config` (trainer/config.py), through the dataclasses it nests, wherever they
    are defined (the modules config.py imports them from)."""
    config = REPO / "trainer" / "config.py"
    classes = _dataclass_fields(config)
    for node in ast.parse(config.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainer."):
            if any(a.name.endswith("Config") for a in node.names):
                classes.update(_dataclass_fields(REPO / (node.module.replace(".", "/") + ".py")))
    keys: set[str] = set()

    def walk(cls: str, prefix: str) -> None:
        for name, annotation in classes[cls]:
            if annotation in classes:
                walk(annotation, f"{prefix}{name}.")
            else:
                keys.add(prefix + name)

    walk("Config", "")
    return frozenset(keys)


def _dict_keys(path: Path, name: str) -> set[str]:
    for node in ast.parse(path.read_text()).body:
        target = (
            node.target
            if isinstance(node, ast.AnnAssign)
            else (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        )
        if isinstance(target, ast.Name) and target.id == name and isinstance(node.value, ast.Dict):
            return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    raise AssertionError(f"no dict {name} in {path}")


@cache
def drill_parameters() -> frozenset[str]:
    """The workflow's parameters (workflows/params.py, PARAMETERS) and the local runner's own
    (workflows/cli.py, LOCAL_PARAMETERS): what `-p NAME=VALUE` accepts."""
    return frozenset(
        _dict_keys(REPO / "workflows" / "params.py", "PARAMETERS")
        | _dict_keys(REPO / "workflows" / "cli.py", "LOCAL_PARAMETERS")
    )


@cache
def program_flags(source: str) -> frozenset[str] | None:
    """The flags `add_argument` defines in a program of this repository (`-m steps.train` or a path), or
    None when no such file exists. A flag built by an f-string (gpu/check.py's `--fast-{key}`) is kept as
    its constant prefix, ending in `*`: any flag that starts so passes."""
    if source.startswith("-m "):
        module = source[3:].replace(".", "/")
        candidates = [REPO / f"{module}.py", REPO / module / "__main__.py"]
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            return None
        # A bench section's common flags (--result, --reps, --quick) come from bench/common.py's section_args.
        files = [found] + ([REPO / "bench/common.py"] if "section_args(" in found.read_text() else [])
    else:
        if not (REPO / source).is_file():
            return None
        files = [REPO / f for f in FLAG_SOURCES.get(source, (source,))]
    flags = {"-h", "--help"}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                names = [
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")
                ]
                flags.update(names)
                flags.update(
                    a.values[0].value + "*"
                    for a in node.args
                    if isinstance(a, ast.JoinedStr)
                    and a.values
                    and isinstance(a.values[0], ast.Constant)
                    and str(a.values[0].value).startswith("--")
                )
                if any(
                    "BooleanOptionalAction" in ast.unparse(k.value)
                    for k in node.keywords
                    if k.arg == "action"
                ):
                    flags.update("--no-" + n[2:] for n in names if n.startswith("--"))
    return frozenset(flags)


@cache
def env_names_in_code() -> str:
    """The text of every file that is not documentation, where a BATON_ variable must be read or set."""
    parts = []
    for top in TOP_FOLDERS:
        for path in (REPO / top).rglob("*"):
            if (
                path.is_file()
                and path.suffix in (".py", ".sh", ".yaml", ".yml", ".tf", ".env", "")
                and "docs" not in path.parts
                and path != Path(__file__).resolve()
            ):
                try:
                    parts.append(path.read_text(errors="ignore"))
                except OSError:
                    pass
    parts += [(REPO / f).read_text() for f in ("Makefile", "Dockerfile") if (REPO / f).is_file()]
    return "\n".join(parts)


# ---- the checkers: each returns its problems, one line each ------------------------------------------------

_PLACEHOLDER = re.compile(r"[<>*{}$\[\]…]|\.\.\.|(^|/)[A-Z][A-Z0-9_]+(/|$)")


# Names the docs may keep although they no longer exist, each with why. Only dated records belong here.
STALE = {
    ("docs/results.md", "trainer/ckpt_read.py"): "a dated section (issue 18); now trainer/checkpoint/read.py",
    (
        "docs/results.md",
        "trainer/ckpt_resolve.py",
    ): "a dated section (issue 18); now trainer/checkpoint/resolve.py",
}


def _ignored_by_git(paths: list[str]) -> set[str]:
    """Those of `paths` that git ignores (generated folders such as the gke overlays' Component; a path that
    does not exist is asked about as a file and as a folder)."""
    if not paths:
        return set()
    asked = [q for p in paths for q in (p, p.rstrip("/") + "/")]
    try:
        out = subprocess.run(
            ["git", "check-ignore", "--no-index", "--stdin"],
            input="\n".join(asked),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return set()
    hits = set(out.stdout.split())
    return {p for p in paths if p in hits or p.rstrip("/") + "/" in hits}


def path_problems(text: str, doc: Path) -> list[str]:
    """Repository paths that do not exist: link targets (relative to the page) with their #anchor, and
    paths in code (relative to the repository's root) that start with a top-level folder or are a root file."""
    problems, missing = [], []
    for target in links(text):
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve()
        if path and not file.exists():
            problems.append(f"link to a missing file: {target}")
        elif (
            anchor
            and (not path or file.suffix == ".md")
            and anchor not in anchors(file.read_text() if path else text)
        ):
            problems.append(f"link to a missing heading: {target}")
    for code in code_contexts(text):
        for token in re.split(r"[\s,;()'\"=|]+", code):
            token = re.sub(r":\d[\d,-]*$", "", token.rstrip(".,:;`"))
            if token.startswith("./"):
                token = token[2:]
            if not (token.split("/")[0] in TOP_FOLDERS and "/" in token) and token not in ROOT_FILES:
                continue
            if _PLACEHOLDER.search(token):
                continue
            token, _, test = token.partition("::")  # a pytest node id: the file, and its test function
            if not (REPO / token).exists():
                missing.append(token)
            elif test and not re.search(
                rf"^\s*(async\s+)?def {re.escape(test.split('[')[0])}\(", (REPO / token).read_text(), re.M
            ):
                problems.append(f"no such test: {token}::{test}")
    ignored = _ignored_by_git(sorted(set(missing)))
    problems += [
        f"no such path: {p}"
        for p in dict.fromkeys(missing)
        if p not in ignored and (doc.relative_to(REPO).as_posix(), p) not in STALE
    ]
    return problems


def make_problems(text: str) -> list[str]:
    problems = []
    for code in code_contexts(text):
        for target in re.findall(r"(?:^|[\s;&|(])make\s+([A-Za-z0-9][\w.-]*)(?![\w=])", code):
            if target not in make_targets():
                problems.append(f"no such make target: make {target}")
    return problems


def _is_placeholder_key(key: str) -> bool:
    return key in ("key", "dotted.key") or key.isupper()


def config_problems(text: str, reference: bool) -> list[str]:
    """`--set KEY=` anywhere; in the reference (docs/config.md) also every dotted key in code and every key
    in a table's first column."""
    problems, keys = [], config_keys()
    named: list[str] = []
    for code in code_contexts(text):
        named += [k for k in re.findall(r"--set\s+([A-Za-z_][\w.]*)=", code) if not _is_placeholder_key(k)]
    if reference:
        for code in code_contexts(text):
            m = re.fullmatch(rf"((?:{'|'.join(CONFIG_SECTIONS)})\.[a-z_]+)(?::.*)?", code)
            if m:
                named.append(m.group(1))
        for line in text.split("\n"):
            if line.startswith("| `"):  # a table of config keys (the environment's table is env_problems')
                named += [k for k in _SPAN.findall(line.split("|")[1]) if not k.startswith("BATON_")]
    for key in dict.fromkeys(named):
        if key not in keys:
            problems.append(f"no such config key: {key}")
    return problems


_PROGRAM = re.compile(r"(?:^|[\s\"'(;&|])(?:\S*/)?python3?\s+(-m\s+[\w.]+|[\w./-]+\.py)")


def _commands(code: str) -> list[tuple[str, str]]:
    """(program, the rest of its command line) for each command of this repository in a line of code."""
    out = []
    for m in _PROGRAM.finditer(code):
        program = re.sub(r"^-m\s+", "-m ", m.group(1))
        out.append((program, code[m.end() :]))
    m = re.match(r"^(?:steps\.(\w+)|(evict|verify|compare))\s+(?=-)", code)  # a step, named bare
    if m and not out:
        out.append((f"-m steps.{m.group(1) or m.group(2)}", code[m.end() :]))
    m = re.match(rf"^({'|'.join(DRILL_SUBCOMMANDS)})\s+(?=-)", code)
    if m and not out:
        out.append(("workflows/equivalence.py", code[m.end() :]))
    return out


def _tokens(rest: str) -> list[str]:
    rest = re.split(r"\s#|\s\|\s|&&|;|\$\(|\)", rest)[0]
    try:
        return shlex.split(rest)
    except ValueError:
        return rest.split()


def command_problems(text: str) -> list[str]:
    """Programs of this repository that do not exist, flags they do not define, and `-p NAME=` names that
    are not drill parameters."""
    problems = []
    for code in code_contexts(text):
        for name in re.findall(r"(?:^|[\s\[])-p\s+[\"']?([A-Za-z_]\w*)=", code):
            if not name.isupper() and name not in drill_parameters():
                problems.append(f"no such drill parameter: -p {name}")
        for program, rest in _commands(code):
            top = program.removeprefix("-m ").replace(".", "/").split("/")[0]
            if top not in TOP_FOLDERS:
                continue  # not this repository's program (pytest, pip, ...)
            flags = program_flags(program)
            if flags is None:
                problems.append(f"no such program: python {program}")
                continue
            for token in _tokens(rest):
                flag = token.strip("[]").rstrip(".,:")
                if flag.startswith("--") and len(flag) > 2:
                    flag = flag.split("=")[0]
                    if flag not in flags and not any(
                        f.endswith("*") and flag.startswith(f[:-1]) for f in flags
                    ):
                        problems.append(f"python {program}: no such flag {flag}")
    return problems


def env_problems(text: str) -> list[str]:
    code = env_names_in_code()
    return [
        f"no such environment variable: {v}"
        for v in dict.fromkeys(re.findall(r"\bBATON_[A-Z0-9_]*[A-Z0-9]\b", text))
        if not re.search(rf"\b{v}\b", code)
    ]


# ---- versions and figures stated twice ---------------------------------------------------------------------


def _pyproject_pins() -> dict[str, str]:
    """`name==version` requirements of pyproject.toml, by lowercase name."""
    text = (REPO / "pyproject.toml").read_text()
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r'"([A-Za-z0-9_.-]+)==([0-9][\w.*]*)', text)}


def _module_constant(path: Path, name: str) -> str:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path}: no constant {name}")


@cache
def version_homes() -> dict[str, tuple[str, ...]]:
    """Each pinned component, as the docs name it (a regular expression), and the versions its homes hold: the
    env files of the local cluster, pyproject.toml's pins, and the Argo release the CRDs are also checked
    against (tests/crd.py FORWARD)."""
    from infra.local.pins import PINS as env  # the env files' own reader (torch-free, stdlib only)

    pins = _pyproject_pins()
    return {
        r"argo(?: workflows)?": (env["ARGO_VERSION"], _module_constant(REPO / "tests/crd.py", "FORWARD")),
        r"kubernetes|kubelet|kube-apiserver|k8s": (env["K8S_VERSION"],),
        r"etcd": (env["ETCD_VERSION"],),
        r"kueue": (env["KUEUE_VERSION"],),
        r"jobset": (env["JOBSET_VERSION"],),
        r"torch|pytorch": (pins["torch"],),
        r"transformers": (pins["transformers"],),
        r"hera": (pins["hera"],),
        r"ruff": (pins["ruff"],),
        r"playwright": (pins["playwright"],),
    }


# A version that the docs state of a pinned component and that is not its pin, on purpose: (doc, mention).
OTHER_VERSIONS = {
    (
        "docs/results.md",
        "torch 2.11.0",
    ),  # the GPU machine's own torch in figure 11's run, said to be not the pin
}


def _same_version(stated: str, pinned: str) -> bool:
    stated, pinned = stated.lstrip("v"), pinned.lstrip("v").rstrip("*").rstrip(".")
    return pinned == stated or pinned.startswith(stated + ".") or stated.startswith(pinned + ".")


def version_problems(text: str, doc: Path) -> list[str]:
    """A pinned component named with a version (`Argo v3.7.18`, `torch 2.13`, `Kueue v0.19`): the version is
    its pin, or a prefix of it."""
    problems = []
    for pattern, pinned in version_homes().items():
        for m in re.finditer(rf"\b({pattern})[ -]v?(\d+\.\d+(?:\.\d+)?)\b", text, re.I):
            mention = m.group(0)
            if any(_same_version(m.group(2), v) for v in pinned):
                continue
            if (doc.relative_to(REPO).as_posix(), mention) in OTHER_VERSIONS:
                continue
            problems.append(f"{mention}: the pin is {' or '.join(pinned)}")
    return problems


RESULTS = REPO / "docs" / "results.md"
_DURATION = re.compile(r"\b\d+ min \d+ s\b")


def _subject(row: str) -> str | None:
    """A figures table's row's subject: the command its first cell begins with in backticks (`make test`,
    `cluster up`), or None (a row described in words is not compared)."""
    m = re.match(r"\s*`([^`]+)`", row.split("|")[1])
    return m.group(1) if m else None


def figure_problems(text: str, doc: Path) -> list[str]:
    """docs/results.md is the figures' home: a duration stated elsewhere (`N min N s`) is one that it states,
    and it states each subject once in a table (the newest figure; older ones are in git history)."""
    results = text if doc == RESULTS else RESULTS.read_text()
    if doc != RESULTS:
        return [
            f"{d}: not in docs/results.md" for d in dict.fromkeys(_DURATION.findall(text)) if d not in results
        ]
    problems, seen, figures = [], set(), False
    for line in text.split("\n"):
        if not line.startswith("|"):
            seen, figures = set(), False  # a new table
            continue
        if re.fullmatch(r"\|[\s|:-]*", line):
            continue
        if not seen and not figures:
            figures = line.split("|")[1].strip() == "what"  # the hand-written tables: what | figure | when
            seen.add(None)
            continue
        subject = _subject(line) if figures else None
        if subject is not None and subject in seen:
            problems.append(f"two rows for `{subject}` in one table")
        seen.add(subject)
    return problems


# ---- the docs as they are ---------------------------------------------------------------------------------

CHECKS = {
    "paths and links": lambda text, doc: path_problems(text, doc),
    "make targets": lambda text, doc: make_problems(text),
    "config keys": lambda text, doc: config_problems(text, reference=doc.name == "config.md"),
    "programs, flags and -p parameters": lambda text, doc: command_problems(text),
    "BATON_ variables": lambda text, doc: env_problems(text),
    "versions": version_problems,
    "figures": figure_problems,
}


@pytest.mark.parametrize("check", list(CHECKS))
def test_the_docs_name_only_what_exists(check):
    found = []
    for doc in doc_files():
        found += [f"{doc.relative_to(REPO)}: {p}" for p in CHECKS[check](doc.read_text(), doc)]
    assert not found, "\n".join(found)


def test_the_config_reference_lists_every_key():
    """The other way round: every key trainer/config.py defines is in docs/config.md's table."""
    text = (REPO / "docs" / "config.md").read_text()
    listed = {
        k for line in text.split("\n") if line.startswith("| `") for k in _SPAN.findall(line.split("|")[1])
    }
    assert sorted(config_keys() - listed) == []


def test_the_front_page_is_short_and_indexes_every_page():
    readme = (REPO / "README.md").read_text()
    assert len(readme.split("\n")) <= 220
    linked = {t.partition("#")[0] for t in links(readme)}
    assert {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")} <= linked


def test_what_the_checkers_read_from_the_repository():
    """The sources of truth are found where the checkers look for them (a checker that read nothing would
    pass everything)."""
    assert {"test", "install", "drill", "e2e", "e2e-kind", "cluster-build"} <= make_targets()
    assert {
        "checkpoint.uri",
        "notice.gcp_timeout_s",
        "cadence.mode",
        "faults.read_retry_s",
        "seed",
    } <= config_keys()
    assert {"evictions", "nodes", "chaos", "unschedulable"} <= drill_parameters()
    assert {"--nproc", "--rendezvous", "--set"} <= program_flags("-m steps.train")
    assert {"--out", "--from-file", "--argo-server", "--no-secure"} <= program_flags(
        "workflows/equivalence.py"
    )


# ---- negative controls: each checker reports a planted bad name -----------------------------------------

DOC = REPO / "docs" / "planted.md"


def test_a_missing_path_is_reported():
    text = (
        "See `trainer/no_such.py`, `steps/train.py:12` and `Makefile`.\n\n"
        "```\npython -m trainer --config trainer/configs/no_such.yaml\n```\n"
    )
    assert sorted(path_problems(text, DOC)) == [
        "no such path: trainer/configs/no_such.yaml",
        "no such path: trainer/no_such.py",
    ]
    assert path_problems("`tests/unit/test_docs.py::test_no_such_test`", DOC) == [
        "no such test: tests/unit/test_docs.py::test_no_such_test"
    ]
    assert path_problems("`tests/unit/test_docs.py::test_a_missing_path_is_reported`", DOC) == []


def test_placeholders_and_ignored_paths_are_not_paths():
    text = (
        "`trainer/<name>.py`, `tests/unit/test_*.py`, `models/NAME`, `infra/NAME/x`, "
        "`templates/overlays/gke/generated-by-make-gke-up/`, `out/drill/report.json`"
    )
    assert path_problems(text, DOC) == []


def test_a_missing_link_target_or_heading_is_reported():
    text = "[a](no_such.md), [b](../trainer/no_such.py), [c](config.md#no-such-heading), [d](config.md#keys), [e](#here)\n\n## Here\n"
    assert path_problems(text, DOC) == [
        "link to a missing file: no_such.md",
        "link to a missing file: ../trainer/no_such.py",
        "link to a missing heading: config.md#no-such-heading",
    ]


def test_a_missing_make_target_is_reported():
    text = "Run `make no-such-target`, then `make test` and `PROJECT=p make gke-up`.\n\n```\nmake image MODEL=models/NAME\n```\n"
    assert make_problems(text) == ["no such make target: make no-such-target"]


def test_a_missing_config_key_is_reported():
    table = "| key | default |\n|---|---|\n| `checkpoint.no_such_key` | 1 |\n| `checkpoint.uri`, `optim.nope` | x |\n"
    assert config_problems(table, reference=True) == [
        "no such config key: checkpoint.no_such_key",
        "no such config key: optim.nope",
    ]
    assert config_problems(
        "`python -m trainer --set model.no_such=1 --set seed=3 --set dotted.key=value`", reference=False
    ) == ["no such config key: model.no_such"]


def test_a_missing_flag_program_or_parameter_is_reported():
    text = (
        "```\n"
        "python -m steps.train --nproc 2 --no-such-flag 1 --set seed=1\n"
        "python workflows/equivalence.py run --out x -p no_such_param=1 -p evictions=2 -p NAME=VALUE\n"
        "python workflows/equivalence.py submit --from-file - --no-secure --nope\n"
        "python -m steps.no_such --x\n"
        "python -m pytest --anything   # not this repository's: left alone\n"
        "```\n\n"
        "`steps.evict --no-evict-flag`, `verify --no-verify-flag`, `submit --from-fyle -`, "
        '`-p trainer="my.py --lora-rank 16"`, `evict --nodes 2 --node 1`\n'
    )
    assert command_problems(text) == [
        "python -m steps.train: no such flag --no-such-flag",
        "no such drill parameter: -p no_such_param",
        "python workflows/equivalence.py: no such flag --nope",
        "no such program: python -m steps.no_such",
        "python -m steps.evict: no such flag --no-evict-flag",
        "python -m steps.verify: no such flag --no-verify-flag",
        "python workflows/equivalence.py: no such flag --from-fyle",
    ]


def test_a_missing_environment_variable_is_reported():
    assert env_problems("`BATON_GRACE` and BATON_NO_SUCH_VARIABLE, every `BATON_` variable") == [
        "no such environment variable: BATON_NO_SUCH_VARIABLE"
    ]


def test_a_version_other_than_the_pin_is_reported():
    argo, forward = version_homes()[r"argo(?: workflows)?"]
    text = f"Argo {argo}, Argo {forward}, argo-v3.7, torch 2.13, torch 2.12.0, Kueue v0.18.1, kubelet v1.37, etcd v3.6.0"
    assert sorted(version_problems(text, DOC)) == [
        f"Kueue v0.18.1: the pin is {version_homes()['kueue'][0]}",
        f"etcd v3.6.0: the pin is {version_homes()['etcd'][0]}",
        f"torch 2.12.0: the pin is {_pyproject_pins()['torch']}",
    ]
    # OTHER_VERSIONS holds a mention for its own doc only
    assert version_problems("torch 2.11.0", RESULTS) == []
    assert version_problems("torch 2.11.0", DOC) == [f"torch 2.11.0: the pin is {_pyproject_pins()['torch']}"]


def test_a_figure_not_in_results_or_stated_twice_there_is_reported():
    stated = _DURATION.findall(RESULTS.read_text())[0]
    assert figure_problems(f"took {stated}, then 99 min 59 s", DOC) == ["99 min 59 s: not in docs/results.md"]
    table = "| what | figure |\n|---|---|\n| `make test` in a fresh clone | 1 min 2 s |\n| `make test`, again | 3 min 4 s |\n"
    assert figure_problems(table, RESULTS) == ["two rows for `make test` in one table"]
    # Controls: one row each in two tables; a row in words; a table that is not a figures table.
    one = "| what | figure |\n|---|---|\n| `make test` in a fresh clone | 1 min 2 s |\n"
    assert figure_problems(one + "\n" + one, RESULTS) == []
    assert figure_problems(one + "| the same, again | 3 min 4 s |\n", RESULTS) == []
    assert figure_problems(table.replace("| what |", "| # |"), RESULTS) == []
