"""The queue as gqueue shows it: rows, tables and squeue's format codes.

Kept free of typer: a bare ``gqueue`` lists the queue without loading the command-line
framework (see ``gpusched.cli.console``).
"""

from __future__ import annotations

import sys

from gpusched.cli.output import print_columns, print_table
from gpusched.client import ApiClient, jsontext
from gpusched.core.timefmt import format_duration
from gpusched.errors import GpuschedError, UsageError

# A bare gqueue and gqueue --json load no json, re, datetime, typing or urllib (see
# gpusched.cli.console): times are parsed only for jobs that started, and the rare
# forms (--format, --start, a multi-node job's host list) load what they need.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from datetime import datetime
    from typing import Any

    from gpusched.cli.queueformat import Field

HEADERS = ("JOBID", "PARTITION", "NAME", "USER", "ST", "TIME", "GPUS", "NODELIST(REASON)")
RIGHT_ALIGNED = frozenset({0, 5, 6})
START_HEADERS = ("JOBID", "PARTITION", "NAME", "USER", "ST", "START_TIME", "NODES",
                 "NODELIST(REASON)")
# Names may be cut to fit 80 columns; ids, states and times never are.
SHRINKABLE = frozenset({1, 2, 3, 7})
# squeue's codes for gpusched.core.model.JobState, copied rather than imported: the
# model module builds a dozen dataclasses (~8 ms) that a queue listing never uses.
# tests/cli/test_cli_format.py checks the copy against JobState.
STATE_CODES = {
    "PENDING": "PD", "RUNNING": "R", "COMPLETED": "CD",
    "FAILED": "F", "CANCELLED": "CA", "TIMEOUT": "TO", "NODE_FAIL": "NF",
    "OUT_OF_MEMORY": "OOM", "SUSPENDED": "S", "DEADLINE": "DL",
}
_BY_CODE = {code: name for name, code in STATE_CODES.items()}
# squeue's states no job here is ever in: a listing of them is empty, as squeue's is on a
# cluster where none is.
SLURM_ONLY_STATES = {
    "CG": "COMPLETING", "CF": "CONFIGURING", "PR": "PREEMPTED", "BF": "BOOT_FAIL",
    "RV": "REVOKED", "SE": "SPECIAL_EXIT", "RD": "RESV_DEL_HOLD", "RF": "REQUEUE_FED",
    "RH": "REQUEUE_HOLD", "RQ": "REQUEUED", "RS": "RESIZING", "SI": "SIGNALING",
    "SO": "STAGE_OUT", "ST": "STOPPED",
}
NEVER_RAN = format_duration(0)
LAUNCH_FAILED = "LaunchFailed"  # gpusched.db.agents.LAUNCH_FAILED_REASON
# The JOB fields the plain table and --start show.
TABLE_FIELDS = ("job_id", "display_id", "partition", "name", "user", "state", "reason",
                "gpus", "start_time", "end_time", "node", "node_names", "share_mode", "share",
                "gpu_mem_mb", "idle_warned_at", "idle_action", "suspended_seconds", "suspended_at")
START_FIELDS = ("job_id", "display_id", "partition", "name", "user", "state", "reason",
                "expected_start", "nodes", "node", "node_names")


def show(path: str, as_json: bool = False, start: bool = False, noheader: bool = False,
         fields: list[Field] | None = None) -> None:
    """Print the jobs of ``GET path``: JSON, a --format, the --start table or the queue."""
    with ApiClient() as client:
        if as_json:
            print_jobs_json(client.request_bytes("GET", path))
            return
        answer = client.request("GET", path)
    if fields is None and not as_json and not start:
        print_columns(HEADERS, queue_columns(job_columns(answer, TABLE_FIELDS)),
                      right_aligned=RIGHT_ALIGNED, shrinkable=SHRINKABLE, show_header=not noheader)
        return
    jobs = job_objects(answer)
    if fields is not None and not as_json:
        from gpusched.cli.queueformat import render_format

        now = _now()
        if not noheader:
            print(render_format(fields, None, now))
        for job in jobs:
            print(render_format(fields, job, now))
        return
    print_table(START_HEADERS, [start_row(job) for job in jobs], right_aligned=frozenset({0, 6}),
                shrinkable=frozenset({1, 2, 3, 7}), show_header=not noheader)


_CONTROL_BYTES = bytes([*range(0x20), 0x7f])


