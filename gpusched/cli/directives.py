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


# sbatch's options with an optional value (``--nice[=adj]``): declared as flags, so that
# a bare one never takes the next word; their ``=VALUE`` forms are read here.
_OPTIONAL_VALUES = ("--nice", "--exclusive", "--no-kill", "--get-user-env")


def sbatch_spellings(args: list[str]) -> list[str]:
    """``args`` with sbatch's ``--opt=VALUE`` forms of the options whose value is
    optional read: ``--nice=N`` is --nice-adjustment=N (checked where it is read),
    ``--no-kill=off`` is the default (dropped), ``--get-user-env=[TIMEOUT][S|L]`` is --get-user-env;
    ``--exclusive=user|mcs|topo`` is refused here. Only the options before the script
    are read: what follows it is the script's."""
    from gpusched.cli.optiontables import GSUBMIT

    result: list[str] = []
    index = 0
    while index < len(args):
        token = args[index]
        index += 1
        name, equals, value = token.partition("=")
        if token.startswith("-") and token not in ("-", "--") and (
                name if token.startswith("--") else token[:2]) not in GSUBMIT.options:
            # sbatch's options gsubmit does not declare: refused naming them, or read
            from gpusched.cli.sbatchflags import sbatch_only

            read = sbatch_only(token, frozenset(GSUBMIT.options))
            if read is None:
                continue  # what gsubmit does anyway
            token = read
            name, equals, value = token.partition("=")
        if name in _OPTIONAL_VALUES and equals:
            result.extend(_optional_value(name, value))
            continue
        result.append(token)
        if token == "--" or not token.startswith("-") or token == "-":
            break  # the script: it and what follows are the script's
        spec = GSUBMIT.options.get(name if token.startswith("--") else token[:2])
        if spec is not None and spec[1] != "flag" and not equals and (
                token.startswith("--") or len(token) == 2) and index < len(args):
            result.append(args[index])  # the option's value, whatever it looks like
            index += 1
    return result + args[index:]


_EXCLUSIVE_MODES = {
    "user": "nodes shared only with your own jobs",
    "mcs": "nodes shared only with jobs of your MCS label",
    "topo": "a topology block to itself"}


def _optional_value(name: str, value: str) -> list[str]:
    """The arguments that ``NAME=VALUE`` of an optional-value option stands for."""
    if name == "--exclusive":
        if value in _EXCLUSIVE_MODES:
            raise UsageError(f"--exclusive={value}: not supported ({_EXCLUSIVE_MODES[value]}): "
                             "a job here shares nodes with any job, or with none (--exclusive)")
        raise UsageError(f"invalid --exclusive={value[:32]!r}: expected --exclusive alone, or "
                         "=user, =mcs or =topo (which are not supported)")
    if name == "--no-kill":
        return [] if value.lower() == "off" else [name]  # sbatch: anything but off is on
    if name == "--get-user-env":
        digits = value.rstrip("SLsl")
        if len(value) - len(digits) > 1 or not (digits.isascii() and digits.isdigit()
                                               or not digits) or len(digits) > 6:
            raise UsageError(f"invalid --get-user-env={value[:32]!r}: expected "
                             "--get-user-env[=TIMEOUT][S|L]")
    if name == "--nice":
        return [f"--nice-adjustment={value}"]  # checked with the rest (nice_value)
    return [name]
