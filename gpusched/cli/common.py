"""Plumbing the user CLIs share: one-line errors, exit codes and a table printer.

Kept cheap to import: ``rich`` is loaded only to draw a table on a terminal.
"""

from __future__ import annotations

import gc
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, Literal, TextIO

import typer
from typer.main import get_command

from gpusched.errors import GpuschedError, UsageError

PLAIN_WIDTH = 80
TRUNCATED = "+"  # sacct's mark for a cut field; plain ASCII survives any locale
RICH_MAX_ROWS = 200  # longer tables are printed plain, even on a terminal
CLI_GC_THRESHOLD = 100_000  # allocations between young-generation collections (default 700)


def new_app(help_text: str) -> typer.Typer:
    """A typer app set up for one-line errors: no rich panels, no pretty tracebacks."""
    return typer.Typer(
        help=help_text,
        add_completion=False,
        rich_markup_mode=None,
        pretty_exceptions_enable=False,
    )


# The commands whose completion 'gpusched completion SHELL' sets up.
COMMANDS = ("gsubmit", "gqueue", "gcancel", "ginfo", "gacct", "gcontrol", "gpusched")
SHELLS = ("bash", "zsh", "fish")


def completion_variable(prog: str) -> str:
    """The environment variable through which a shell asks PROG for completions."""
    return f"_{prog.replace('-', '_').upper()}_COMPLETE"


def completion_scripts(shell: str) -> str:
    """The completion code of every gpusched command for ``shell`` (typer's scripts)."""
    from typer._completion_shared import get_completion_script

    if shell not in SHELLS:
        raise UsageError(f"invalid shell {shell!r}: expected one of {', '.join(SHELLS)}")
    return "\n".join(get_completion_script(prog_name=prog, complete_var=completion_variable(prog),
                                           shell=shell).strip() + "\n" for prog in COMMANDS)


def only_me(user: str | None) -> str:
    """The user ``--me`` names: the caller (``--user`` may name them too, no one else)."""
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name
    if user is not None and user != me:
        raise UsageError("--me and --user name different users")
    return me


def print_warning(prog: str, message: str) -> None:
    """Print ``prog: warning: message`` as one line on stderr."""
    print(f"{prog}: warning: {message}", file=sys.stderr)


def print_error(prog: str, message: str) -> None:
    """Print ``prog: error: message`` as exactly one line on stderr."""
    one_line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    print(f"{prog}: error: {one_line}", file=sys.stderr)


def run_cli(app: typer.Typer, prog: str, argv: Sequence[str] | None = None) -> int:
    """Run a typer app as PROG and return its exit code.

    User errors never show a traceback: a ``GpuschedError`` prints one line and exits
    with its ``exit_code``; a usage error (unknown flag, bad value) prints one line and
    exits 2. The command may return an int to choose its exit code.
    """
    # A command lives for a fraction of a second: collecting cycles while it builds a
    # long queue's rows costs more than the little memory they would free.
    gc.set_threshold(CLI_GC_THRESHOLD, *gc.get_threshold()[1:])
    if completion_variable(prog) in os.environ:
        # The shell asks for completions (scripts from 'gpusched completion SHELL'):
        # typer's completers answer, and the command ends there.
        from typer._completion_classes import completion_init

        completion_init()
    command = get_command(app)
    use_light_coercion(command)
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = command.main(args=args, prog_name=prog, standalone_mode=False)
        sys.stdout.flush()
    except GpuschedError as err:
        print_error(prog, err.message)
        return err.exit_code
    except typer.TyperException as err:  # click's UsageError and friends
        hint = f" (see '{prog} --help')" if err.exit_code == 2 else ""
        print_error(prog, err.format_message() + hint)
        return err.exit_code
    except typer.Abort:
        print_error(prog, "aborted")
        return 1
    except BrokenPipeError:
        # The reader went away (gqueue | head); stop quietly, as coreutils do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return result if isinstance(result, int) else 0


class _LightCoercion:
    """Converts a CLI string to str, int (with an optional minimum) or a list of them.

    Stands in for typer's own coercion, which builds a pydantic TypeAdapter per
    parameter: ~75 ms of imports and schema building on every start, half the time
    budget of a user CLI. Only the simple types the user CLIs use are handled here.
    """

    def __init__(self, element: type, minimum: int | None, many: bool) -> None:
        self.element = element
        self.minimum = minimum
        self.many = many

    def coerce(self, value: object, param: Any, ctx: Any) -> object:
        """Convert ``value`` as typer's runtime coercion would (same contract)."""
        if value is None:
            return () if self.many else None
        if self.many:
            assert isinstance(value, (list, tuple))
            return [self._one(item, param, ctx) for item in value]
        return self._one(value, param, ctx)

    def _one(self, value: object, param: Any, ctx: Any) -> object:
        if self.element is bool or self.element is str:
            return value if self.element is bool else str(value)
        text = str(value).strip()
        # Stricter than int(), which also takes "1_000" and non-ASCII digits.
        if not re.fullmatch(r"[+-]?[0-9]+", text):
            raise typer.BadParameter(f"{value!r} is not an integer", ctx=ctx, param=param)
        number = int(text)
        if self.minimum is not None and number < self.minimum:
            raise typer.BadParameter(
                f"{number} is below the minimum of {self.minimum}", ctx=ctx, param=param,
            ) from None
        return number


