"""Console-script entry points of the user commands: run one, then leave at once.

A command that listed 10,000 jobs would otherwise spend a few tens of milliseconds after
its output freeing every object and module one by one; ``os._exit`` skips that once
what it printed is flushed. (The daemons exit the ordinary way.)
"""

from __future__ import annotations

import os
import sys
from importlib import import_module
from typing import NoReturn


def _run(command: str) -> NoReturn:
    code = import_module(f"gpusched.cli.{command}").main()
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
    _run("gqueue")


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
