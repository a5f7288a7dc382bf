"""gcancel: cancel jobs, the way scancel does."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated

import typer

from gpusched.cli.client import ApiClient
from gpusched.cli.common import new_app, print_error, run_cli
from gpusched.errors import GpuschedError, Unavailable, UsageError

PROG = "gcancel"

app = new_app("Cancel gpusched jobs, like scancel.")


@app.command()
def gcancel(
    job_ids: Annotated[list[str], typer.Argument(
        metavar="ID...", show_default=False, help="Ids of the jobs to cancel.",
    )],
) -> int:
    """Cancel each job; report every one that fails and go on, as scancel does."""
    return post_for_each(PROG, job_ids, "cancel")


def post_for_each(prog: str, job_ids: Sequence[str], action: str) -> int:
    """POST /v1/jobs/{id}/ACTION for each job; report failures and go on; the worst exit code.

    Every id is checked before the first request is sent.
    """
    worst = 0
    with ApiClient() as client:
        for job_id in parse_job_ids(job_ids):
            try:
                client.request("POST", f"/v1/jobs/{job_id}/{action}")
            except Unavailable:
                raise  # the next ids would fail the same way; one line is enough
            except GpuschedError as err:
                print_error(prog, describe_failure(job_id, err.message))
                worst = max(worst, err.exit_code)
    return worst


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gcancel`` console script."""
    return run_cli(app, PROG, argv)


def parse_job_ids(texts: Sequence[str]) -> list[int]:
    """Job ids as positive integers, duplicates dropped; any bad one is a usage error."""
    ids: list[int] = []
    for text in texts:
        stripped = text.strip()
        # isascii(): str.isdigit() also accepts digits like "²" that int() refuses.
        if not (stripped.isascii() and stripped.isdigit()) or int(stripped) <= 0:
            raise UsageError(f"invalid job id {text!r}: a job id is a positive integer")
        if int(stripped) not in ids:
            ids.append(int(stripped))
    return ids


def describe_failure(job_id: int, message: str) -> str:
    """The controller's message, naming the job unless the message already does."""
    if re.search(rf"\b{job_id}\b", message):
        return message
    return f"job {job_id}: {message}"
