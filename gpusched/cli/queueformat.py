"""squeue's output formats for gqueue: ``-o`` field codes, ``-O`` field names, ``-l``,
and ``-S`` sort keys. Loaded only when one of them is asked for."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from gpusched.cli.listing import _node_list as node_list
from gpusched.cli.listing import (
    _parse_time,
    elapsed_seconds,
    gpu_share,
    job_label,
    memory_size,
    node_or_reason,
    short_state,
)
from gpusched.cli.slurmflags import time_format
from gpusched.core.terminal import terminal_safe
from gpusched.core.timefmt import format_duration
from gpusched.errors import UsageError

__all__ = ["Field", "gpu_share", "parse_format", "parse_long_format", "render_format",
           "sort_jobs"]


class Field:
    """One piece of a format: literal text, or a field code with its width."""

    __slots__ = ("code", "width", "right", "text")

    def __init__(self, code: str, width: int | None, right: bool, text: str = "") -> None:
        self.code = code  # "" for literal text
        self.width = width
        self.right = right
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Field) and (self.code, self.width, self.right, self.text) == (
            other.code, other.width, other.right, other.text)

    def __repr__(self) -> str:
        return f"Field({self.code!r}, {self.width!r}, {self.right!r}, {self.text!r})"


# squeue -l's format.
LONG_FORMAT = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"
# The JOB fields each format code reads (beyond state, which every line's code may use).
_NEEDS: dict[str, tuple[str, ...]] = {
    "i": ("job_id", "display_id"), "A": ("job_id",), "P": ("partition",), "j": ("name",),
    "u": ("user",), "a": ("account",), "q": ("qos",), "t": (), "T": (),
    "M": ("start_time", "end_time", "suspended_seconds", "suspended_at"), "l": ("time_limit",), "D": ("nodes",),
    "b": ("gpus", "nodes", "gpu_types", "share_mode", "share", "gpu_mem_mb"),
    "C": ("cpus", "nodes"), "m": ("mem_mb",),
    "R": ("reason", "node", "node_names"), "r": ("reason",), "N": ("node", "node_names"),
    "S": ("start_time", "expected_start"), "V": ("submit_time",), "e": ("end_time",), "Q": (),
    "W": ("licenses",), "f": ("constraint",), "B": ("node", "node_names"), "c": ("cpus", "nodes"),
    "E": ("dependency",), "F": ("job_id", "array_job_id"),
    "K": ("array_task_id", "array_tasks", "array_max_running"), "h": ("exclusive",),
    "L": ("start_time", "end_time", "time_limit", "suspended_seconds", "suspended_at"), "n": ("nodelist",), "U": ("uid",),
    "x": ("exclude",), "Z": ("work_dir",), "p": (),
    "v": ("reservation",), "y": ("nice",),
}
# The same for the -O names with no code of their own.
_LONG_NEEDS: dict[str, tuple[str, ...]] = {
    "stdout": ("output",), "stderr": ("error", "output"), "exit_code": ("exit_code", "signal"),
    "restarts": ("restarts",), "requeue": ("requeue",), "eligible": ("begin_time", "submit_time"),
    "time_min": ("time_min",), "deadline": ("deadline",),
}


def _time_left(job: Mapping[str, Any], now: datetime) -> str:
    """squeue's %L: the time limit less the run time (the whole limit while pending)."""
    limit = job.get("time_limit")
    if not limit:
        return "UNLIMITED"
    return format_duration(max(0.0, float(limit) - elapsed_seconds(job, now)))


def _array_task(job: Mapping[str, Any]) -> str:
    """squeue's %K: the task id, the pending tasks' ids (``4-99%8``), or N/A."""
    if job.get("array_task_id") is not None:
        return str(job["array_task_id"])
    if job.get("array_tasks"):
        cap = job.get("array_max_running")
        return str(job["array_tasks"]) + ("" if cap is None else f"%{cap}")
    return "N/A"