def print_jobs_json(data: bytes) -> None:
    """``--json``: ``{"jobs": [JOB, ...]}``. The controller's own text is printed as it
    came when it is that object as the controller writes it, in printable ASCII
    (non-ASCII and control characters escaped): re-encoding a long queue's JSON costs
    more than the rest of the command, and so does decoding it only to check it."""
    text = data.strip()
    if text.startswith(b'{"jobs":[') and text.endswith(b"]}") and _printable_ascii(text):
        sys.stdout.flush()
        sys.stdout.buffer.write(text + b"\n")
        return
    try:
        answer = jsontext.loads(data)
    except ValueError:
        raise GpuschedError("the gpusched controller sent a non-JSON answer") from None
    if not isinstance(answer, dict):
        raise GpuschedError("the gpusched controller sent a non-JSON answer")
    if list(answer) == ["jobs"] and _printable_ascii(text):
        sys.stdout.flush()
        sys.stdout.buffer.write(text + b"\n")
        return
    import json

    print(json.dumps({"jobs": job_objects(answer)}))


def _printable_ascii(text: bytes) -> bool:
    """Whether ``text`` holds only printable ASCII (no control character, no DEL)."""
    return text.isascii() and len(text.translate(None, _CONTROL_BYTES)) == len(text)


def job_objects(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The jobs of a ``GET /v1/jobs`` answer, whether JOB objects or a table of fields."""
    if "rows" in answer:
        names = answer.get("fields") or []
        return [dict(zip(names, row)) for row in answer["rows"]]
    return list(answer.get("jobs", []))


def parse_states(text: str | None, flag: str = "--states",
                 allowed: tuple[str, ...] | None = None, why: str = "") -> list[str] | None:
    """State names from a state list: squeue's short codes or full names (``all``: every
    state, or every ``allowed`` one); None for no list. A state outside ``allowed`` is
    an error that says ``why``."""
    if text is None:
        return None
    names: list[str] = []
    for word in (part.strip().upper() for part in text.split(",")):
        if not word:
            continue
        if word == "ALL":
            return list(allowed or STATE_CODES)
        state = _BY_CODE.get(word) or (word if word in STATE_CODES else None)
        if state is None and allowed is None:
            state = SLURM_ONLY_STATES.get(word) or (
                word if word in SLURM_ONLY_STATES.values() else None)
        if state is None:
            known = ", ".join(f"{code}/{name}" for name, code in STATE_CODES.items())
            raise UsageError(f"{flag}: unknown job state {word!r}; known: {known}")
        if allowed is not None and state not in allowed:
            raise UsageError(f"invalid {flag} {word!r}: {why}")
        if state not in names:
            names.append(state)
    if not names:
        raise UsageError(f"{flag}: give at least one job state")
    return names


def jobs_path(*, user: str | None, states: Iterable[str] | None, show_all: bool,
              ids: Iterable[int | str] | None = None, partition: str | None = None,
              account: str | None = None, name: str | None = None,
              fields: Iterable[str] | None = None) -> str:
    """The ``GET /v1/jobs`` path for these filters (comma lists), asking for only
    ``fields`` of each job when given."""
    query: dict[str, str] = {}
    for key, text in (("partition", partition), ("account", account), ("name", name)):
        if text is not None:
            words = [w.strip() for w in text.split(",") if w.strip()]
            if not words:
                raise UsageError(f"--{key}: give at least one name")
            query[key] = ",".join(words)
    if fields is not None:
        query["fields"] = ",".join(fields)
    if ids is not None:
        query["ids"] = ",".join(map(str, ids))
    state_list = list(states) if states is not None else None
    # Asking for states by name includes ended ones, as squeue -t CD does.
    if show_all or state_list is not None:
        query["all"] = "1"
    if user:
        query["user"] = user
    if state_list is not None:
        query["state"] = ",".join(state_list)
    return "/v1/jobs" + (f"?{query_text(query)}" if query else "")


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~,")


def query_text(query: Mapping[str, str]) -> str:
    """``urllib.parse.urlencode(query, safe=",")``, without loading urllib (and re)."""
    return "&".join(f"{_quote_plus(key)}={_quote_plus(value)}" for key, value in query.items())


def _quote_plus(text: str) -> str:
    # surrogateescape: an argument that is not UTF-8 (a byte the shell passed through)
    # goes as its bytes; the controller refuses what is not a name.
    return "".join(chr(byte) if byte in _UNRESERVED else "+" if byte == 32 else f"%{byte:02X}"
                   for byte in text.encode("utf-8", "surrogateescape"))


def job_columns(answer: Mapping[str, Any], names: Iterable[str]) -> dict[str, Sequence[Any]]:
    """Each named JOB field of a ``GET /v1/jobs`` answer as a column of values, one per
    job (None where a job lacks the field), whether the answer is JOB objects or a table."""
    if "rows" in answer:
        fields = list(answer.get("fields") or [])
        rows = answer["rows"]
        count = len(rows)
        columns = dict(zip(fields, zip(*rows))) if count else {}
        return {name: columns.get(name) or [None] * count for name in names}
    jobs = answer.get("jobs", [])
    return {name: [job.get(name) for job in jobs] for name in names}


def queue_columns(values: Mapping[str, Sequence[Any]], now: datetime | None = None
                  ) -> list[list[str]]:
    """The squeue-style table, column by column, from ``job_columns(.., TABLE_FIELDS)``:
    a queue of 10,000 jobs is built in a few milliseconds this way. ``now`` (default:
    the clock) is read only when a job has started."""
    states = values["state"]
    labels = [str(shown or job_id or "") for shown, job_id in zip(values["display_id"], values["job_id"])]
    return [
        [label if len(label) <= 24 else job_label({"display_id": label}) for label in labels],
        [str(text or "") for text in values["partition"]],
        [str(text or "") for text in values["name"]],
        [str(text or "") for text in values["user"]],
        [short_state(str(state or "")) for state in states],
        _run_times(values["start_time"], values["end_time"], now,
                   zip(values["suspended_seconds"], values["suspended_at"])),
        _gpu_cells(values),
        [_node_or_reason(*cells) + _idle_flag(state, warned, action) for state, *cells, warned,
         action in zip(states, states, values["reason"], values["node"], values["node_names"],
                       values["idle_warned_at"], values["idle_action"])],
    ]


def _idle_flag(state: object, warned: object, action: object) -> str:
    """The idle-GPU policy's mark after a job's nodes: warned while running, or how it
    ended (docs/user-guide.md)."""
    if warned and state == "RUNNING":
        return " (IdleWarned)"
    return " (IdleCancelled)" if action == "cancel" and state == "CANCELLED" else ""


def _gpu_cells(values: Mapping[str, Sequence[Any]]) -> list[str]:
    """The GPUS column: whole GPUs as a count; a share or GPU memory as gpu_share says
    (a queue with none of those is the count alone, as fast as before)."""
    modes, memories = values["share_mode"], values["gpu_mem_mb"]
    if not any(modes) and not any(memories):
        return [str(gpus or 0) for gpus in values["gpus"]]
    return [str(gpus or 0) if mode is None and memory is None else gpu_share(mode, units, memory)
            for gpus, mode, units, memory in zip(values["gpus"], modes, values["share"],
                                                 memories)]


def _run_times(starts: Sequence[Any], ends: Sequence[Any], now: datetime | None,
               suspended: Iterable[tuple[Any, Any]]) -> list[str]:
    """The TIME column (the time suspended not counted). Most of a long queue never
    started: no clock or time arithmetic for those."""
    if not any(starts):
        return [NEVER_RAN] * len(starts)
    clock = now or _now()
    return [format_duration(_elapsed(start, end, clock, *held)) if start else NEVER_RAN
            for start, end, held in zip(starts, ends, suspended)]


def job_row(job: Mapping[str, Any], now: datetime) -> list[str]:
    """One squeue-style row for a JOB object of the API."""
    return [cells[0] for cells in queue_columns(job_columns({"jobs": [job]}, TABLE_FIELDS), now)]


def job_label(job: Mapping[str, Any], width: int = 24) -> str:
    """The JOBID cell: the job id, ``12_3`` for an array task, ``12_[4-99%8]`` for the
    tasks of an array still pending (a long task list cut at a comma to fit ``width``)."""
    label = str(job.get("display_id") or job.get("job_id", ""))
    if len(label) <= width or not label.endswith("]"):
        return label
    head, _, tasks = label[:-1].partition("[")
    tasks, percent, cap = tasks.partition("%")
    tail = f"...{percent}{cap}]"
    room = width - len(head) - 1 - len(tail)
    cut = tasks[:room + 1].rpartition(",")[0] if room > 0 else ""
    return f"{head}[{cut},{tail}" if cut else label


def start_row(job: Mapping[str, Any]) -> list[str]:
    """One ``gqueue --start`` row: the expected start in local time, or N/A."""
    expected = _parse_time(job.get("expected_start"))
    when = "N/A"
    if expected:
        from gpusched.cli.slurmflags import time_format

        when = expected.astimezone().strftime(time_format())
    return [job_label(job), str(job.get("partition") or ""), str(job.get("name") or ""),
            str(job.get("user") or ""), short_state(str(job.get("state", ""))), when,
            str(job.get("nodes") or 1), node_or_reason(job)]


def short_state(state: str) -> str:
    """squeue's two-letter state code; an unknown state shows its first two letters."""
    return STATE_CODES.get(state, state[:2])


