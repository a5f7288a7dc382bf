"""Text made safe to print on a terminal, whatever was stored (pure).

A stored job name, reason, path or node name may hold characters a terminal acts on
instead of showing: ESC and the other C0 controls (``ESC ]0;...`` sets a window title,
``ESC [2J`` clears the screen), DEL, the C1 controls (``U+009B`` is a one-character CSI
on many terminals), format characters such as the bidirectional overrides and isolates
(``U+202E`` shows ``txt.sh`` as ``hs.txt``) and zero-width characters, line and
paragraph separators, lone surrogates (which cannot even be encoded) and unassigned
code points. Submissions refuse them (``gpusched.core.bounds``), but rows written before
that check, or by anything else that reaches the database, may still hold them.

Every such character is shown as the escape Python's ``repr`` would write: ``\\t``,
``\\n``, ``\\r``, then ``\\xHH``, ``\\uHHHH`` or ``\\UHHHHHHHH``. The set is exactly
the characters for which ``str.isprintable()`` is false, the same rule the submission
check applies, so anything a user can submit is shown as it is: ``é``, ``日本``, emoji.
(Spaces other than U+0020, such as U+00A0, and zero-width joiners are escaped too: they
make two different names look the same.)

A backslash is shown as it is, not doubled: names and paths with backslashes read as
typed, and error messages that quote a value with ``repr`` are not escaped twice. The
cost is that ``\\x1b`` on screen may be a stored backslash followed by ``x1b``; the
``--json`` output of every listing gives the exact value.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # the user commands escape every cell: no collections at run time
    from collections.abc import Sequence

_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def terminal_safe(text: str) -> str:
    """``text`` with every character a terminal would not show as itself escaped."""
    if text.isprintable():  # nearly every value: one pass in C, the same object back
        return text
    return "".join(char if char.isprintable() else escape_char(char) for char in text)


def terminal_safe_cells(cells: Sequence[str]) -> Sequence[str]:
    """``terminal_safe`` of each cell of a table column; the column itself when every
    cell is printable (one check over the joined column: a 10,000-row queue's column is
    checked in well under a millisecond)."""
    if "".join(cells).isprintable():
        return cells
    return [terminal_safe(cell) for cell in cells]


def escape_char(char: str) -> str:
    """The escape that shows one unprintable character: ``\\x1b``, ``\\u202e``."""
    short = _SHORT.get(char)
    if short is not None:
        return short
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