PRIORITY_SCALE = 4294967295  # Slurm's priorities are 32-bit integers; %p is one over it


def _priority(job: Mapping[str, Any], whole: bool) -> str:
    """squeue's %Q (an integer: the priority scaled as Slurm's are) or %p (the 0-1
    float); N/A for a job that is not pending (``priority`` is set for pending ones)."""
    value = job.get("priority")
    if not isinstance(value, (int, float)):
        return "N/A"
    return str(round(value * PRIORITY_SCALE)) if whole else f"{value:.8f}"


def _dependency(job: Mapping[str, Any]) -> str:
    """squeue's %E: the dependencies left, each with its state (``afterok:12(unfulfilled)``,
    ``(failed)`` once it can no longer be met); ``(null)`` when none is left."""
    states = job.get("_dependency_states")
    text = job.get("dependency")
    if not text:
        return "(null)"
    if states is None:
        return str(text)
    shown = [f"{item}({state})" for item, state in states if state != "satisfied"]
    return ",".join(shown) or "(null)"


_FIELDS: dict[str, tuple[str, Callable[[Mapping[str, Any], datetime], str]]] = {
    "i": ("JOBID", lambda j, now: job_label(j, width=10**6)),
    "A": ("JOBID", lambda j, now: str(j.get("job_id", ""))),
    "P": ("PARTITION", lambda j, now: str(j.get("partition") or "")),
    "j": ("NAME", lambda j, now: str(j.get("name") or "")),
    "u": ("USER", lambda j, now: str(j.get("user") or "")),
    "a": ("ACCOUNT", lambda j, now: str(j.get("account") or "")),
    "q": ("QOS", lambda j, now: str(j.get("qos") or "")),
    "t": ("ST", lambda j, now: short_state(str(j.get("state", "")))),
    "T": ("STATE", lambda j, now: str(j.get("state", ""))),
    "M": ("TIME", lambda j, now: format_duration(elapsed_seconds(j, now))),
    "l": ("TIME_LIMIT", lambda j, now: format_duration(j["time_limit"])
          if j.get("time_limit") else "UNLIMITED"),
    "D": ("NODES", lambda j, now: str(j.get("nodes") or 1)),
    "b": ("TRES_PER_NODE", lambda j, now: _gres(j)),
    "C": ("CPUS", lambda j, now: str(int(j.get("cpus") or 0) * int(j.get("nodes") or 1))),
    "m": ("MIN_MEMORY", lambda j, now: f"{j.get('mem_mb') or 0}M"),
    "R": ("NODELIST(REASON)", lambda j, now: node_or_reason(j)),
    "r": ("REASON", lambda j, now: str(j.get("reason") or "None")),
    "N": ("NODELIST", lambda j, now: "" if j.get("state") == "PENDING"
          else node_list(j.get("node"), j.get("node_names"))),
    "S": ("START_TIME", lambda j, now: _local(j.get("start_time") or j.get("expected_start"))),
    "V": ("SUBMIT_TIME", lambda j, now: _local(j.get("submit_time"))),
    "e": ("END_TIME", lambda j, now: _local(j.get("end_time"))),
    "Q": ("PRIORITY", lambda j, now: _priority(j, True)),
    "p": ("PRIORITY", lambda j, now: _priority(j, False)),
    "W": ("LICENSES", lambda j, now: str(j.get("licenses") or "(null)")),
    "f": ("FEATURES", lambda j, now: str(j.get("constraint") or "(null)")),  # -C
    "B": ("EXEC_HOST", lambda j, now: "n/a" if j.get("state") == "PENDING"
          else str((j.get("node_names") or [j.get("node") or "n/a"])[0])),
    "c": ("MIN_CPUS", lambda j, now: str(j.get("cpus") or 0)),  # a job's cpus are per node
    "E": ("DEPENDENCY", lambda j, now: _dependency(j)),
    "F": ("ARRAY_JOB_ID", lambda j, now: str(j.get("array_job_id") or j.get("job_id", ""))),
    "K": ("ARRAY_TASK_ID", lambda j, now: _array_task(j)),
    "h": ("OVER_SUBSCRIBE", lambda j, now: "NO" if j.get("exclusive") else "OK"),
    "L": ("TIME_LEFT", _time_left),
    "n": ("REQ_NODES", lambda j, now: str(j.get("nodelist") or "")),
    "U": ("UID", lambda j, now: str(j.get("uid", ""))),
    "x": ("EXC_NODES", lambda j, now: str(j.get("exclude") or "")),
    "Z": ("WORK_DIR", lambda j, now: str(j.get("work_dir") or "")),
    "v": ("RESERVATION", lambda j, now: str(j.get("reservation") or "(null)")),
    "y": ("NICE", lambda j, now: str(j.get("nice") or 0)),
}
_LONG_ONLY: dict[str, tuple[str, Callable[[Mapping[str, Any], datetime], str]]] = {
    "stdout": ("STDOUT", lambda j, now: str(j.get("output") or "")),
    "stderr": ("STDERR", lambda j, now: str(j.get("error") or j.get("output") or "")),
    "exit_code": ("EXIT_CODE", lambda j, now: "" if j.get("exit_code") is None and not j.get(
        "signal") else f"{j.get('exit_code') or 0}:{j.get('signal') or 0}"),
    "restarts": ("RESTARTCNT", lambda j, now: str(j.get("restarts") or 0)),
    "requeue": ("REQUEUE", lambda j, now: "1" if j.get("requeue") else "0"),
    "eligible": ("ELIGIBLE_TIME", lambda j, now: _local(j.get("begin_time")
                                                        or j.get("submit_time"))),
    "time_min": ("MIN_TIME", lambda j, now: format_duration(j["time_min"])
                 if j.get("time_min") else "N/A"),
    "deadline": ("DEADLINE", lambda j, now: _local(j.get("deadline"))),
}
# squeue's codes with no meaning here, each with why.
_NO_GROUP = "jobs carry no group here"
REFUSED_CODES = {
    "d": "jobs ask for no temporary disk here",
    "g": _NO_GROUP, "G": _NO_GROUP, "H": "jobs ask for no sockets here",
    "I": "jobs ask for no cores per socket here", "J": "jobs ask for no threads per core here",
    "k": "a job's comment is not kept here", "O": "there is no contiguous placement here",
    "o": "a job's command is its stored script (gcontrol show job), not a path",
    "X": "no cores are reserved for the system (core specialization) here",
    "s": "there is no node selection plugin here",
    "w": "jobs carry no workload characterisation key (WCKey) here",
    "Y": "the nodes a pending job will use are not kept",
    "z": "jobs ask for no sockets, cores or threads here",
}
# squeue's -O names, lower case -> the code that shows it.
LONG_NAMES = {
    "account": "a", "arrayjobid": "F", "arraytaskid": "K", "batchhost": "B",
    "dependency": "E", "endtime": "e", "jobarrayid": "i", "jobid": "A", "licenses": "W", "feature": "f",
    "mincpus": "c", "minmemory": "m", "name": "j", "nodelist": "N", "numnodes": "D",
    "nodes": "D", "numcpus": "C", "oversubscribe": "h", "partition": "P", "priority": "Q",
    "prioritylong": "Q", "qos": "q", "reason": "r", "reasonlist": "R", "reqnodes": "n",
    "excnodes": "x", "starttime": "S", "state": "T", "statecompact": "t", "stdout": "stdout",
    "stderr": "stderr", "submittime": "V", "timeleft": "L", "timelimit": "l", "timeused": "M",
    "tres-per-node": "b", "userid": "U", "username": "u", "workdir": "Z",
    "reservation": "v", "nice": "y", "mintime": "time_min", "deadline": "deadline",
    "exit_code": "exit_code", "restartcnt": "restarts", "requeue": "requeue",
    "eligibletime": "eligible",
}
_CODE = r"%(\.?)(\d*)([A-Za-z%])"


