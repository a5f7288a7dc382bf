"""Plumbing the user CLIs share: one-line errors, exit codes and a table printer.

Kept cheap to import: ``rich`` is loaded only to draw a table on a terminal.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.main import get_command

from gpusched.cli.output import collect_rarely, only_me, print_error, reader_gone
from gpusched.errors import GpuschedError, UsageError


def new_app(help_text: str) -> typer.Typer:
    """A typer app set up for one-line errors: no rich panels, no pretty tracebacks."""
    return typer.Typer(
        help=help_text,
        add_completion=False,
        rich_markup_mode=None,
        pretty_exceptions_enable=False,
    )


__all__ = ["only_me"]  # here for the commands that import it from here

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


def run_slurm_cli(app: typer.Typer, prog: str, argv: Sequence[str] | None = None,
                  declared: bool = False) -> int:
    """The entry point of a command that takes its Slurm twin's options: ``argv``
    (default: the process's) checked by gpusched.cli.slurmflags (a refused option is a
    one-line usage error; with ``declared``, the options the app declares are its own
    even where the twin's would be refused), then run by ``run_cli``."""
    from gpusched.cli.slurmflags import check_argv, declared_options

    try:
        args = check_argv(prog, list(sys.argv[1:] if argv is None else argv),
                          declared_options(app) if declared else ())
    except UsageError as err:
        print_error(prog, err.message)
        return err.exit_code
    return 0 if args is None else run_cli(app, prog, args)


def run_cli(app: typer.Typer, prog: str, argv: Sequence[str] | None = None) -> int:
    """Run a typer app as PROG and return its exit code.

    User errors never show a traceback: a ``GpuschedError`` prints one line and exits
    with its ``exit_code``; a usage error (unknown flag, bad value) prints one line and
    exits 2. The command may return an int to choose its exit code.
    """
    collect_rarely()
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
        return reader_gone()
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
        if len(text.lstrip("+-")) > 18:  # past any bound an option has (and int()'s limit)
            raise typer.BadParameter(f"{text[:24]}... is too large", ctx=ctx, param=param)
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
