"""gqueue: show the job queue, the way squeue does."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Annotated

import typer

from gpusched.cli.common import new_app, only_me, run_cli
from gpusched.cli.listing import (
    START_FIELDS,
    TABLE_FIELDS,
    explain_lines,
    format_fields,
    jobs_path,
    parse_format,
    parse_states,
    show,
)
from gpusched.client import ApiClient
from gpusched.errors import UsageError

PROG = "gqueue"

app = new_app("Show the gpusched job queue, like squeue.")


@app.command()
def gqueue(
    as_json: Annotated[bool, typer.Option(
        "--json", help='Print {"jobs": [JOB, ...]} as the API returns it (see docs/cli.md).',
    )] = False,
    user: Annotated[str | None, typer.Option(
        "--user", "-u", metavar="NAME", show_default=False, help="Only this user's jobs.",
    )] = None,
    states: Annotated[str | None, typer.Option(
        "--states", "-t", metavar="LIST", show_default=False,
        help="Only jobs in these states, comma separated (PD,R or PENDING,RUNNING; 'all').",
    )] = None,
    show_all: Annotated[bool, typer.Option("--all", help="Include ended jobs.")] = False,
    noheader: Annotated[bool, typer.Option("--noheader", "-h", help="Do not print the header.")] = False,
    start: Annotated[bool, typer.Option(
        "--start", help="Pending jobs with the time each is expected to start (reserved ones).",
    )] = False,
    explain: Annotated[int | None, typer.Option(
        "--explain", metavar="JOB", min=1, show_default=False,
        help="Say everything that keeps pending JOB from starting, and what would unblock it.",
    )] = None,
    me: Annotated[bool, typer.Option("--me", help="Only your own jobs.")] = False,
    partition: Annotated[str | None, typer.Option(
        "--partition", "-p", metavar="LIST", show_default=False,
        help="Only jobs in these partitions (comma separated).")] = None,
    job_list: Annotated[str | None, typer.Option(
        "--jobs", "-j", metavar="LIST", show_default=False,
        help="Only these jobs (comma separated ids; an array's id gives all its tasks).")] = None,
    account: Annotated[str | None, typer.Option(
        "--account", "-A", metavar="LIST", show_default=False,
        help="Only jobs charging these accounts.")] = None,
    name: Annotated[str | None, typer.Option(
        "--name", "-n", metavar="LIST", show_default=False, help="Only jobs with these names.")] = None,
    fmt: Annotated[str | None, typer.Option(
        "--format", "-o", metavar="FORMAT", show_default=False,
        help="squeue's field codes, e.g. '%.10i %.9P %.20j %.8u %.2t %.10M %.6b %R' "
        "(see docs/cli.md).")] = None,
    iterate: Annotated[int | None, typer.Option(
        "--iterate", "-i", metavar="SECONDS", min=1, show_default=False,
        help="Print again every SECONDS until interrupted.")] = None,
) -> None:
    """Show pending and running jobs (with --all, ended ones too).

    Examples: gqueue --me; gqueue -p gpu -t PD --start; gqueue -o '%.8i %.2t %.10M %b %R'
    """
    if explain is not None:
        with ApiClient() as client:
            answer = client.request("GET", f"/v1/jobs/{explain}/explain")
        print(json.dumps(answer, indent=2) if as_json else "\n".join(explain_lines(answer)))
        return
    if me:
        user = only_me(user)
    fields = parse_format(fmt) if fmt is not None else None
    ids = _ids(job_list) if job_list is not None else None
    wanted = None if as_json else (
        format_fields(fields) if fields is not None else START_FIELDS if start else TABLE_FIELDS)
    path = jobs_path(user=user, states=["PENDING"] if start else parse_states(states),
                     show_all=show_all, ids=ids, partition=partition, account=account,
                     name=name, fields=wanted)
    while True:
        show(path, as_json, start, noheader, fields)
        if iterate is None:
            return
        sys.stdout.flush()
        time.sleep(iterate)
        print()


def _ids(text: str) -> list[int]:
    ids = []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        if not (word.isascii() and word.isdigit()) or int(word) <= 0:
            raise UsageError(f"invalid --jobs {word!r}: a job id is a positive integer")
        ids.append(int(word))
    if not ids:
        raise UsageError("--jobs: give at least one job id")
    return ids


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gqueue`` console script."""
    return run_cli(app, PROG, argv)