def _gres(job: Mapping[str, Any]) -> str:
    """squeue's TRES_PER_NODE: ``gres/gpu:a100:2``, a share ``gres/mps:50``, GPU memory
    ``gres/gpumem:20G`` (after the share or the GPU it is of)."""
    gpus = int(job.get("gpus") or 0) // max(1, int(job.get("nodes") or 1))
    if not gpus:
        return "N/A"
    kinds = job.get("gpu_types") or []
    mode, memory = job.get("share_mode"), job.get("gpu_mem_mb")
    head = (f"gres/{mode}:{job.get('share')}" if mode is not None
            else f"gres/gpu:{kinds[0]}:{gpus}" if len(kinds) == 1 else f"gres/gpu:{gpus}")
    if memory is None:
        return head
    memory_item = f"gres/gpumem:{memory_size(int(memory))}"
    return memory_item if mode is None and not kinds else f"{head},{memory_item}"


def _local(value: object) -> str:
    when = _parse_time(value)
    return when.astimezone().strftime(time_format()) if when else "N/A"


def _code(code: str, flag: str) -> str:
    if code in REFUSED_CODES:
        raise UsageError(f"invalid {flag}: %{code} is not supported: {REFUSED_CODES[code]}")
    if code not in _FIELDS:
        known = "".join(sorted(_FIELDS))
        raise UsageError(f"invalid {flag}: unknown field %{code} (known: {known})")
    return code


