"""gcancel: cancel jobs, the way scancel does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Optional

import typer

from gpusched.cli.cancelling import describe_failure, parse_job_ids, post_for_each
from gpusched.cli.common import new_app, only_me, run_slurm_cli
from gpusched.cli.listing import node_set, parse_states, query_text
from gpusched.cli.output import print_error
from gpusched.client import ApiClient
from gpusched.core import signals
from gpusched.core.arrays import ArrayError, parse_array
from gpusched.errors import GpuschedError, Unavailable, UsageError

__all__ = ["app", "describe_failure", "main", "parse_job_ids", "parse_signal", "parse_targets",
           "post_for_each", "split_step_ids"]

PROG = "gcancel"

app = new_app("Cancel gpusched jobs, like scancel.")


@app.command()
def gcancel(
    job_ids: Annotated[Optional[list[str]], typer.Argument(
        metavar="ID...", show_default=False,
        help="Jobs to cancel: 12, an array task 12_3, tasks 12_[1-5,9], or a step 12.3.",
    )] = None,
    user: Annotated[Optional[str], typer.Option(
        "--user", "-u", help="Only jobs of this user (alone: every job of the user).")] = None,
    me: Annotated[bool, typer.Option("--me", help="Only your own jobs.")] = False,
    partition: Annotated[Optional[str], typer.Option(
        "--partition", "-p", help="Only jobs in this partition.")] = None,
    states: Annotated[Optional[str], typer.Option(
        "--state", "-t", help="Only jobs in these states: PENDING, RUNNING (PD, R).")] = None,
    name: Annotated[Optional[str], typer.Option(
        "--name", "-n", help="Only jobs with this name.")] = None,
    signal_name: Annotated[Optional[str], typer.Option(
        "--signal", "-s", metavar="SIG",
        help="Send SIG (USR1, SIGUSR1 or 10) to running jobs instead of cancelling them.")] = None,
    account: Annotated[Optional[str], typer.Option(
        "--account", "-A", help="Only jobs charging this account.")] = None,
    qos: Annotated[Optional[str], typer.Option("--qos", "-q", help="Only jobs of this QOS.")] = None,
    nodelist: Annotated[Optional[str], typer.Option(
        "--nodelist", "-w", help="Only jobs running on these nodes (node[01-04],gpu7).")] = None,
    reservation: Annotated[Optional[str], typer.Option(
        "--reservation", "-R", help="Only jobs of this advance reservation.")] = None,
    clusters: Annotated[Optional[str], typer.Option(
        "--clusters", "-M", help="This cluster's name; any other is refused.")] = None,
    interactive: Annotated[bool, typer.Option(
        "--interactive", "-i", help="Ask (y/n) before each job.")] = False,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-Q", help="Say nothing of jobs that have ended or do not exist.")] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Say each job acted on, on stderr.")] = False,
) -> int:
    """Cancel jobs, array tasks, or every job the filters select, as scancel does.

    With ids and filters, only the ids the filters select are cancelled. Every failure is
    reported and the rest go on.

    Examples: gcancel 17 18; gcancel 12_3 12_[5-9]; gcancel 12.3 (one step of job 12);
    gcancel --me -t PD; gcancel -n sweep -u alice; gcancel --signal USR1 17 (the job goes on
    running)
    """
    from gpusched.cli.slurmflags import check_clusters

    check_clusters(clusters)
    step_ids, job_texts = split_step_ids(job_ids or [])
    targets = parse_targets(job_texts)
    signum = parse_signal(signal_name) if signal_name is not None else None
    if signum is not None and any(tasks is not None for _, tasks in targets):
        raise UsageError("--signal takes job ids (an array's id signals all its running tasks)")
    action, body = ("cancel", None) if signum is None else ("signal", {"signal": signum})
    wanted_states = parse_states(states, "--state", ("PENDING", "RUNNING"),
                                 "only PENDING (PD) and RUNNING (R) jobs can be cancelled")
    nodes = node_set(nodelist)
    filtered = bool(user or me or partition or wanted_states or name or account or qos
                    or nodes or reservation)
    if step_ids and filtered:
        raise UsageError("a step id (JOB.STEP) takes no filters: give steps alone")
    if not targets and not filtered and not step_ids:
        raise UsageError("nothing to cancel: give job ids, or filters such as --me or -u USER")
    if user is not None and user.strip().isdigit():
        from gpusched.cli.slurmflags import user_names

        user = user_names(user.strip())  # a uid as its name, as scancel -u takes it
    if me:
        user = only_me(user)
    def send(chosen: list[tuple[int, str | None]]) -> int:
        if interactive:
            shown = listed
            if not shown and chosen:
                from gpusched.cli.listing import jobs_path

                with ApiClient() as client:
                    shown = client.request("GET", jobs_path(
                        user=None, states=None, show_all=True, ids=[i for i, _ in chosen],
                        fields=("job_id", "name", "partition")))["rows"]
                shown = [dict(zip(("job_id", "name", "partition"), row)) for row in shown]
            chosen = confirmed(chosen, shown)
        return post_for_each(PROG, chosen, action, body, quiet=quiet, verbose=verbose)

    listed: list[dict[str, Any]] = []
    if step_ids:
        worst = cancel_steps(step_ids, signum)
        return max(worst, send(targets)) if targets else worst
    if not filtered:
        return send(targets)
    with ApiClient() as client:
        # The user's name as a query value (a name holding & or = stays one value).
        query = f"?{query_text({'user': user})}" if user else ""
        listed = client.request("GET", "/v1/jobs" + query)["jobs"]
    chosen = {job["job_id"] for job in listed
              if (partition is None or job["partition"] == partition)
              and (wanted_states is None or job["state"] in wanted_states)
              and (name is None or job["name"] == name)
              and (account is None or job.get("account") == account)
              and (qos is None or job.get("qos") == qos)
              and (reservation is None or job.get("reservation") == reservation)
              and (nodes is None or bool(nodes & set(job.get("node_names") or [job.get("node")])))}
    if targets:
        # Ids name jobs (or arrays); keep those the filters select, as scancel does.
        by_array = {job["job_id"]: job.get("array_job_id") for job in listed}
        targets = [(job_id, tasks) for job_id, tasks in targets
                   if job_id in chosen or by_array.get(job_id) in chosen]
    else:
        targets = [(job_id, None) for job_id in sorted(chosen)]
    return send(targets)


def confirmed(targets: Sequence[tuple[int, str | None]], listed: Sequence[dict[str, Any]]
              ) -> list[tuple[int, str | None]]:
    """scancel -i: the targets the user answers y (or yes) for, asked one by one on
    stderr, answers read from stdin (end of input: no)."""
    import sys

    known = {job["job_id"]: job for job in listed}
    kept = []
    for job_id, tasks in targets:
        job = known.get(job_id, {})
        label = f"{job_id}_{tasks}" if tasks is not None else str(job_id)
        print(f"Cancel job_id={label} name={job.get('name', '?')} "
              f"partition={job.get('partition', '?')} [y/n]? ", end="", file=sys.stderr,
              flush=True)
        answer = sys.stdin.readline().strip().lower()
        if answer in ("y", "yes"):
            kept.append((job_id, tasks))
    return kept


def split_step_ids(texts: Sequence[str]) -> tuple[list[tuple[int, int]], list[str]]:
    """Step ids (``12.3``) as (job id, step id), duplicates dropped, and the other ids
    as given; a bad step id is a usage error naming it."""
    steps: list[tuple[int, int]] = []
    rest: list[str] = []
    for text in texts:
        job, dot, step = text.strip().partition(".")
        if not dot:
            rest.append(text)
            continue
        if not (step.isascii() and step.isdigit()) or len(step) > 10:
            raise UsageError(f"invalid step id {text!r}: expected JOB.STEP such as 12.3")
        target = (parse_job_ids([job])[0], int(step))
        if target not in steps:
            steps.append(target)
    return steps, rest


def cancel_steps(steps: Sequence[tuple[int, int]], signum: int | None) -> int:
    """Cancel (or, with ``signum``, signal) each step; report failures and go on; the
    worst exit code."""
    worst = 0
    body = {} if signum is None else {"signal": signum}
    with ApiClient() as client:
        for job_id, step_id in steps:
            try:
                client.request("POST", f"/v1/jobs/{job_id}/steps/{step_id}/cancel", body)
            except Unavailable:
                raise
            except GpuschedError as err:
                print_error(PROG, describe_failure(f"{job_id}.{step_id}", err.message))
                worst = max(worst, err.exit_code)
    return worst


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gcancel`` console script."""
    return run_slurm_cli(app, PROG, argv)