def use_light_coercion(command: Any) -> None:
    """Give each simple parameter of a typer-built command the light coercion above.

    Relies on typer's lazily built ``_runtime_param`` slot; when a typer release
    changes it, the parameter keeps typer's own (slower, equally correct) coercion.
    tests/cli/test_cli_imports.py notices that through pydantic being imported.
    """
    # click builds the --help option lazily, outside ``params``; fetch (and cache) it now.
    help_option = command.get_help_option(command.context_class(command))
    for param in [*command.params, *([help_option] if help_option is not None else [])]:
        descriptor = getattr(param, "type_descriptor", None)
        if descriptor is None or getattr(param, "_runtime_param", "absent") is not None:
            continue
        annotation = descriptor.annotation
        many = getattr(annotation, "__origin__", None) is list
        element = annotation.__args__[0] if many else annotation
        info = descriptor.parameter_info
        if element not in (str, int, bool) or info.max is not None or info.parser is not None:
            continue
        minimum = info.min if element is int else None
        param._runtime_param = _LightCoercion(element, minimum, many)


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    right_aligned: frozenset[int] = frozenset(),
    shrinkable: frozenset[int] = frozenset(),
    show_header: bool = True,
    out: TextIO | None = None,
) -> None:
    """Print rows as a rich table on a terminal, as plain aligned text otherwise (and
    for long tables: rich takes about half a millisecond a row)."""
    stream = sys.stdout if out is None else out
    if len(rows) <= RICH_MAX_ROWS and stream.isatty():
        _print_rich_table(headers, rows, right_aligned, shrinkable, show_header, stream)
        return
    lines = format_plain_table(
        headers, rows, right_aligned=right_aligned, shrinkable=shrinkable,
        show_header=show_header,
    )
    for line in lines:
        stream.write(line + "\n")


def format_plain_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    right_aligned: frozenset[int] = frozenset(),
    shrinkable: frozenset[int] = frozenset(),
    show_header: bool = True,
    width: int = PLAIN_WIDTH,
) -> list[str]:
    """Lay rows out in columns separated by one space, within ``width`` if it can.

    Only ``shrinkable`` columns are cut (a cut cell ends in ``+``); ids and times never
    are, since a wrong one is worse than a long line.
    """
    shown: list[Sequence[str]] = [headers, *rows] if show_header else list(rows)
    if not shown:
        return []
    natural = [max(map(len, column)) for column in zip(*shown)]
    floors = [min(len(header), natural[i]) for i, header in enumerate(headers)]
    widths = fit_widths(natural, floors, shrinkable, width)
    last = len(headers) - 1
    # One format string for every line ("{:>5} {:<9} {}"); only columns narrowed to fit
    # are cut cell by cell, so a long queue is laid out at C speed.
    template = " ".join(
        f"{{:>{w}}}" if i in right_aligned else "{}" if i == last else f"{{:<{w}}}"
        for i, w in enumerate(widths))
    narrowed = [i for i, w in enumerate(widths) if w < natural[i]]
    lines = []
    for row in shown:
        if narrowed:
            row = list(row)
            for i in narrowed:
                row[i] = _cut(row[i], widths[i])
        lines.append(template.format(*row).rstrip())
    return lines


def fit_widths(
    natural: Sequence[int], floors: Sequence[int], shrinkable: frozenset[int], limit: int,
    *, separator: int = 1,
) -> list[int]:
    """Narrow the widest shrinkable columns, one character at a time, until they fit."""
    widths = list(natural)
    separators = separator * (len(widths) - 1)
    while sum(widths) + separators > limit:
        candidates = [i for i in shrinkable if widths[i] > max(floors[i], 1)]
        if not candidates:
            break  # cannot fit without cutting ids or times; let the line be long
        widest = max(candidates, key=lambda i: (widths[i], i))  # ties: cut the later column
        widths[widest] -= 1
    return widths


def _cut(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, marked when something was removed."""
    if len(text) <= width:
        return text
    return text[: max(width - 1, 0)] + TRUNCATED


def _print_rich_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    right_aligned: frozenset[int],
    shrinkable: frozenset[int],
    show_header: bool,
    stream: TextIO,
) -> None:
    """Draw the table with rich (imported here: it costs tens of milliseconds)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=stream)
    shown = [list(headers), *map(list, rows)] if show_header else [list(r) for r in rows]
    natural = [max([1, *(len(row[i]) for row in shown)]) for i in range(len(headers))]
    floors = [min(len(header), natural[i]) for i, header in enumerate(headers)]
    # Widths are chosen here, not by rich: rich narrows every column alike and would
    # cut job ids and states before names. Columns are two spaces apart.
    widths = fit_widths(natural, floors, shrinkable, console.width, separator=2)
    table = Table(box=None, show_header=show_header, header_style="bold", pad_edge=False)
    for i, header in enumerate(headers):
        justify: Literal["left", "right"] = "right" if i in right_aligned else "left"
        table.add_column(header, justify=justify, no_wrap=True, overflow="ellipsis", width=widths[i])
    for row in rows:
        # Text(), not str: a job name like "[red]x" must not be read as rich markup.
        table.add_row(*(Text(cell) for cell in row))
    console.print(table)
