"""What a job takes from the shell it is submitted from: its working directory, its
environment (``--export``) and its umask."""

from __future__ import annotations

import os

from gpusched.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def current_umask() -> int:
    """This process's umask (reading it means setting it, so it is set straight back)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def job_dir(chdir: str | None) -> str:
    """The absolute directory the job runs in: ``--chdir`` (relative to here) or here."""
    if chdir is None:
        return _current_dir()
    path = chdir if chdir.startswith("/") else os.path.join(_current_dir(), chdir)
    return os.path.normpath(path)


def is_variable_name(name: str) -> bool:
    """Whether ``name`` is a shell variable name: ``[A-Za-z_][A-Za-z0-9_]*``."""
    return (name.isascii() and name.replace("_", "a").isalnum()
            and not name[0].isdigit())


def exported(text: str | None, environment: Mapping[str, str]) -> dict[str, str]:
    """The job's environment for ``--export``: ``ALL`` (the default) copies everything;
    ``NONE`` only the ``SLURM_*`` variables; ``VAR`` copies one variable, ``VAR=value``
    sets one; a list that starts with ``ALL`` adds to everything, any other list adds to
    the ``SLURM_*`` variables (as sbatch's --export keeps them)."""
    if text is None or text.strip().upper() == "ALL":
        return dict(environment)
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise UsageError(f"invalid --export {text!r}: an empty item")
    first = items[0].upper()
    result: dict[str, str] = dict(environment) if first == "ALL" else {
        name: value for name, value in environment.items() if name.startswith("SLURM_")}
    if first in ("ALL", "NONE"):
        items = items[1:]
    for item in items:
        name, sep, value = item.partition("=")
        if not is_variable_name(name) or name.upper() in ("ALL", "NONE"):
            raise UsageError(f"invalid --export {text!r}: {item!r} is not VAR or VAR=value")
        if sep:
            result[name] = value
        elif name in environment:
            result[name] = environment[name]
    return result


def is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _current_dir() -> str:
    """The absolute directory the job will run in."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise UsageError("the current directory no longer exists") from None


def job_environment(export: str | None, environment: Mapping[str, str]
                    ) -> tuple[dict[str, str], list[str]]:
    """The job's environment for ``--export``, less the variables no UTF-8 can hold (a
    byte the shell holds that is no UTF-8 cannot be stored); and the names left out."""
    chosen = exported(export, environment)
    dropped = [n for n, v in chosen.items() if not is_utf8(n) or not is_utf8(v)]
    for name in dropped:
        del chosen[name]
    return chosen, dropped