def parse_signal(text: str) -> int:
    """A signal by name (``USR1``, ``SIGUSR1``) or number; a usage error naming it."""
    try:
        return signals.parse_signal(text)
    except signals.SignalError as err:
        raise UsageError(str(err)) from None


def parse_targets(texts: Sequence[str]) -> list[tuple[int, str | None]]:
    """``12``, ``12_3`` or ``12_[1-5,9]`` as (job id, task ids or None), duplicates
    dropped; any bad one is a usage error naming it."""
    found: list[tuple[int, str | None]] = []
    for text in texts:
        job, sep, tasks = text.strip().partition("_")
        if not sep:
            target: tuple[int, str | None] = (parse_job_ids([text])[0], None)
        else:
            if tasks.startswith("[") and tasks.endswith("]"):
                tasks = tasks[1:-1]
            try:
                spec = parse_array(tasks)
            except ArrayError:
                raise UsageError(f"invalid job id {text!r}: expected ID, ID_TASK or "
                                 "ID_[TASKS] such as 12_3 or 12_[1-5]") from None
            if spec.max_running is not None:
                raise UsageError(f"invalid job id {text!r}: a % limit has no meaning here")
            target = (parse_job_ids([job])[0], spec.tasks)
        if target not in found:
            found.append(target)
    return found
