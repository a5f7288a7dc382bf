"""gcontrol: change queued jobs, like scontrol (hold and release for now)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer

from gpusched.cli.common import new_app, run_cli
from gpusched.cli.gcancel import post_for_each

PROG = "gcontrol"

app = new_app("Change queued gpusched jobs, like scontrol.")
JobIds = Annotated[list[str], typer.Argument(metavar="JOB...", show_default=False,
                                             help="Ids of pending jobs.")]


@app.command()
def hold(job_ids: JobIds) -> int:
    """Keep pending jobs from starting (an administrator's hold needs an administrator to release)."""
    return post_for_each(PROG, job_ids, "hold")


@app.command()
def release(job_ids: JobIds) -> int:
    """Let held jobs start again."""
    return post_for_each(PROG, job_ids, "release")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gcontrol`` console script."""
    return run_cli(app, PROG, argv)
