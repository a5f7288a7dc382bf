"""Console-script entry points of the user commands: run one, then leave at once.

A command that listed 10,000 jobs would otherwise spend a few tens of milliseconds after
its output freeing every object and module one by one; ``os._exit`` skips that once
what it printed is flushed. (The daemons exit the ordinary way.)

The common command lines of ``gsubmit``, ``gqueue`` and ``gcancel``, the commands typed
most, are parsed without loading typer (about 45 ms; see ``gpusched.cli.quickparse``)
and run the same code as the typer commands; any other command line (--help, a
mistake) goes through typer as before.
"""

from __future__ import annotations

import os
import sys

# The quick paths load no module they do not use (tests/cli/test_cli_imports.py holds
# gsubmit's and gqueue's to a short list): typing, re, json, socket, pathlib and
# datetime each cost a few milliseconds of a command that takes twenty.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, NoReturn


def import_module(name: str) -> Any:
    """The module ``name``, imported (``importlib.import_module`` without loading
    importlib's package, and warnings with it)."""
    __import__(name)
    return sys.modules[name]


def _run(command: str) -> NoReturn:
    code = import_module(f"gpusched.cli.{command}").main()
    _leave(code)


def _leave(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (gqueue | head)
            code = code or 1
    os._exit(code)


def gsubmit() -> NoReturn:
    """``gsubmit``."""
    if "_GSUBMIT_COMPLETE" in os.environ:
        _run("gsubmit")
    _leave(quick_gsubmit(sys.argv[1:]))


def quick_gsubmit(argv: Sequence[str]) -> int:
    """``gsubmit ARGV`` without typer where the quick parser takes ARGV and the script's
    directives; through typer otherwise (nothing is printed or sent before the quick
    parser gives up). Returns the exit code."""
    from gpusched.cli.optiontables import GSUBMIT
    from gpusched.cli.quickparse import Declined, QuickArgs, quick_parse

    def options(args: list[str]) -> QuickArgs:
        return quick_parse(GSUBMIT, args)

    try:
        parsed = quick_parse(GSUBMIT, argv)
        from gpusched.cli.submission import submit

        return run_quick("gsubmit", lambda: submit(parsed, options))
    except Declined:
        return import_module("gpusched.cli.gsubmit").main(argv)  # type: ignore[no-any-return]


def gqueue() -> NoReturn:
    """``gqueue``."""
    # The shell asking for completions (common.completion_variable) needs typer too.
    if "_GQUEUE_COMPLETE" in os.environ:
        _run("gqueue")
    _leave(quick_gqueue(sys.argv[1:]))


def quick_gqueue(argv: Sequence[str]) -> int:
    """``gqueue ARGV`` without typer where the quick parser takes ARGV; through typer
    otherwise. Returns the exit code."""
    from gpusched.cli.optiontables import GQUEUE
    from gpusched.cli.quickparse import Declined, quick_parse

    try:
        parsed = quick_parse(GQUEUE, argv)
    except Declined:
        return import_module("gpusched.cli.gqueue").main(argv)  # type: ignore[no-any-return]
    from gpusched.cli.queuecommand import run_gqueue

    return run_quick("gqueue", lambda: run_gqueue(**parsed.params))


def bare_gqueue() -> int:
    """``gqueue`` without arguments: the queue, as the command itself prints it."""
    return quick_gqueue([])


def run_quick(prog: str, command: Callable[[], object]) -> int:
    """Run a command parsed without typer; its errors end it as ``common.run_cli``
    ends a typer command's: one line on stderr and the error's exit code."""
    from gpusched.cli.output import collect_rarely, print_error, reader_gone
    from gpusched.errors import GpuschedError

    collect_rarely()
    try:
        code = command()  # an int chooses the exit code (gsubmit -W: the job's)
        sys.stdout.flush()
    except GpuschedError as err:
        print_error(prog, err.message)
        return err.exit_code
    except BrokenPipeError:
        return reader_gone()
    except KeyboardInterrupt:
        print(file=sys.stderr)
        print_error(prog, "aborted")
        return 1
    return code if isinstance(code, int) else 0


def gcancel() -> NoReturn:
    """``gcancel``."""
    if "_GCANCEL_COMPLETE" in os.environ:
        _run("gcancel")
    _leave(quick_gcancel(sys.argv[1:]))


def quick_gcancel(argv: Sequence[str]) -> int:
    """``gcancel ID...`` (plain job ids, the common call) without typer; any other
    command line through typer. Returns the exit code."""
    if not argv or not all(arg.strip().isascii() and arg.strip().isdigit() for arg in argv):
        return import_module("gpusched.cli.gcancel").main(argv)  # type: ignore[no-any-return]
    from gpusched.cli.cancelling import parse_job_ids, post_for_each

    worst = 0

    def cancel() -> None:
        nonlocal worst
        worst = post_for_each("gcancel", [(i, None) for i in parse_job_ids(argv)], "cancel")

    return run_quick("gcancel", cancel) or worst


def gcontrol() -> NoReturn:
    """``gcontrol``."""
    _run("gcontrol")


def ginfo() -> NoReturn:
    """``ginfo``."""
    _run("ginfo")


def gacct() -> NoReturn:
    """``gacct``."""
    _run("gacct")