def parse_format(text: str) -> list[Field]:
    """squeue's ``-o`` format: ``%[.][width]code`` pieces and literal text; ``.`` right-
    justifies. An unknown code, or one with no meaning here, is a usage error naming it."""
    fields: list[Field] = []
    at = 0
    for match in re.finditer(_CODE, text):
        if match.start() > at:
            fields.append(Field("", None, False, text[at:match.start()]))
        dot, width, code = match.groups()
        if code == "%":
            fields.append(Field("", None, False, "%"))
        else:
            fields.append(Field(_code(code, "--format"), int(width[:6]) if width else None,
                                bool(dot)))
        at = match.end()
    if at < len(text):
        fields.append(Field("", None, False, text[at:]))
    if not any(f.code for f in fields):
        raise UsageError(f"invalid --format {text[:64]!r}: no field codes such as %i or %j")
    return fields


def parse_long_format(text: str) -> list[Field]:
    """squeue's ``-O`` format: ``name[:[.][size][suffix]]`` items, comma separated
    (size 20 unless given, a blank between fields unless a suffix is given); an unknown
    name is a usage error naming it."""
    fields: list[Field] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _, spec = item.partition(":")
        code = LONG_NAMES.get(name.lower())
        if code is None:
            known = ", ".join(sorted(LONG_NAMES))
            raise UsageError(f"invalid --Format: no field {name[:40]!r} here (known: {known})")
        match = re.fullmatch(r"(\.?)(\d{0,6})(.*)", spec)
        assert match is not None
        dot, width, suffix = match.groups()
        fields.append(Field(code, int(width) if width else 20, bool(dot)))
        fields.append(Field("", None, False, suffix if suffix else " "))
    if not fields:
        raise UsageError("invalid --Format: name at least one field, such as JobID")
    return fields


def format_fields(fields: list[Field]) -> tuple[str, ...]:
    """The JOB fields a parsed format reads."""
    needs = {**_NEEDS, **_LONG_NEEDS}
    return tuple(dict.fromkeys(["state"] + [n for f in fields if f.code for n in needs[f.code]]))