def elapsed_seconds(job: Mapping[str, Any], now: datetime) -> float:
    """Run time so far (running) or in all (ended), less the time it was suspended; 0 for
    a job that never started."""
    return _elapsed(job.get("start_time"), job.get("end_time"), now,
                    job.get("suspended_seconds"), job.get("suspended_at"))


def _elapsed(start_time: object, end_time: object, now: datetime,
             suspended_seconds: object = None, suspended_at: object = None) -> float:
    start = _parse_time(start_time)
    if start is None:
        return 0.0
    end = _parse_time(end_time) or now
    held = float(suspended_seconds) if isinstance(suspended_seconds, int | float) else 0.0
    since = _parse_time(suspended_at)  # suspended still (or when it ended)
    if since is not None:
        held += max(0.0, (end - since).total_seconds())
    return max(0.0, (end - start).total_seconds() - held)


def node_or_reason(job: Mapping[str, Any]) -> str:
    """The NODELIST(REASON) cell: ``(Reason)`` while pending, else the node."""
    return _node_or_reason(job.get("state"), job.get("reason"), job.get("node"),
                           job.get("node_names"))


def _node_or_reason(state: object, reason: object, node: object, names: list[str] | None) -> str:
    # A job whose launch failed never ran on its node: why it ended says more.
    if state == "PENDING" or reason == LAUNCH_FAILED:
        return f"({reason or 'None'})"
    return _node_list(node, names)


