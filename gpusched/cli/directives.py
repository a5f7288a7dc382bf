"""Read ``#GSUB`` / ``#SBATCH`` directive lines from the top of a batch script (pure).

The rules are sbatch's: directives are read from the lines after the shebang up to the
first line that is neither blank nor a comment; a directive must start at the beginning
of its line; its text is split like a shell would split it (quotes handled), and an
unquoted ``#`` that starts a word ends it as a comment.
"""

from __future__ import annotations

from gpusched.errors import UsageError

DIRECTIVE_PREFIXES = ("#GSUB", "#SBATCH")
_WORD_BREAKS = " \t\r\n"  # shlex's whitespace: a no-break space is within a word


class Directive:
    """One directive line: its 1-based line number, its prefix and its arguments."""

    # A plain class, not a NamedTuple: gsubmit's quick path leaves typing unloaded.
    __slots__ = ("line", "prefix", "args")

    def __init__(self, line: int, prefix: str, args: tuple[str, ...]) -> None:
        self.line = line
        self.prefix = prefix
        self.args = args

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Directive) and (self.line, self.prefix, self.args) == (
            other.line, other.prefix, other.args)

    def __repr__(self) -> str:
        return f"Directive(line={self.line!r}, prefix={self.prefix!r}, args={self.args!r})"


def read_directives(script_text: str) -> list[str]:
    """All directive arguments of a script, in order, as one argument list."""
    return [arg for directive in read_directive_lines(script_text) for arg in directive.args]


def read_directive_lines(script_text: str) -> list[Directive]:
    """The directive lines at the top of a script, each split into arguments."""
    directives: list[Directive] = []
    lines = script_text.splitlines()
    start = 1 if lines and lines[0].startswith("#!") else 0
    for number, line in enumerate(lines[start:], start=start + 1):
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break  # the first command ends the directive block, as in sbatch
        prefix = _directive_prefix(line)
        if prefix is None:
            continue  # an ordinary comment
        args = _split_directive(line[len(prefix):], number, prefix)
        if args:
            directives.append(Directive(number, prefix, tuple(args)))
    return directives


def _directive_prefix(line: str) -> str | None:
    """The prefix when ``line`` is a directive; ``#SBATCHX`` is only a comment."""
    for prefix in DIRECTIVE_PREFIXES:
        if line.startswith(prefix):
            rest = line[len(prefix):]
            if not rest or rest[0].isspace():
                return prefix
    return None


def _split_directive(text: str, number: int, prefix: str) -> list[str]:
    """Split a directive's text into arguments, honouring quotes and `` #`` comments."""
    import shlex  # only a script with directives needs it (it loads re)

    try:
        return shlex.split(_strip_comment(text))
    except ValueError as err:  # shlex reports an unclosed quote this way
        raise UsageError(f"line {number}: {prefix} directive: {err}") from None


def _strip_comment(text: str) -> str:
    """Cut ``text`` at the first unquoted ``#`` that starts a word.

    shlex's own comment handling also cuts inside a word (``run#1.out``), which would
    silently change a file name, hence this small scanner.
    """
    quote = ""
    escaped = False
    for index, char in enumerate(text):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or text[index - 1] in _WORD_BREAKS):
            return text[:index]
    return text
