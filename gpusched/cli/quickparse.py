"""The common command lines of the user commands, parsed without typer.

typer and click cost tens of milliseconds to import and to build a command from its
declarations, on every call. A command line made only of options and arguments that
are plain to parse (strings, integers, flags) is parsed here instead, from a table that
``gpusched.cli.tablegen`` derives from the typer declarations themselves (which stay the
one source of truth: tests/cli/test_quickparse.py holds the table equal to them and the
two parsers to the same results). Anything else (--help, an unknown or malformed option,
a value typer would refuse) is declined, and the command runs through typer as before,
which gives its usual answer or error.
"""

from __future__ import annotations

# Nothing here imports typing, re or collections at run time: this module is on the
# path of every common gsubmit and gqueue (see tests/cli/test_cli_imports.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any


class Table:
    """What a command accepts, as the typer command declares it."""

    __slots__ = ("options", "arguments", "interspersed", "defaults")

    def __init__(self, options: Mapping[str, tuple[str, str, Any]],
                 arguments: tuple[tuple[str, int], ...], interspersed: bool,
                 defaults: Mapping[str, Any]) -> None:
        # Each option string: (parameter, kind, extra). kind "flag": extra is the value
        # it sets; "int": extra is the minimum (or None); "str"; "typer": only typer
        # parses it.
        self.options = options
        # (parameter, nargs) of each argument in order; nargs 1 or -1 (all the rest).
        self.arguments = arguments
        self.interspersed = interspersed  # whether options may follow arguments
        self.defaults = defaults  # every parameter's value when nothing is given


class Source:
    """Where a value came from, named as click's ParameterSource names it."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


COMMANDLINE = Source("COMMANDLINE")
DEFAULT = Source("DEFAULT")


class QuickArgs:
    """A parsed command line: what the command's callback reads of a click context."""

    def __init__(self, params: dict[str, Any], given: set[str]) -> None:
        self.params = params
        self.given = given

    def get_parameter_source(self, name: str) -> Source:
        """COMMANDLINE for a parameter the command line gave, else DEFAULT."""
        return COMMANDLINE if name in self.given else DEFAULT


class Declined(Exception):
    """The command line is not one this parser takes: typer must parse it."""


def quick_parse(table: Table, argv: Sequence[str]) -> QuickArgs:
    """Parse ``argv`` as typer would, or raise Declined."""
    params = dict(table.defaults)
    given: set[str] = set()
    positional: list[str] = []
    rest = list(argv)
    while rest:
        token = rest.pop(0)
        if not token or token == "--":
            raise Declined(token)
        if token[0] != "-" or token == "-":
            positional.append(token)
            if not table.interspersed:
                positional.extend(rest)
                break
            continue
        name, value = _split(token, rest, table)
        parameter, kind, extra = table.options[name]
        params[parameter] = _value(kind, extra, value)
        given.add(parameter)
    _place(table, positional, params, given)
    return QuickArgs(params, given)


def _split(token: str, rest: list[str], table: Table) -> tuple[str, str | None]:
    """The option a token names and its value (None for a flag), taking the value from
    the next token where it is not attached."""
    if token.startswith("--"):
        name, equals, attached = token.partition("=")
        spec = table.options.get(name)
        if spec is None:
            raise Declined(token)
        if spec[1] == "flag":
            if equals:
                raise Declined(token)
            return name, None
        if equals:
            return name, attached
    else:
        # One short option: "-u alice" or "-ualice"; grouped flags ("-Hs") and "-u=x"
        # are left to typer.
        name, attached = token[:2], token[2:]
        spec = table.options.get(name)
        if spec is None or "=" in token:
            raise Declined(token)
        if spec[1] == "flag":
            if attached:
                raise Declined(token)
            return name, None
        if attached:
            return name, attached
    if not rest:
        raise Declined(token)
    return name, rest.pop(0)


def _value(kind: str, extra: Any, value: str | None) -> Any:
    if kind == "flag":
        return extra
    if kind == "str" and value is not None:
        return value
    if kind == "int" and value is not None:
        text = value.strip()
        digits = text[1:] if text[:1] in ("+", "-") else text
        # [+-]?[0-9]+ only: int() would also take "1_000" and other digits ("٣"); and
        # not so many that int() refuses them (4300): typer answers for those.
        if not (digits.isascii() and digits.isdigit()) or len(digits) > 18 or (
                extra is not None and int(text) < extra):
            raise Declined(value)
        return int(text)
    raise Declined(value or kind)


def _place(table: Table, positional: list[str], params: dict[str, Any],
           given: set[str]) -> None:
    """Hand the arguments to the declared positional parameters, in order."""
    for parameter, nargs in table.arguments:
        if not positional:
            return
        if nargs == -1:
            params[parameter], positional = list(positional), []
        else:
            params[parameter] = positional.pop(0)
        given.add(parameter)
    if positional:
        raise Declined(positional[0])
