"""gcontrol: change queued jobs, like scontrol (hold and release for now)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer

from gpusched.cli.client import ApiClient
from gpusched.cli.common import new_app, print_error, run_cli
from gpusched.cli.gcancel import describe_failure, parse_job_ids
from gpusched.errors import GpuschedError, Unavailable

PROG = "gcontrol"

app = new_app("Change queued gpusched jobs, like scontrol.")
JobIds = Annotated[list[str], typer.Argument(metavar="JOB...", show_default=False,
                                             help="Ids of pending jobs.")]


def _each(job_ids: Sequence[str], action: str) -> int:
    """POST ``action`` for each job; report failures and go on, as scontrol does."""
    worst = 0
    with ApiClient() as client:
        for job_id in parse_job_ids(job_ids):
            try:
                client.request("POST", f"/v1/jobs/{job_id}/{action}")
            except Unavailable:
                raise
            except GpuschedError as err:
                print_error(PROG, describe_failure(job_id, err.message))
                worst = max(worst, err.exit_code)
    return worst


@app.command()
def hold(job_ids: JobIds) -> int:
    """Keep pending jobs from starting (an administrator's hold needs an administrator to release)."""
    return _each(job_ids, "hold")


@app.command()
def release(job_ids: JobIds) -> int:
    """Let held jobs start again."""
    return _each(job_ids, "release")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gcontrol`` console script."""
    return run_cli(app, PROG, argv)
