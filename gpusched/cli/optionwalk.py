"""The walk over srun-style command lines that gsrun and galloc share (stdlib only).

Options come first: ``--name``, ``--name=value``, ``--name value``, and groups of
short options (``-lK``, ``-N2``, ``-lN 2``: flags, then at most one option with a
value). ``--`` or the first word that is not an option ends them; what is left is the
command, untouched. Each option found goes to ``take(name, shown, value, rest,
attached)``, which may take its value from ``rest``.
"""

from __future__ import annotations

from gpusched.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    Take = Callable[[str, str, "str | None", list[str], bool], None]


def walk_options(argv: list[str], long: Mapping[str, tuple[str, str]],
                 short: Mapping[str, str], take: Take, prog: str,
                 stop: Callable[[], bool]) -> list[str]:
    """Hand every leading option of ``argv`` to ``take`` (``long`` maps a long name to
    (key, kind), ``kind`` "flag" taking no value; ``short`` a short name to its long
    one) until ``stop()`` says so; the rest of ``argv``."""
    rest = list(argv)
    while rest:
        token = rest.pop(0)
        if token == "--":
            break
        if token.startswith("--"):
            name, equals, attached = token.partition("=")
            if name not in long:
                raise UsageError(f"unrecognized option {token!r:.80} (see '{prog} --help')")
            take(name, name, attached if equals else None, rest, bool(equals))
        elif token.startswith("-") and token != "-":
            _short_group(token, rest, long, short, take, prog)
        else:
            rest.insert(0, token)
            break
        if stop():
            break
    return rest


def _short_group(token: str, rest: list[str], long: Mapping[str, tuple[str, str]],
                 short: Mapping[str, str], take: Take, prog: str) -> None:
    for at in range(1, len(token)):
        letter = "-" + token[at]
        name = short.get(letter)
        if name is None:
            raise UsageError(f"unrecognized option {letter!r} (see '{prog} --help')")
        if long[name][1] == "flag":
            take(name, letter, None, rest, False)
            continue
        attached = token[at + 1:]
        take(name, letter, attached or None, rest, bool(attached))
        return
