"""sacct's field names for gacct's ``-o/--format`` (and ``-b``, ``-l``,
``--helpformat``, ``SACCT_FORMAT``), the client-side filters sacct has and the
accounting listing does not take, and ``-D`` (one row per run of a requeued job)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from gpusched.core.hostlist import compress_hostlist
from gpusched.core.terminal import terminal_safe
from gpusched.core.timefmt import format_duration
from gpusched.core.usage import format_max_rss, format_total_cpu
from gpusched.errors import UsageError

Record = dict[str, Any]
Row = tuple[Record, "Record | None"]  # a job (or one run of it), and one of its steps


def label(record: Record) -> str:
    """The JobID: ``12``, an array task ``12_3``."""
    if record.get("array_task_id") is not None:
        return f"{record['array_job_id']}_{record['array_task_id']}"
    return str(record["job_id"])


def _either(row: Row, key: str) -> Any:
    job, step = row
    return (step if step is not None else job).get(key)


def _exit(row: Row) -> str:
    code, sig = _either(row, "exit_code"), _either(row, "signal")
    return f"{code if code is not None else 0}:{sig or 0}"


def _nodes(row: Row) -> list[str]:
    job, step = row
    if step is not None:
        return list(step.get("node_names") or [])
    return sorted({held["node"] for held in job.get("alloc") or () if held.get("node")}) \
        or list(job.get("node_names") or [])


def _time(text: object) -> str:
    if not isinstance(text, str) or not text:
        return "Unknown"
    from gpusched.cli.slurmflags import time_format

    return datetime.fromisoformat(text).astimezone().strftime(time_format())


def _limit(row: Row) -> str:
    limit = row[0].get("time_limit")
    return format_duration(int(limit)) if limit else "UNLIMITED"


def _planned(row: Row) -> str:
    """Time the job waited to start (sacct's Planned), 0 for its steps."""
    job, step = row
    if step is not None or not job.get("start_time"):
        return "00:00:00" if step is not None else "INVALID"
    waited = (datetime.fromisoformat(job["start_time"])
              - datetime.fromisoformat(job["submit_time"])).total_seconds()
    return format_duration(max(0, int(waited)))


UNITS = "KMGTP"


def max_rss(one: Record) -> str:
    """MaxRSS as sacct writes it; ``max_rss_unit`` (``--units``: K, M, G, T or P, two
    decimals) or ``max_rss_raw`` (``--noconvert``: in K) mark how."""
    size = one.get("max_rss_bytes")
    unit = one.get("max_rss_unit")
    if size is not None and unit:
        return f"{int(size) / 1024 ** (UNITS.index(unit) + 1):.2f}{unit}"
    if size is not None and one.get("max_rss_raw"):
        return f"{int(size) // 1024}K"
    return format_max_rss(size)


def truncate(record: Record, start: datetime | None, end: datetime | None) -> Record:
    """sacct -T: the job's start and end cut to the window, its elapsed time with them."""
    began = datetime.fromisoformat(record["start_time"]) if record.get("start_time") else None
    ended = datetime.fromisoformat(record["end_time"]) if record.get("end_time") else None
    if began is None:
        return record
    if start is not None and began < start:
        began = start
    if end is not None and (ended is None or ended > end):
        ended = end
    elapsed = ((ended or datetime.now(began.tzinfo)) - began).total_seconds()
    return {**record, "start_time": began.isoformat(),
            "end_time": ended.isoformat() if ended else None, "elapsed_s": max(0.0, elapsed)}


def group_name(gid: object) -> str:
    """A gid's group name (the gid itself when no group has it)."""
    if not isinstance(gid, int):
        return ""
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def group_ids(text: str | None) -> set[int] | None:
    """``-g``'s groups, by name or gid, as gids; a usage error naming an unknown name."""
    if text is None:
        return None
    import grp

    gids = set()
    for word in (w.strip() for w in text.split(",") if w.strip()):
        if word.isascii() and word.isdigit() and len(word) <= 10:
            gids.add(int(word))
            continue
        try:
            gids.add(grp.getgrnam(word).gr_gid)
        except KeyError:
            raise UsageError(f"invalid --gid {word[:32]!r}: no such group") from None
    if not gids:
        raise UsageError("--gid: give at least one group")
    return gids


def _all_cpus(record: Record) -> int:
    """The job's CPUs on all its nodes (its ``cpus`` are per node)."""
    return int(record.get("cpus") or 0) * int(record.get("nodes") or 1)


def _cpu_time(row: Row) -> float:
    return float(_either(row, "elapsed_s") or 0) * _all_cpus(row[0])


# sacct's field names (lower case) -> (the header, the value of a row).
FIELDS: dict[str, tuple[str, Callable[[Row], str]]] = {
    "jobid": ("JobID", lambda r: label(r[0]) + (f".{r[1]['step']}" if r[1] else "")),
    "jobidraw": ("JobIDRaw", lambda r: str(r[0]["job_id"]) + (f".{r[1]['step']}" if r[1] else "")),
    "jobname": ("JobName", lambda r: str(_either(r, "name") or "")),
    "partition": ("Partition", lambda r: "" if r[1] else str(r[0].get("partition") or "")),
    "account": ("Account", lambda r: str(r[0].get("account") or "")),
    "user": ("User", lambda r: "" if r[1] else str(r[0].get("user") or "")),
    "uid": ("UID", lambda r: "" if r[1] or r[0].get("uid") is None else str(r[0]["uid"])),
    "qos": ("QOS", lambda r: "" if r[1] else str(r[0].get("qos") or "")),
    "state": ("State", lambda r: str(_either(r, "state") or "")),
    "exitcode": ("ExitCode", _exit),
    "elapsed": ("Elapsed", lambda r: format_duration(int(_either(r, "elapsed_s") or 0))),
    "elapsedraw": ("ElapsedRaw", lambda r: str(int(_either(r, "elapsed_s") or 0))),
    "start": ("Start", lambda r: _time(_either(r, "start_time"))),
    "end": ("End", lambda r: _time(_either(r, "end_time")) if _either(r, "end_time")
            else "Unknown"),
    "submit": ("Submit", lambda r: _time(r[0].get("submit_time"))),
    "planned": ("Planned", _planned), "reserved": ("Reserved", _planned),
    "alloctres": ("AllocTRES", lambda r: "" if r[1] else str(r[0].get("alloc_tres") or "")),
    "nnodes": ("NNodes", lambda r: str(len(_nodes(r)) or r[0].get("nodes") or 1)),
    "allocnodes": ("AllocNodes", lambda r: str(len(_nodes(r)))),
    "nodelist": ("NodeList", lambda r: compress_hostlist(_nodes(r)) or "None assigned"),
    "alloccpus": ("AllocCPUS", lambda r: str(_all_cpus(r[0]))),
    "reqcpus": ("ReqCPUS", lambda r: str(_all_cpus(r[0]))),
    "reqmem": ("ReqMem", lambda r: f"{r[0].get('mem_mb') or 0}M"),
    "ntasks": ("NTasks", lambda r: str(r[1].get("ntasks") or "") if r[1] else ""),
    "maxrss": ("MaxRSS", lambda r: max_rss(r[1] if r[1] is not None else r[0])),
    "totalcpu": ("TotalCPU", lambda r: format_total_cpu(_either(r, "cpu_usec"))),
    "cputime": ("CPUTime", lambda r: format_duration(int(_cpu_time(r)))),
    "cputimeraw": ("CPUTimeRAW", lambda r: str(int(_cpu_time(r)))),
    "timelimit": ("Timelimit", _limit),
    "timelimitraw": ("TimelimitRaw", lambda r: str(int(r[0]["time_limit"]) // 60)
                     if r[0].get("time_limit") else "UNLIMITED"),
    "reason": ("Reason", lambda r: "" if r[1] else str(r[0].get("reason") or "None")),
    "workdir": ("WorkDir", lambda r: "" if r[1] else str(r[0].get("work_dir") or "")),
    "constraints": ("Constraints", lambda r: "" if r[1] else str(r[0].get("constraint") or "")),
    "restarts": ("Restarts", lambda r: "" if r[1] else str(r[0].get("restarts") or 0)),
    "reservation": ("Reservation", lambda r: "" if r[1] else str(r[0].get("reservation") or "")),
    "gid": ("GID", lambda r: "" if r[1] or r[0].get("gid") is None else str(r[0]["gid"])),
    "group": ("Group", lambda r: "" if r[1] else group_name(r[0].get("gid"))),
    # gpusched's own: GPUs, GPU-hours, billed GPU-hours, GPU utilisation
    "gpus": ("GPUs", lambda r: "" if r[1] else str(r[0].get("gpus") or 0)),
    "gpuhours": ("GPUHours", lambda r: "" if r[1] else f"{float(r[0].get('gpu_hours') or 0):.2f}"),
    "billed": ("Billed", lambda r: "" if r[1] else
               f"{float(r[0].get('billed_gpu_hours') or 0):.2f}"),
    "avgutil": ("AvgUtil", lambda r: "" if r[1] or r[0].get("gpu_util_avg") is None
                else f"{float(r[0]['gpu_util_avg']):.0f}%"),
    "peakutil": ("PeakUtil", lambda r: "" if r[1] or r[0].get("gpu_util_peak") is None
                 else f"{float(r[0]['gpu_util_peak']):.0f}%"),
}
BRIEF = "jobid,state,exitcode"
DEFAULT = ("jobid,jobname,partition,account,user,state,exitcode,elapsed,gpus,alloctres,"
           "gpuhours,billed,avgutil,peakutil,maxrss,totalcpu")
LONG = ("jobid,jobidraw,jobname,partition,account,user,uid,qos,state,exitcode,start,end,"
        "elapsed,timelimit,nnodes,nodelist,alloccpus,reqmem,alloctres,maxrss,totalcpu,"
        "gpus,gpuhours,billed")


def parse_format(text: str) -> list[tuple[str, int | None]]:
    """sacct's ``-o``: field names, comma separated, each with an optional ``%WIDTH``;
    an unknown name is a usage error naming it."""
    fields: list[tuple[str, int | None]] = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        name, percent, width = item.partition("%")
        key = name.strip().lower()
        if key not in FIELDS:
            raise UsageError(f"invalid --format: no field {name[:40]!r} here (gacct "
                             "--helpformat lists them)")
        if percent and not (width.isascii() and width.isdigit() and len(width) <= 4):
            raise UsageError(f"invalid --format {item[:40]!r}: expected NAME%WIDTH")
        fields.append((key, int(width) if percent else None))
    if not fields:
        raise UsageError("invalid --format: name at least one field, such as JobID")
    return fields


def help_format() -> str:
    """--helpformat: every field name, four a line."""
    names = [header for header, _ in FIELDS.values()]
    return "\n".join(" ".join(f"{n:<14}" for n in names[at:at + 4]).rstrip()
                     for at in range(0, len(names), 4))


def rows_of(records: Iterable[Record], allocations: bool, duplicates: bool,
            only_steps: dict[int, set[str]]) -> list[Row]:
    """The rows of the listing: each job (with ``duplicates``, each earlier run of it
    first, as REQUEUED), then its steps unless ``allocations``; a job named only by
    its steps shows those alone."""
    rows: list[Row] = []
    for record in records:
        chosen = only_steps.get(record["job_id"])
        if chosen is None:
            if duplicates:
                rows += [(run, None) for run in earlier_runs(record)]
            rows.append((record, None))
            if allocations:
                continue
        rows += [(record, step) for step in record.get("steps") or ()
                 if chosen is None or step["step"] in chosen]
    return rows


def earlier_runs(record: Record) -> list[Record]:
    """A requeued job's runs before its latest, as rows of their own: state REQUEUED,
    each run's start, end, nodes and GPUs (its usage counts in the job's own row)."""
    runs = list(record.get("runs") or ())[:-1]
    out = []
    for run in runs:
        start, end = run["start"], run["end"]
        elapsed = ((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
                   if end else 0.0)
        out.append({**record, "state": "REQUEUED", "exit_code": 0, "signal": 0,
                    "start_time": start, "end_time": end, "elapsed_s": max(0.0, elapsed),
                    "gpus": run["gpus"], "alloc": [{"node": n} for n in run["node_names"]],
                    "alloc_tres": f"gres/gpu={run['gpus']}", "gpu_hours": 0.0,
                    "billed_gpu_hours": 0.0, "gpu_util_avg": None, "gpu_util_peak": None,
                    "max_rss_bytes": None, "cpu_usec": None, "steps": []})
    return out


def render_rows(fields: Sequence[tuple[str, int | None]], rows: Sequence[Row]
                ) -> tuple[list[str], list[list[str]]]:
    """The headers and cells of ``rows``, escaped, each cut to its field's width."""
    headers = [FIELDS[key][0] for key, _ in fields]
    cells = [[terminal_safe(FIELDS[key][1](row)) for key, _ in fields] for row in rows]
    return headers, cells


def fixed_width_lines(fields: Sequence[tuple[str, int | None]], headers: Sequence[str],
                      cells: Sequence[Sequence[str]], header: bool) -> list[str]:
    """sacct's fixed columns: each field as wide as asked (default 10), cut with ``+``."""
    widths = [width or 10 for _, width in fields]

    def line(values: Sequence[str]) -> str:
        return " ".join((v if len(v) <= w else v[:w - 1] + "+").rjust(w)
                        for v, w in zip(values, widths))

    lines = [line(headers), " ".join("-" * w for w in widths)] if header else []
    return lines + [line(row) for row in cells]


def in_range(text: str | None, flag: str) -> tuple[int, int] | None:
    """``-i``/``-I``'s ``MIN[-MAX]``: a count range."""
    if text is None:
        return None
    low, dash, high = text.strip().partition("-")
    try:
        bounds = (int(low), int(high) if dash else int(low))
    except ValueError:
        raise UsageError(f"invalid {flag} {text[:24]!r}: expected MIN or MIN-MAX") from None
    if bounds[0] < 0 or bounds[1] < bounds[0]:
        raise UsageError(f"invalid {flag} {text[:24]!r}: expected MIN or MIN-MAX")
    return bounds


def keep(record: Record, *, names: set[str] | None, partitions: set[str] | None,
         gids: set[int] | None = None,
         qos: set[str] | None, nodes: set[str] | None, reasons: set[str] | None,
         node_range: tuple[int, int] | None, cpu_range: tuple[int, int] | None,
         limit_min: int | None, limit_max: int | None) -> bool:
    """Whether sacct's client-side filters keep ``record``."""
    placed = set(_nodes((record, None)))
    count = len(placed) or int(record.get("nodes") or 1)
    limit = record.get("time_limit")
    return ((names is None or record.get("name") in names)
            and (gids is None or record.get("gid") in gids)
            and (partitions is None or record.get("partition") in partitions)
            and (qos is None or record.get("qos") in qos)
            and (nodes is None or bool(placed & nodes))
            and (reasons is None or str(record.get("reason") or "").lower() in reasons)
            and (node_range is None or node_range[0] <= count <= node_range[1])
            and (cpu_range is None or cpu_range[0] <= _all_cpus(record) <= cpu_range[1])
            and (limit_min is None or (limit is None or limit >= limit_min))
            and (limit_max is None or (limit is not None and limit <= limit_max)))
