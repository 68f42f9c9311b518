"""Numbers from outside the code (environment variables, workflow parameters, command-line flags), read by
one rule: a plain decimal of bounded length, finite, inside a range the code can use. Torch-free: the
pod's PID 1 and the workflow CLI read numbers before anything else is imported.

Why each part: Python's `int()` of thousands of digits raises deep inside the conversion; `float()` takes
`nan`, `inf` and `1_0`; a finite but huge grace overflows a timer later (`threading.Timer` refuses
timeouts past `threading.TIMEOUT_MAX`); a huge step count or eviction count makes a list of that size.
So the text is checked before it is converted, and the value against both ends of its range.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass
from typing import NoReturn

from trainer.exits import EXIT_FAIL

MAX_CHARS = 32
"""The longest number text read: 2**63 has 19 digits, and a float's exponent form fits well inside."""
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")


class OutOfRange(ValueError):
    """A number in a spelling or outside a range baton reads. The message names where it came from;
    `rule` is the rest ("must be ..., got ...")."""

    def __init__(self, where: str, rule: str) -> None:
        super().__init__(f"{where} {rule}")
        self.rule = rule


@dataclass(frozen=True)
class Bound:
    """A number's range: `low` <= value <= `high` (`low` excluded when `above`, `high` when `below`); whole
    numbers only when `integer`."""

    low: float
    high: float
    integer: bool = False
    above: bool = False
    below: bool = False

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        low = str(int(self.low)) if self.integer else f"{self.low:g}"
        high = str(int(self.high)) if self.integer else f"{self.high:g}"
        return f"{kind} {'>' if self.above else '>='} {low} and {'<' if self.below else '<='} {high}"

    def holds(self, value: float) -> bool:
        return (
            math.isfinite(value)
            and (value > self.low if self.above else value >= self.low)
            and (value < self.high if self.below else value <= self.high)
        )


def parse(raw: str, where: str, bound: Bound) -> int | float:
    """`raw` read as `bound` says, or OutOfRange naming `where` (a variable, a parameter, a flag) and the
    range. The text is shown cut short: a value of thousands of digits is not echoed whole."""
    text = raw.strip()
    shown = repr(text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + "...")
    pattern = _INTEGER if bound.integer else _DECIMAL
    rule = f"must be {bound.describe()}, got {shown}"
    if len(text) > MAX_CHARS or not pattern.fullmatch(text):
        raise OutOfRange(where, rule)
    value: int | float = int(text) if bound.integer else float(text)
    if not bound.holds(value):
        raise OutOfRange(where, rule)
    return value


def flag_type(bound: Bound):
    """An argparse `type=` for a flag: the parsed number, or argparse's error "argument --FLAG: must be
    ..." (ArgParser prints it as one line and exits 1)."""

    def convert(raw: str) -> int | float:
        try:
            return parse(raw, "", bound)
        except OutOfRange as e:
            raise argparse.ArgumentTypeError(e.rule) from None

    return convert


class ArgParser(argparse.ArgumentParser):
    """argparse, with a usage error as one line `error: ...` and exit 1 (the exit-code rule's "a retry
    cannot help", trainer/exits.py) instead of argparse's usage block and exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_FAIL)
