"""Output for the user commands, kept free of typer: one-line errors and warnings, and
tables (plain aligned text, or drawn by rich on a terminal).

``rich`` is loaded only to draw a short table on a terminal.
"""

from __future__ import annotations

import gc
import os
import sys
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


def print_warning(prog: str, message: str) -> None:
    """Print ``prog: warning: message`` as one line on stderr."""
    print(f"{prog}: warning: {message}", file=sys.stderr)


def print_error(prog: str, message: str) -> None:
    """Print ``prog: error: message`` as exactly one line on stderr."""
    one_line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    print(f"{prog}: error: {one_line}", file=sys.stderr)


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
    if count <= RICH_MAX_ROWS and stream.isatty():
        _print_rich_table(headers, list(zip(*columns)), right_aligned, shrinkable,
                          show_header, stream)
        return
    lines = format_plain_columns(
        headers, columns, right_aligned=right_aligned, shrinkable=shrinkable,
        show_header=show_header,
    )
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
        table.add_row(*(Text(cell) for cell in row))
    console.print(table)
