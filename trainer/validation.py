"""The error that every config check raises, and the one-line check that raises it."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config that cannot be run. The message names the offending key."""


def require(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"config key '{key}': {msg}")