def _node_list(node: object, names: list[str] | None) -> str:
    if not names:
        return str(node or "")
    from gpusched.core.hostlist import compress_hostlist

    return compress_hostlist(names)


def _now() -> datetime:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


def _parse_time(value: object) -> datetime | None:
    """An ISO 8601 time of the API; a time without zone is taken as UTC."""
    if not isinstance(value, str) or not value:
        return None
    from datetime import datetime, timezone

    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise GpuschedError(f"the controller sent a malformed time {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def __getattr__(name: str) -> Any:
    """squeue's -o/--format lives in gpusched.cli.queueformat (loaded only for a
    format); its names stay reachable here."""
    if name in _FORMAT_NAMES:
        from gpusched.cli import queueformat

        return getattr(queueformat, name)
    raise AttributeError(name)


_FORMAT_NAMES = frozenset({"Field", "_NEEDS", "_FIELDS", "parse_format", "format_fields", "render_format", "_gres", "_local"})


def gpu_share(mode: str | None, units: int | None, memory: int | None) -> str:
    """The GPUS cell of a share or a GPU-memory request: ``mps:50``, ``shard:2``,
    ``gpumem:20G``, ``mps:50,gpumem:20G``."""
    parts = [] if mode is None else [f"{mode}:{units}"]
    if memory is not None:
        parts.append(f"gpumem:{memory_size(int(memory))}")
    return ",".join(parts)


def memory_size(mib: int) -> str:
    """MiB as sbatch writes a size: ``20G``, ``1T``, ``512M``."""
    for unit, size in (("T", 1024 * 1024), ("G", 1024)):
        if mib % size == 0:
            return f"{mib // size}{unit}"
    return f"{mib}M"


def node_set(text: str | None, option: str = "--nodelist") -> set[str] | None:
    """A host-list filter's nodes (``option``'s: -w/--nodelist, or ginfo's -n/--nodes),
    expanded (``node[01-04],gpu7``); None: no filter; a usage error for a bad host list."""
    if text is None:
        return None
    from gpusched.core.hostlist import HostlistError, expand_hostlist

    try:
        return set(expand_hostlist(text))
    except HostlistError as err:
        raise UsageError(f"invalid {option} {text[:64]!r}: {err}") from None
