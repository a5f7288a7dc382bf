"""Console-script entry points of the user commands: run one, then leave at once.

A command that listed 10,000 jobs would otherwise spend a few tens of milliseconds after
its output freeing every object and module one by one; ``os._exit`` skips that once
what it printed is flushed. (The daemons exit the ordinary way.)

A bare ``gqueue``, the command typed most, has no options to parse: it lists the queue
through the same code as ``gqueue`` with options, without loading typer (about 45 ms).
"""

from __future__ import annotations

import os
import sys
from importlib import import_module
from typing import NoReturn


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
    _run("gsubmit")


def gqueue() -> NoReturn:
    """``gqueue``."""
    # The shell asking for completions (common.completion_variable) needs typer too.
    if len(sys.argv) > 1 or "_GQUEUE_COMPLETE" in os.environ:
        _run("gqueue")
    _leave(bare_gqueue())


def bare_gqueue() -> int:
    """``gqueue`` without arguments: the queue, as the command itself prints it."""
    from gpusched.cli.listing import TABLE_FIELDS, jobs_path, show
    from gpusched.cli.output import collect_rarely, print_error, reader_gone
    from gpusched.errors import GpuschedError

    collect_rarely()
    try:
        show(jobs_path(user=None, states=None, show_all=False, fields=TABLE_FIELDS))
        sys.stdout.flush()
    except GpuschedError as err:
        print_error("gqueue", err.message)
        return err.exit_code
    except BrokenPipeError:
        return reader_gone()
    return 0


def gcancel() -> NoReturn:
    """``gcancel``."""
    _run("gcancel")


def gcontrol() -> NoReturn:
    """``gcontrol``."""
    _run("gcontrol")


def ginfo() -> NoReturn:
    """``ginfo``."""
    _run("ginfo")


def gacct() -> NoReturn:
    """``gacct``."""
    _run("gacct")