def render_format(fields: list[Field], job: Mapping[str, Any] | None, now: datetime) -> str:
    """One line: the header (``job`` None) or a job's fields, escaped (see
    ``gpusched.core.terminal``), cut and padded as asked."""
    out = []
    for field in fields:
        if not field.code:
            out.append(field.text)
            continue
        header, value_of = _FIELDS.get(field.code) or _LONG_ONLY[field.code]
        value = header if job is None else terminal_safe(value_of(job, now))
        if field.width is not None:
            value = value[:field.width]
            value = value.rjust(field.width) if field.right else value.ljust(field.width)
        out.append(value)
    return "".join(out).rstrip()


# -- -S/--sort -------------------------------------------------------------------------

def _job_key(job: Mapping[str, Any]) -> tuple[int, int]:
    return (int(job.get("array_job_id") or job.get("job_id") or 0),
            int(job["array_task_id"]) if job.get("array_task_id") is not None else -1)


def _time_key(*names: str) -> Callable[[Mapping[str, Any], datetime], float]:
    def key(job: Mapping[str, Any], now: datetime) -> float:
        for name in names:
            when = _parse_time(job.get(name))
            if when is not None:
                return when.timestamp()
        return float("inf")
    return key


# Sort values that are not the shown text: numbers and times sort as such.
_SORT_VALUES: dict[str, Callable[[Mapping[str, Any], datetime], Any]] = {
    "i": lambda j, now: _job_key(j), "A": lambda j, now: int(j.get("job_id") or 0),
    "F": lambda j, now: _job_key(j)[0], "U": lambda j, now: int(j.get("uid") or 0),
    "M": lambda j, now: elapsed_seconds(j, now),
    "l": lambda j, now: float(j.get("time_limit") or float("inf")),
    "D": lambda j, now: int(j.get("nodes") or 1),
    "C": lambda j, now: int(j.get("cpus") or 0) * int(j.get("nodes") or 1),
    "m": lambda j, now: int(j.get("mem_mb") or 0),
    "b": lambda j, now: int(j.get("gpus") or 0),
    "S": _time_key("start_time", "expected_start"), "V": _time_key("submit_time"),
    "e": _time_key("end_time"), "eligible": _time_key("begin_time", "submit_time"),
    "Q": lambda j, now: float(j.get("priority") or -1.0),
    "p": lambda j, now: float(j.get("priority") or -1.0),
    "restarts": lambda j, now: int(j.get("restarts") or 0),
    "L": lambda j, now: (float(j["time_limit"]) - elapsed_seconds(j, now)
                         if j.get("time_limit") else float("inf")),
}


def parse_sort(text: str) -> list[tuple[str, bool]]:
    """squeue's ``-S`` keys: field codes, comma separated, each with an optional ``+``
    (ascending, the default) or ``-`` (descending); ``(code, descending)`` pairs."""
    keys: list[tuple[str, bool]] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        descending = item.startswith("-")
        code = item.lstrip("+-")
        if len(code) != 1:
            raise UsageError(f"invalid --sort key {item[:16]!r}: expected a field code "
                             "such as i, -t or +P")
        keys.append((_code(code, "--sort"), descending))
    if not keys:
        raise UsageError("invalid --sort: name at least one field code, such as i or -t")
    return keys


def sort_fields(keys: Sequence[tuple[str, bool]]) -> tuple[str, ...]:
    """The JOB fields sorting by ``keys`` reads."""
    return tuple(n for code, _ in keys for n in _NEEDS[code])


def sort_jobs(jobs: list[dict[str, Any]], keys: Sequence[tuple[str, bool]], now: datetime
              ) -> list[dict[str, Any]]:
    """``jobs`` ordered by ``keys``, the first key first (stable: equal jobs keep their
    order)."""
    ordered = list(jobs)
    for code, descending in reversed(keys):
        value_of = _SORT_VALUES.get(code) or _FIELDS[code][1]
        ordered.sort(key=lambda j: value_of(j, now), reverse=descending)  # noqa: B023
    return ordered
