"""A safe evaluator for the subset of Argo's ``retryStrategy.expression`` the local runner accepts.

Argo evaluates these with expr-lang; this module reimplements only what the drill needs, with a
tokenizer and a recursive-descent parser (never ``eval``):

- operators ``||``, ``&&``, ``!``, ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``matches``
  (Go RE2 approximated by Python's ``re.search``) and parentheses;
- string literals in single or double quotes, non-negative integer literals;
- the function ``asInt(x)``;
- the identifiers ``lastRetry.exitCode``, ``lastRetry.status``, ``lastRetry.message`` and
  ``lastRetry.duration``. Argo binds all four to *strings*, so ``lastRetry.exitCode == 75`` is
  always false there and here; write ``asInt(lastRetry.exitCode) == 75`` or ``== "75"``.

Precedence follows expr-lang: ``||`` < ``&&`` < comparisons (all one level, left-associative) < ``!``.
``parse`` raises ``ExprError`` for anything outside the subset, so a spec can be refused before
anything runs; ``evaluate`` raises ``ExprError`` for type errors found only at run time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

VARIABLES = frozenset({"lastRetry.exitCode", "lastRetry.status", "lastRetry.message", "lastRetry.duration"})
FUNCTIONS = frozenset({"asInt"})
_COMPARISONS = ("==", "!=", "<=", ">=", "<", ">")

_TOKEN_RE = re.compile(
    r"""\s*(?:
        (?P<num>\d+)
      | (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
      | (?P<op>\|\||&&|==|!=|<=|>=|<|>|!|\(|\)|,)
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
    )""",
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}


class ExprError(ValueError):
    """The expression is outside the supported subset, or failed to evaluate."""


@dataclass(frozen=True)
class Expr:
    """A parsed expression; ``source`` is kept for messages."""

    source: str
    tree: tuple

    def evaluate(self, env: dict[str, str]) -> bool:
        value = _eval(self.tree, env)
        if not isinstance(value, bool):
            raise ExprError(f"expression {self.source!r} gave {value!r}, not a boolean")
        return value


def _unquote(literal: str) -> str:
    body = literal[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), body)


def _tokenize(source: str) -> list[tuple[str, Any]]:
    tokens: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(source):
        if source[pos:].strip() == "":
            break
        m = _TOKEN_RE.match(source, pos)
        if not m or m.end() == pos:
            raise ExprError(f"unexpected character {source[pos:].lstrip()[:1]!r} at offset {pos}")
        kind = m.lastgroup
        text = m.group(kind)
        if kind == "num":
            tokens.append(("lit", int(text)))
        elif kind == "str":
            tokens.append(("lit", _unquote(text)))
        else:
            tokens.append((kind, text))
        pos = m.end()
    tokens.append(("end", None))
    return tokens


class _Parser:
    def __init__(self, source: str) -> None:
        self.tokens = _tokenize(source)
        self.i = 0

    def peek(self) -> tuple[str, Any]:
        return self.tokens[self.i]

    def take(self) -> tuple[str, Any]:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def expect(self, kind: str, text: str) -> None:
        tok = self.take()
        if tok != (kind, text):
            raise ExprError(f"expected {text!r}, found {tok[1]!r}")

    def parse(self) -> tuple:
        tree = self.or_()
        if self.peek()[0] != "end":
            raise ExprError(f"unexpected {self.peek()[1]!r}")
        return tree

    def or_(self) -> tuple:
        left = self.and_()
        while self.peek() == ("op", "||"):
            self.take()
            left = ("or", left, self.and_())
        return left

    def and_(self) -> tuple:
        left = self.comparison()
        while self.peek() == ("op", "&&"):
            self.take()
            left = ("and", left, self.comparison())
        return left

    def comparison(self) -> tuple:
        left = self.unary()
        while True:
            kind, text = self.peek()
            if kind == "op" and text in _COMPARISONS:
                self.take()
                left = ("cmp", text, left, self.unary())
            elif (kind, text) == ("name", "matches"):
                self.take()
                right = self.unary()
                if right[0] == "lit":
                    if not isinstance(right[1], str):
                        raise ExprError("'matches' needs a string pattern")
                    try:
                        re.compile(right[1])
                    except re.error as exc:
                        raise ExprError(f"bad regular expression {right[1]!r}: {exc}") from None
                left = ("matches", left, right)
            else:
                return left

    def unary(self) -> tuple:
        if self.peek() == ("op", "!"):
            self.take()
            return ("not", self.unary())
        return self.primary()

    def primary(self) -> tuple:
        kind, value = self.take()
        if kind == "lit":
            return ("lit", value)
        if (kind, value) == ("op", "("):
            inner = self.or_()
            self.expect("op", ")")
            return inner
        if kind == "name":
            if self.peek() == ("op", "("):
                if value not in FUNCTIONS:
                    raise ExprError(f"unknown function {value!r}")
                self.take()
                arg = self.or_()
                self.expect("op", ")")
                return ("call", value, arg)
            if value not in VARIABLES:
                raise ExprError(f"unknown identifier {value!r} (supported: {', '.join(sorted(VARIABLES))})")
            return ("var", value)
        raise ExprError("unexpected end of expression" if kind == "end" else f"unexpected {value!r}")


def parse(source: str) -> Expr:
    """Parse ``source``; raise ``ExprError`` naming the first unsupported construct."""
    if not isinstance(source, str) or not source.strip():
        raise ExprError("expression must be a non-empty string")
    return Expr(source, _Parser(source).parse())


def _as_bool(value: Any, op: str) -> bool:
    if not isinstance(value, bool):
        raise ExprError(f"{op} needs booleans, got {value!r}")
    return value


def _eval(tree: tuple, env: dict[str, str]) -> Any:
    tag = tree[0]
    if tag == "lit":
        return tree[1]
    if tag == "var":
        return env[tree[1]]
    if tag == "not":
        return not _as_bool(_eval(tree[1], env), "!")
    if tag == "and":  # short-circuit like expr-lang
        return _as_bool(_eval(tree[1], env), "&&") and _as_bool(_eval(tree[2], env), "&&")
    if tag == "or":
        return _as_bool(_eval(tree[1], env), "||") or _as_bool(_eval(tree[2], env), "||")
    if tag == "call":  # asInt is the only function
        arg = _eval(tree[2], env)
        if isinstance(arg, bool):
            raise ExprError(f"asInt({arg!r})")
        if isinstance(arg, int):
            return arg
        if isinstance(arg, str) and re.fullmatch(r"[+-]?\d+", arg):
            return int(arg)
        raise ExprError(f"asInt({arg!r}): not an integer")
    if tag == "matches":
        subject, pattern = _eval(tree[1], env), _eval(tree[2], env)
        if not isinstance(subject, str) or not isinstance(pattern, str):
            raise ExprError(f"matches needs strings, got {subject!r} and {pattern!r}")
        return re.search(pattern, subject) is not None
    if tag == "cmp":
        op, left, right = tree[1], _eval(tree[2], env), _eval(tree[3], env)
        if op in ("==", "!="):
            # expr-lang: values of different types are never equal (and True is not 1).
            same = type(left) is type(right) and left == right
            return same if op == "==" else not same
        if type(left) is not type(right) or isinstance(left, bool):
            raise ExprError(f"cannot compare {left!r} {op} {right!r}")
        return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[op]
    raise AssertionError(tag)
