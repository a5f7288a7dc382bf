"""Reading a TOML configuration file and its tables, with errors that name the file
and the key: the part of ``gpusched.config`` that the CLIs need too, kept light (stdlib
only) so that they can read their few keys without loading the whole configuration."""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpusched.core.timefmt import TimeFormatError, parse_time_limit
from gpusched.errors import ConfigError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")


def shown(key: object) -> str:
    """A key as a message names it: as written, or quoted where it holds a character
    that is not printable (a newline would break the message's one line)."""
    text = str(key)
    return text if text.isprintable() else repr(text)


class TableReader:
    """Typed access to one TOML table, with errors that name file and key."""

    def __init__(self, source: str, table: Mapping[str, Any], prefix: str) -> None:
        self.source, self.table, self.prefix = source, table, prefix

    def fail(self, key: str, expected: str) -> ConfigError:
        value = self.table.get(key)
        try:
            got = repr(value)
        except ValueError:  # an int past 4300 digits (TOML's 0b/0x literals reach there)
            got = "a number too long to show"
        return ConfigError(f"{self.source}: {self.prefix}{shown(key)}: expected {expected}, "
                           f"got {got}")

    def check_keys(self, allowed: set[str]) -> None:
        for key in self.table:
            if key not in allowed:
                raise ConfigError(f"{self.source}: {self.prefix}{shown(key)}: unknown key; expected one "
                                  f"of {', '.join(sorted(allowed))}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any, expected: str) -> Any:
        if key not in self.table:
            return default
        value = self.table[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            try:
                value = float(value)
            except OverflowError:  # an integer past any float (TOML reads them whole)
                raise self.fail(key, expected) from None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(key, expected)
        return value

    def positive(self, key: str, default: float, allow_zero: bool = False) -> float:
        expected = "0 or more seconds" if allow_zero else "a positive number of seconds"
        value = self.get(key, float, default, expected)
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            raise self.fail(key, expected)
        return float(value)

    def time_limit(self, key: str) -> int | None:
        text = self.get(key, str, None, "a time such as '1-00:00:00' or 'UNLIMITED'")
        if text is None:
            return None
        try:
            return parse_time_limit(text)
        except TimeFormatError:
            raise self.fail(key, "a time such as '1-00:00:00' or 'UNLIMITED'") from None

    def absolute_path(self, key: str, default: Path) -> Path:
        value = self.get(key, str, str(default), "an absolute path")
        if not value.startswith("/"):
            raise self.fail(key, "an absolute path")
        return Path(value)

    def sub(self, key: str) -> TableReader:
        value = self.table.get(key, {})
        if not isinstance(value, dict):
            raise self.fail(key, "a table")
        return TableReader(self.source, value, f"{self.prefix}{key}.")

    def name(self, key: str, default: str | None = None) -> str:
        value = self.get(key, str, default, "a name of letters, digits, '_', '.', '-'")
        if value is None or not NAME.match(value):
            raise self.fail(key, "a name of letters, digits, '_', '.', '-'")
        return str(value)


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; every way it can fail is a ConfigError naming the file."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such configuration file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the configuration file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid TOML: the file is not UTF-8 text") from None
    except ValueError as exc:  # TOMLDecodeError, or int() of more than 4300 digits
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
