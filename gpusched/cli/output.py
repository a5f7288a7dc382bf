"""Output for the user commands, kept free of typer: one-line errors and warnings, and
tables (plain aligned text, or drawn by rich on a terminal).

Whatever reaches the terminal through here has its unprintable characters escaped
(``gpusched.core.terminal``): a stored value cannot move the cursor, set the window
title or reorder the text around it. ``rich`` is loaded only to draw a short table on a
terminal.
"""

from __future__ import annotations

import gc
import os
import sys

from gpusched.core.terminal import terminal_safe, terminal_safe_cells

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Literal, TextIO

PLAIN_WIDTH = 80
TRUNCATED = "+"  # sacct's mark for a cut field; plain ASCII survives any locale
RICH_MAX_ROWS = 200  # longer tables are printed plain, even on a terminal
CLI_GC_THRESHOLD = 100_000  # allocations between young-generation collections (default 700)


def collect_rarely() -> None:
    """A command lives for a fraction of a second: collecting cycles while it builds a
    long queue's rows costs more than the little memory they would free."""
    gc.set_threshold(CLI_GC_THRESHOLD, *gc.get_threshold()[1:])


def reader_gone() -> int:
    """The reader of our output went away (gqueue | head): stop quietly, as coreutils
    do; the exit code to return."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1


def only_me(user: str | None) -> str:
    """The user ``--me`` names: the caller (``--user`` may name them too, no one else)."""
    import pwd

    from gpusched.errors import UsageError

    me = pwd.getpwuid(os.getuid()).pw_name
    if user is not None and user != me:
        raise UsageError("--me and --user name different users")
    return me


def print_warning(prog: str, message: str) -> None:
    """Print ``prog: warning: message`` as one line on stderr."""
    print(f"{prog}: warning: {one_line(message)}", file=sys.stderr)


def print_error(prog: str, message: str) -> None:
    """Print ``prog: error: message`` as exactly one line on stderr (messages of the
    controller may quote what a user stored: they are escaped like any value)."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr)


def one_line(message: str) -> str:
    """A message's lines joined by spaces, every unprintable character left escaped.

    Only newlines join lines: a CR, a line separator (U+2028) or any other control
    within a line is shown as its escape, not taken as a line break."""
    return terminal_safe(" ".join(
        part for part in (raw.strip(" \t\r") for raw in message.split("\n")) if part))


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
    print_columns(headers, _transpose(rows, len(headers)), right_aligned=right_aligned,
                  shrinkable=shrinkable, show_header=show_header, out=out)


def print_columns(
    headers: Sequence[str],
    columns: Sequence[Sequence[str]],
    *,
    right_aligned: frozenset[int] = frozenset(),
    shrinkable: frozenset[int] = frozenset(),
    show_header: bool = True,
    out: TextIO | None = None,
) -> None:
    """``print_table`` for a table given column by column (one list of cells per
    header), the shape a long queue is built in."""
    stream = sys.stdout if out is None else out
    count = len(columns[0]) if columns else 0
    headers, columns = _safe(headers, columns)
    if count <= RICH_MAX_ROWS and stream.isatty():
        _print_rich_table(headers, list(zip(*columns)), right_aligned, shrinkable,
                          show_header, stream)
        return
    lines = _plain_lines(headers, columns, right_aligned, shrinkable, show_header, PLAIN_WIDTH)
    if lines:
        stream.write("\n".join(lines) + "\n")


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
    return format_plain_columns(
        headers, _transpose(rows, len(headers)), right_aligned=right_aligned,
        shrinkable=shrinkable, show_header=show_header, width=width)


def format_plain_columns(
    headers: Sequence[str],
    columns: Sequence[Sequence[str]],
    *,
    right_aligned: frozenset[int] = frozenset(),
    shrinkable: frozenset[int] = frozenset(),
    show_header: bool = True,
    width: int = PLAIN_WIDTH,
) -> list[str]:
    """``format_plain_table`` for a table given column by column."""
    headers, columns = _safe(headers, columns)
    return _plain_lines(headers, columns, right_aligned, shrinkable, show_header, width)


def _safe(headers: Sequence[str], columns: Sequence[Sequence[str]]
          ) -> tuple[list[str], list[Sequence[str]]]:
    """Headers and cells with their unprintable characters escaped, so that widths are
    measured on what is shown."""
    return [terminal_safe(h) for h in headers], [terminal_safe_cells(c) for c in columns]


def _plain_lines(
    headers: Sequence[str],
    columns: Sequence[Sequence[str]],
    right_aligned: frozenset[int],
    shrinkable: frozenset[int],
    show_header: bool,
    width: int,
) -> list[str]:
    count = len(columns[0]) if columns else 0
    if not count and not show_header:
        return []
    natural = [max(len(header) if show_header else 0, max(map(len, column), default=0))
               for header, column in zip(headers, columns)]
    floors = [min(len(header), natural[i]) for i, header in enumerate(headers)]
    widths = fit_widths(natural, floors, shrinkable, width)
    last = len(headers) - 1
    # One %-format for every line ("%5s %-9s %s", twice as fast as str.format); only
    # columns narrowed to fit are cut cell by cell, so a long queue is laid out at C speed.
    template = " ".join(
        f"%{w}s" if i in right_aligned else "%s" if i == last else f"%-{w}s"
        for i, w in enumerate(widths))
    cells = [column if w >= natural[i] else [_cut(cell, w) for cell in column]
             for i, (column, w) in enumerate(zip(columns, widths))]
    lines = [(template % tuple(_cut(h, w) for h, w in zip(headers, widths))).rstrip()
             ] if show_header else []
    lines.extend((template % row).rstrip() for row in zip(*cells))
    return lines


def _transpose(rows: Sequence[Sequence[str]], width: int) -> list[Sequence[str]]:
    """The columns of ``rows`` (``width`` empty ones when there are no rows)."""
    return list(zip(*rows)) if rows else [[] for _ in range(width)]


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
        # (The cells were escaped by the caller: Text() leaves ESC and C1 as they are.)
        table.add_row(*(Text(cell) for cell in row))
    console.print(table)
