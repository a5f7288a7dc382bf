"""gacct: accounting of finished and running jobs, like sacct."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Optional
from urllib.parse import urlencode

import typer

from gpusched.cli.common import new_app, run_slurm_cli
from gpusched.cli.listing import node_set, parse_states
from gpusched.cli.output import print_table
from gpusched.core.terminal import terminal_safe
from gpusched.core.timefmt import TimeFormatError, format_duration, parse_when
from gpusched.core.usage import format_total_cpu
from gpusched.errors import UsageError

PROG = "gacct"
app = new_app("Accounting of finished and running gpusched jobs, like sacct.")
COLUMNS = ("JOBID", "JOBNAME", "PARTITION", "ACCOUNT", "USER", "STATE", "EXITCODE",
           "ELAPSED", "GPUS", "ALLOCTRES", "GPU_HRS", "BILLED", "AVG_UTIL", "PEAK", "MAXRSS",
           "TOTALCPU")
STATES = ("RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
          "OUT_OF_MEMORY", "DEADLINE", "PENDING", "SUSPENDED")


def _when(text: str | None, flag: str, now: datetime) -> datetime | None:
    if text is None:
        return None
    try:
        return parse_when(text, now, flag)
    except TimeFormatError as exc:
        raise UsageError(str(exc)) from None


def _hours(value: float) -> str:
    return f"{value:.2f}"


def _util(value: Any) -> str:
    return "-" if value is None else f"{float(value):.0f}%"


@app.command()
def gacct(
    user: Annotated[Optional[str], typer.Option("--user", "-u", help="Only these users (comma separated).")] = None,
    accounts: Annotated[Optional[str], typer.Option("--accounts", "-A", help="Only these accounts.")] = None,
    starttime: Annotated[Optional[str], typer.Option(
        "--starttime", "-S", help="Jobs running or ended since (default: today 00:00; "
        "now-7days, yesterday, 2026-11-01, 2026-11-01T08:00).")] = None,
    endtime: Annotated[Optional[str], typer.Option(
        "--endtime", "-E", help="Jobs started (or ended) by this time (default: now).")] = None,
    state: Annotated[Optional[str], typer.Option(
        "--state", "-s", help="Only these states: PD, R, S, CD, F, CA, TO, NF, OOM, DL (or "
        "their names; pending and suspended jobs only when asked for).")] = None,
    jobs: Annotated[Optional[str], typer.Option(
        "--jobs", "-j", help="Only these job ids, or steps: 12.3, 12.batch.")] = None,
    allocations: Annotated[bool, typer.Option(
        "--allocations", "-X", help="Jobs only, without their steps.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    parsable: Annotated[bool, typer.Option(
        "--parsable", "-p", help="Fields separated by |, each line ending in one, like sacct -p.")] = False,
    parsable2: Annotated[bool, typer.Option(
        "--parsable2", "-P", help="Fields separated by |, like sacct -P.")] = False,
    report: Annotated[bool, typer.Option(
        "--report", help="GPU-hours per account and user within the window instead, "
        "and each GPU-hour budget's use in its periods.")] = False,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="With --report: write a bar chart of GPU-hours to this PNG.")] = None,
    allusers: Annotated[bool, typer.Option(
        "--allusers", "-a", help="Every user's jobs (the default for root).")] = False,
    fmt: Annotated[Optional[str], typer.Option(
        "--format", "-o", help="sacct's field names, comma separated, NAME%WIDTH "
        "(gacct --helpformat lists them).")] = None,
    brief: Annotated[bool, typer.Option("--brief", "-b", help="JobID, State, ExitCode.")] = False,
    long: Annotated[bool, typer.Option("--long", "-l", help="Many more fields.")] = False,
    helpformat: Annotated[bool, typer.Option(
        "--helpformat", "-e", help="List the field names of --format.")] = False,
    noheader: Annotated[bool, typer.Option("--noheader", "-n", help="No header line.")] = False,
    delimiter: Annotated[Optional[str], typer.Option(
        "--delimiter", help="With -p or -P: this instead of |.")] = None,
    duplicates: Annotated[bool, typer.Option(
        "--duplicates", "-D", help="Each earlier run of a requeued job on a row of its own "
        "(REQUEUED).")] = False,
    names: Annotated[Optional[str], typer.Option("--name", help="Only jobs with these names.")] = None,
    partitions: Annotated[Optional[str], typer.Option(
        "--partition", "-r", help="Only jobs of these partitions.")] = None,
    qos: Annotated[Optional[str], typer.Option("--qos", "-q", help="Only jobs of these QOS.")] = None,
    nodelist: Annotated[Optional[str], typer.Option(
        "--nodelist", "-N", help="Only jobs that ran on these nodes.")] = None,
    reason: Annotated[Optional[str], typer.Option(
        "--reason", "-R", help="Only jobs with these reasons (comma separated).")] = None,
    nnodes: Annotated[Optional[str], typer.Option(
        "--nnodes", "-i", help="Only jobs on MIN[-MAX] nodes.")] = None,
    ncpus: Annotated[Optional[str], typer.Option(
        "--ncpus", "-I", help="Only jobs with MIN[-MAX] CPUs.")] = None,
    limit_min: Annotated[Optional[str], typer.Option(
        "--timelimit-min", "-k", help="Only jobs with a time limit of at least this.")] = None,
    limit_max: Annotated[Optional[str], typer.Option(
        "--timelimit-max", "-K", help="Only jobs with a time limit of at most this.")] = None,
    clusters: Annotated[Optional[str], typer.Option(
        "--clusters", "-M", help="This cluster's name (or all); any other is refused.")] = None,
    batch_script: Annotated[bool, typer.Option(
        "--batch-script", "-B", help="With -j: print each job's batch script.")] = False,
    env_vars: Annotated[bool, typer.Option(
        "--env-vars", help="With -j: print each job's environment.")] = False,
    noconvert: Annotated[bool, typer.Option(
        "--noconvert", help="MaxRSS in K, not converted to a larger unit.")] = False,
    groups: Annotated[Optional[str], typer.Option(
        "--gid", "--group", "-g", help="Only jobs of these groups (names or gids).")] = None,
    units: Annotated[Optional[str], typer.Option(
        "--units", help="MaxRSS in this unit: K, M, G, T or P.")] = None,
    truncate: Annotated[bool, typer.Option(
        "--truncate", "-T", help="Start and end times cut to the -S/-E window.")] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Say on stderr what is asked of the controller.")] = False,
) -> None:
    """Finished and running jobs with elapsed time, state, exit code, GPUs, what they
    held (ALLOCTRES: gres/gpu=2, a MIG slice gres/gpu:1g.10gb=1, a share gres/mps=25 or
    gres/shard=2), GPU-hours (every run of a requeued job; a share counts as its fraction
    of the GPU), GPU-hours billed by GPU type, GPU utilisation, and the peak memory
    (MAXRSS) and CPU time (TOTALCPU) of jobs confined in cgroups. A job that ran steps
    (gsrun) is followed by a row for its batch script (12.batch) and one for each step
    (12.0, 12.1, ...); -X shows jobs only.

    Examples: gacct; gacct -j 12.3; gacct -S now-7days -u alice; gacct -P -X;
    gacct --report -S 2026-11-01 -E 2026-12-01 --plot usage.png
    """
    from gpusched.cli import acctformat
    from gpusched.cli.slurmflags import check_clusters
    from gpusched.client import ApiClient

    if helpformat:
        typer.echo(acctformat.help_format())
        return
    check_clusters(clusters)
    if batch_script or env_vars:
        _print_job_texts(jobs, batch_script)
        return
    env_format = os.environ.get("GACCT_FORMAT") or os.environ.get("SACCT_FORMAT")
    if sum(x is not None for x in (fmt,)) + brief + long > 1:
        raise UsageError("choose one of -o/--format, -b/--brief and -l/--long")
    fmt = (acctformat.BRIEF if brief else acctformat.LONG if long else fmt
           or (env_format if not as_json and not report and env_format else None))
    fields = acctformat.parse_format(fmt) if fmt is not None else None
    units = units.strip().upper() if units is not None else None
    if units is not None and (len(units) != 1 or units not in acctformat.UNITS):
        raise UsageError(f"invalid --units {units[:8]!r}: expected K, M, G, T or P")
    if delimiter is not None and not (parsable or parsable2):
        raise UsageError("--delimiter goes with -p/--parsable or -P/--parsable2")
    if delimiter is not None and not 1 <= len(delimiter) <= 8:
        raise UsageError("--delimiter: give 1 to 8 characters")
    filters = dict(
        names=_set(names), partitions=_set(partitions), qos=_set(qos),
        gids=acctformat.group_ids(groups),
        nodes=node_set(nodelist), reasons={r.lower() for r in _set(reason) or ()} or None,
        node_range=acctformat.in_range(nnodes, "--nnodes"),
        cpu_range=acctformat.in_range(ncpus, "--ncpus"),
        limit_min=_limit(limit_min, "--timelimit-min"), limit_max=_limit(limit_max, "--timelimit-max"))
    if user is None and not allusers and jobs is None and os.getuid() != 0:
        import pwd

        user = pwd.getpwuid(os.getuid()).pw_name  # sacct: your own jobs, unless -a
    now = datetime.now(timezone.utc).astimezone()
    start = _when(starttime, "--starttime", now)
    end = _when(endtime, "--endtime", now)
    if start is None and jobs is None:
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if start is not None and end is not None and end <= start:
        raise UsageError("--endtime must be after --starttime")
    if plot is not None and not report:
        raise UsageError("--plot goes with --report")
    if sum((as_json, parsable, parsable2)) > 1:
        raise UsageError("choose one of --json, --parsable (-p) and --parsable2 (-P)")
    if report and (parsable or parsable2):
        raise UsageError("--parsable and --parsable2 go with the job list, not --report")
    if plot is not None:
        from gpusched.sim.plot import check_path

        check_path(plot)
    wanted_states = parse_states(state, "--state", STATES,
                                 "expected PD, R, S, CD, F, CA, TO, NF, OOM or DL")
    job_ids: list[int | str] = []
    only_steps: dict[int, set[str]] = {}
    if jobs is not None:
        job_ids, only_steps = _job_and_step_ids(jobs)
    query: dict[str, str] = {}
    if report:
        query = {"start": str((start or now).timestamp()), "end": str((end or now).timestamp())}
        with ApiClient() as client:
            answer = client.request("GET", f"/v1/accounting/report?{urlencode(query)}")
        _warn_archive_errors(answer)
        _report(answer, as_json, plot)
        return
    if user:
        from gpusched.cli.slurmflags import user_names

        query["user"] = user_names(user)  # uids as names, as sacct -u takes them
    if accounts:
        query["account"] = accounts
    if wanted_states:
        query["state"] = ",".join(wanted_states)
    if jobs is not None:
        query["ids"] = ",".join(map(str, job_ids))
    if start is not None:
        query["start"] = str(start.timestamp())
    if end is not None:
        query["end"] = str(end.timestamp())
    path = f"/v1/accounting?{urlencode(query, safe=',')}"
    if verbose:
        typer.echo(f"{PROG}: GET {path}", err=True)
    with ApiClient() as client:
        answer = client.request("GET", path)
    records = [r for r in answer["jobs"] if acctformat.keep(r, **filters)]  # type: ignore[arg-type]
    _warn_archive_errors(answer)
    if as_json:
        typer.echo(json.dumps({"jobs": records}, indent=2))
        return
    if truncate:
        records = [acctformat.truncate(r, start, end) for r in records]
    if noconvert or units:
        for r in records:
            for one in [r, *(r.get("steps") or ())]:
                one["max_rss_raw"], one["max_rss_unit"] = noconvert, units
    if fields is not None:
        rows_of = acctformat.rows_of(records, allocations, duplicates, only_steps)
        headers, cells = acctformat.render_rows(fields, rows_of)
        if parsable or parsable2:
            _print_parsable(headers, cells, trailing=parsable, header=not noheader,
                            delimiter=delimiter or "|")
        elif fields is not None and any(width is not None for _, width in fields):
            typer.echo("\n".join(acctformat.fixed_width_lines(fields, headers, cells,
                                                              not noheader)))
        else:
            print_table(headers, cells, show_header=not noheader)
        return
    if duplicates:
        records = [one for r in records for one in (*acctformat.earlier_runs(r), r)]
    rows = []
    for r in records:
        chosen = only_steps.get(r["job_id"])
        if chosen is None:
            rows.append([
                _label(r), r["name"], r["partition"], r["account"] or "", r["user"],
                r["state"] + (f" (idle {r['idle_action']})" if r.get("idle_action") else ""),
                _exit(r), format_duration(r["elapsed_s"]), str(r["gpus"]),
                r.get("alloc_tres") or "-", _hours(r["gpu_hours"]), _hours(r["billed_gpu_hours"]),
                _util(r["gpu_util_avg"]), _util(r["gpu_util_peak"]),
                acctformat.max_rss(r) or "-",
                format_total_cpu(r.get("cpu_usec")) or "-"])
        if allocations and chosen is None:
            continue
        rows.extend([f"{_label(r)}.{step['step']}", step["name"], "", r["account"] or "",
                     r["user"], step["state"], _exit(step), format_duration(step["elapsed_s"]),
                     "", "", "", "", "", "", acctformat.max_rss(step) or "-",
                     format_total_cpu(step.get("cpu_usec")) or "-"]
                    for step in r.get("steps") or ()
                    if chosen is None or step["step"] in chosen)
    if parsable or parsable2:
        _print_parsable(COLUMNS, rows, trailing=parsable, header=not noheader,
                        delimiter=delimiter or "|")
        return
    print_table(COLUMNS, rows, right_aligned=frozenset({0, 7, 8, 10, 11, 12, 13, 14, 15}),
                shrinkable=frozenset({1, 2, 3, 4}), show_header=not noheader)
    for r in records:  # the idle-GPU policy's reasons, under the table
        if r.get("idle_action") and r.get("idle_reason"):
            typer.echo(f"{_label(r)}: {r['idle_action']}: {r['idle_reason']}")


def _warn_archive_errors(answer: dict[str, Any]) -> None:
    """Name on stderr each archive of purged jobs the controller could not read."""
    for problem in answer.get("archive_errors") or ():
        typer.echo(f"{PROG}: warning: {terminal_safe(str(problem))}", err=True)


def _print_parsable(headers: Sequence[str], rows: list[list[str]], trailing: bool,
                    header: bool = True, delimiter: str = "|") -> None:
    """sacct -p and -P: a header line (unless -n) and one line a row, fields separated
    by ``|`` (or --delimiter; never cut), with one more at the end of each line for -p;
    the delimiter inside a field is escaped with a backslash."""
    end = delimiter if trailing else ""
    lines = [delimiter.join(terminal_safe(cell).replace(delimiter, "\\" + delimiter)
                            for cell in row) + end
             for row in ([list(headers)] if header else []) + rows]
    if lines:
        typer.echo("\n".join(lines))


def _set(text: str | None) -> set[str] | None:
    return {w.strip() for w in text.split(",") if w.strip()} or None if text else None


def _limit(text: str | None, flag: str) -> int | None:
    """A time limit bound (``--time``'s forms), in seconds."""
    if text is None:
        return None
    from gpusched.core.timefmt import parse_time_limit

    try:
        limit = parse_time_limit(text)
    except (TimeFormatError, ValueError) as err:
        raise UsageError(f"invalid {flag} {text[:24]!r}: {err}") from None
    if limit is None:
        raise UsageError(f"invalid {flag} {text[:24]!r}: give a time such as 1:00:00")
    return int(limit)


def _print_job_texts(jobs: str | None, script: bool) -> None:
    """-B / --env-vars: each -j job's batch script, or its environment (NAME=value
    lines), as sacct prints them."""
    from gpusched.cli.gcancel import parse_job_ids
    from gpusched.client import ApiClient

    if jobs is None:
        raise UsageError("-B/--batch-script and --env-vars need -j JOB")
    ids = parse_job_ids([j for j in jobs.split(",") if j.strip()])
    with ApiClient() as client:
        for job_id in ids:
            job = client.request("GET", f"/v1/jobs/{job_id}")
            what = "Batch Script" if script else "Environment"
            typer.echo(f"{what} for {job_id}\n" + "-" * 80)
            if script:
                text = job.get("script")
                typer.echo("\n".join(terminal_safe(line) for line in text.splitlines())
                           if text is not None else "NONE")
            else:
                for name, value in sorted((job.get("environment") or {}).items()):
                    typer.echo(terminal_safe(f"{name}={value}"))


def _exit(record: dict[str, Any]) -> str:
    """sacct's ExitCode: the exit status, a colon, the signal that ended it (0: none)."""
    return f"{record['exit_code'] if record['exit_code'] is not None else 0}:{record['signal'] or 0}"


def _job_and_step_ids(text: str) -> tuple[list[int | str], dict[int, set[str]]]:
    """``-j``'s ids: jobs (``12``), array tasks (``12_3``) and steps (``12.3``,
    ``12.batch``); the jobs to ask for, and for a job named only by its steps, which of
    them to show."""
    from gpusched.cli.gcancel import parse_job_ids
    from gpusched.cli.jobcontrol import job_refs

    whole: list[str] = []
    steps: dict[int, set[str]] = {}
    for item in [j for j in text.split(",") if j.strip()] or [text]:
        job, dot, step = item.strip().partition(".")
        if not dot:
            whole.append(item)
            continue
        if step != "batch" and not (step.isascii() and step.isdigit() and len(step) <= 10):
            raise UsageError(f"invalid step id {item!r}: expected JOB.STEP such as 12.3 "
                             "or 12.batch")
        steps.setdefault(parse_job_ids([job])[0], set()).add(
            step if step == "batch" else str(int(step)))
    job_ids: list[int | str] = [r.job_id if r.task is None else r.text()
                                for r in job_refs(whole)] if whole else []
    for job_id in job_ids:
        if isinstance(job_id, int):
            steps.pop(job_id, None)  # the whole job is shown
    return job_ids + [j for j in steps if j not in job_ids], steps


def _label(record: dict[str, Any]) -> str:
    if record.get("array_task_id") is not None:
        return f"{record['array_job_id']}_{record['array_task_id']}"
    return str(record["job_id"])


def _report(answer: dict[str, Any], as_json: bool, plot: Path | None) -> None:
    rows = answer["rows"]
    if plot is not None:
        _bar_chart(rows, plot, answer["start"], answer["end"])
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
        return
    typer.echo(terminal_safe(f"GPU usage from {answer['start']} to {answer['end']}"))
    table = [[r["account"] or "-", r["user"], str(r["jobs"]), _hours(r["gpu_hours"]),
              _hours(r["billed_gpu_hours"])] for r in rows]
    total = [sum(r[k] for r in rows) for k in ("jobs", "gpu_hours", "billed_gpu_hours")]
    table.append(["TOTAL", "", str(int(total[0])), _hours(total[1]), _hours(total[2])])
    print_table(["ACCOUNT", "USER", "JOBS", "GPU_HRS", "BILLED"], table,
                right_aligned=frozenset({2, 3, 4}), shrinkable=frozenset({0, 1}))
    if answer.get("budgets"):
        _budget_report(answer["budgets"])


def _budget_report(budgets: list[dict[str, Any]]) -> None:
    """Each GPU-hour budget's use in each of its periods that overlap the window."""
    typer.echo("\nGPU-hour budgets per period")
    print_table(["ACCOUNT", "USER", "PERIOD", "FROM", "BUDGET", "USED", "USED%"], [
        [b["account"], b["user"] or "-", b["period"], (b["period_start"] or "-")[:10],
         _hours(b["budget_gpu_hours"]), _hours(b["used_gpu_hours"]),
         f"{100 * b['used_gpu_hours'] / b['budget_gpu_hours']:.0f}%"
         if b["budget_gpu_hours"] else "-"] for b in budgets],
        right_aligned=frozenset({4, 5, 6}), shrinkable=frozenset({0, 1}))


def _bar_chart(rows: list[dict[str, Any]], path: Path, start: str, end: str) -> None:
    """GPU-hours per account, each bar split by user."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    accounts = sorted({r["account"] or "-" for r in rows})
    users = sorted({r["user"] for r in rows})
    figure = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    bottom = [0.0] * len(accounts)
    for user in users:
        heights = [sum(r["gpu_hours"] for r in rows if (r["account"] or "-") == a
                       and r["user"] == user) for a in accounts]
        axes.bar(accounts, heights, bottom=bottom, label=user)
        bottom = [b + h for b, h in zip(bottom, heights)]
    axes.set_ylabel("GPU-hours")
    axes.set_title(f"GPU-hours by account and user\n{start[:16]} to {end[:16]}")
    if users:
        axes.legend(fontsize="small")
    figure.tight_layout()
    try:
        figure.savefig(path, format="png")
    except OSError as exc:
        raise UsageError(f"cannot write the plot to {path}: {exc.strerror}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gacct`` console script."""
    return run_slurm_cli(app, PROG, argv, declared=True)
