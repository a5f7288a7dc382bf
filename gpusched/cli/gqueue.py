"""gqueue: show the job queue, the way squeue does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer

from gpusched.cli.common import new_app, run_slurm_cli
from gpusched.cli.queuecommand import run_gqueue

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
    array: Annotated[bool, typer.Option(
        "--array", "-r", help="One pending array task a line (12_4, 12_5, ...).")] = False,
    clusters: Annotated[str | None, typer.Option(
        "--clusters", "-M", metavar="NAME", show_default=False,
        help="This cluster's name (or 'all'); any other is refused.")] = None,
    long_format: Annotated[str | None, typer.Option(
        "--Format", "-O", metavar="FIELDS", show_default=False,
        help="squeue's -O field names, e.g. 'JobID:.10,Name,State,Dependency' "
        "(see docs/cli.md).")] = None,
    licenses: Annotated[str | None, typer.Option(
        "--licenses", "-L", metavar="LIST", show_default=False,
        help="Only jobs asking for these licenses.")] = None,
    long: Annotated[bool, typer.Option(
        "--long", "-l", help="squeue's long format (STATE, TIME_LIMIT, NODES).")] = False,
    qos: Annotated[str | None, typer.Option(
        "--qos", "-q", metavar="LIST", show_default=False,
        help="Only jobs of these QOS.")] = None,
    sort: Annotated[str | None, typer.Option(
        "--sort", "-S", metavar="KEYS", show_default=False,
        help="Sort by these field codes, comma separated, '-' for descending "
        "(e.g. '-t,P,i'); default: job id.")] = None,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Say on stderr what is asked of the controller.")] = False,
    nodelist: Annotated[str | None, typer.Option(
        "--nodelist", "-w", metavar="NODES", show_default=False,
        help="Only jobs running on these nodes (node[01-04],gpu7).")] = None,
    steps: Annotated[bool, typer.Option(
        "--steps", "-s", help="The running steps of running jobs instead.")] = False,
    reservation: Annotated[str | None, typer.Option(
        "--reservation", "-R", metavar="NAME", show_default=False,
        help="Only jobs of this advance reservation.")] = None,
) -> None:
    """Show pending and running jobs (with --all, ended ones too).

    Examples: gqueue --me; gqueue -p gpu -t PD --start; gqueue -o '%.8i %.2t %.10M %b %R'
    """
    run_gqueue(as_json=as_json, user=user, states=states, show_all=show_all,
               noheader=noheader, start=start, explain=explain, me=me, partition=partition,
               job_list=job_list, account=account, name=name, fmt=fmt, iterate=iterate,
               array=array, clusters=clusters, long_format=long_format, licenses=licenses,
               long=long, qos=qos, sort=sort, verbose=verbose, nodelist=nodelist, steps=steps,
               reservation=reservation)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gqueue`` console script."""
    return run_slurm_cli(app, PROG, argv)


