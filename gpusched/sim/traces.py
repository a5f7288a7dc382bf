"""Workload trace readers: SWF (Parallel Workloads Archive), Philly and Alibaba GPU traces.

Every reader turns a file into the same ``Trace``: jobs in submit order, each with its
GPU count, its actual run time and the time limit it asked for, plus what was left out
and why. Nothing here schedules; see ``gpusched.sim.replay``.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from gpusched.errors import UsageError

FORMATS = ("swf", "philly", "alibaba")
# "; Key: value"; an indented continuation line (";      http://...") is not a key.
_SWF_HEADER = re.compile(r";\s?([A-Za-z][\w-]*):(.*)")


class TraceError(UsageError):
    """A trace file that cannot be read; the message names the file and the line."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace.

    ``run_time`` is how long it really ran; ``time_limit`` is what it asked for (the
    user's estimate), which reservations use. ``gpus`` is its whole GPU count; the
    replay spreads it over nodes. ``gpu_milli`` (1 to 999, with ``gpus`` 1): it asks for
    that many thousandths of one GPU instead, a share of a GPU shared with others.
    """

    job_id: int
    submit: float
    run_time: float
    time_limit: int
    gpus: int
    user: str = "u0"
    group: str = "g0"
    cpus: int = 0  # per job, 0: not asked
    mem_mb: int = 0  # per job, 0: not asked
    gpu_milli: int = 0  # thousandths of one GPU; 0: whole GPUs


@dataclass(slots=True)
class Trace:
    """The jobs of a trace in submit order, what was skipped (reason -> count), and
    what the file says about itself (SWF header keys such as MaxProcs)."""

    source: str
    jobs: list[TraceJob]
    skipped: Counter[str] = field(default_factory=Counter)
    header: dict[str, str] = field(default_factory=dict)
    # (name, GPUs, GPU type, CPUs, memory MB) of a cluster the trace describes itself.
    nodes: list[tuple[str, int, str, int, int]] = field(default_factory=list)
    estimated: int = 0  # jobs without a requested time, given their run time as limit

    def window(self, skip: int = 0, limit: int | None = None) -> Trace:
        """The jobs after the first ``skip``, at most ``limit`` of them."""
        end = None if limit is None else skip + limit
        return Trace(self.source, self.jobs[skip:end], self.skipped, self.header,
                     self.nodes, self.estimated)


def _open_text(path: Path) -> io.TextIOBase:
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise TraceError(f"{path}: cannot open: {exc.strerror}") from None
    head = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
    if head == b"\x1f\x8b":
        raw.close()  # a GzipFile given a file object would never close it
        try:
            return io.TextIOWrapper(gzip.GzipFile(path, "rb"), encoding="utf-8",
                                    errors="replace")
        except OSError as exc:
            raise TraceError(f"{path}: cannot open: {exc.strerror}") from None
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace")


def guess_format(path: Path) -> str:
    """The format a file name suggests: ``.swf`` (optionally ``.gz``) is SWF, a name with
    ``philly`` or ``alibaba``/``openb`` is that trace; else SWF."""
    name = path.name.lower()
    if "philly" in name:
        return "philly"
    if "alibaba" in name or "openb" in name:
        return "alibaba"
    return "swf"


def read_trace(path: Path, fmt: str | None = None, nodes: Path | None = None) -> Trace:
    """Read ``path`` as ``fmt`` (guessed from the name when None).

    ``nodes`` is the Alibaba node list that goes with a pod list; it is looked for
    beside the pod list when not given.
    """
    fmt = fmt or guess_format(path)
    if fmt == "swf":
        return read_swf(path)
    if fmt == "philly":
        return read_philly(path)
    if fmt == "alibaba":
        return read_alibaba(path, nodes)
    raise TraceError(f"{path}: unknown trace format {fmt!r}; expected one of {', '.join(FORMATS)}")


# -- SWF -------------------------------------------------------------------------------

def read_swf(path: Path) -> Trace:
    """Read a Standard Workload Format log.

    A job's processor count (field 8, requested; field 5, allocated, when that is
    unknown) becomes its GPU count. Field 4 is its run time and field 9 its time limit;
    a job with no requested time gets its run time as limit (counted in ``estimated``).
    Jobs with an unknown run time (cancelled before they started) or no processor count
    are skipped and counted.
    """
    trace = Trace(str(path), [])
    with _open_text(path) as text:
        try:
            for number, line in enumerate(text, 1):
                stripped = line.strip()
                if not stripped:
                    continue
                if stripped.startswith(";"):
                    header = _SWF_HEADER.fullmatch(stripped)
                    if header:
                        trace.header.setdefault(header[1], header[2].strip())
                    continue
                job = _swf_job(path, number, stripped, trace)
                if job is not None:
                    trace.jobs.append(job)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"{path}: cannot read: {exc}") from None
    if not trace.jobs and not trace.skipped:
        raise TraceError(f"{path}: no SWF job lines found")
    trace.jobs.sort(key=lambda j: (j.submit, j.job_id))
    return trace


def _swf_job(path: Path, number: int, line: str, trace: Trace) -> TraceJob | None:
    fields = line.split()
    if len(fields) < 18:
        raise TraceError(f"{path}:{number}: expected 18 SWF fields, found {len(fields)}")
    try:
        values = [float(f) for f in fields[:18]]
    except ValueError:
        bad = next(f for f in fields[:18] if not _is_number(f))
        raise TraceError(f"{path}:{number}: {bad!r} is not a number") from None
    if not math.isfinite(sum(values)):  # one check for the line; then which field
        for text, value in zip(fields, values):
            if not math.isfinite(value):  # inf, nan: no count, time or id
                raise TraceError(f"{path}:{number}: {text!r} is not a number")
        raise TraceError(f"{path}:{number}: numbers too large to be counts, times or ids")
    job_id, submit, run = int(values[0]), values[1], values[3]
    procs = int(values[7]) if values[7] > 0 else int(values[4])
    if run < 0:
        trace.skipped["no run time (cancelled before it started)"] += 1
        return None
    if procs <= 0:
        trace.skipped["no processor count"] += 1
        return None
    if submit < 0:
        raise TraceError(f"{path}:{number}: negative submit time {fields[1]}")
    limit = int(values[8]) if values[8] > 0 else 0
    if limit <= 0:
        limit = max(1, math.ceil(run))
        trace.estimated += 1
    return TraceJob(job_id, submit, run, limit, procs,
                    user=f"u{int(values[11])}" if values[11] >= 0 else "u-unknown",
                    group=f"g{int(values[12])}" if values[12] >= 0 else "g-unknown")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# -- CSV traces ------------------------------------------------------------------------

def _rows(path: Path, needed: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """The rows of a CSV file with these columns (a short row's missing cells: "")."""
    with _open_text(path) as text:
        reader = csv.DictReader(text, restval="")
        try:
            found = reader.fieldnames or ()
            missing = [c for c in needed if c not in found]
            if missing:
                shown = ", ".join(c if c.isprintable() else repr(c) for c in found)
                raise TraceError(f"{path}: missing column(s) {', '.join(missing)}; "
                                 f"found {shown or 'none'}")
            for row in reader:
                yield reader.line_num, row
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"{path}: cannot read: {exc}") from None
        except csv.Error as exc:  # a field past csv's size limit
            raise TraceError(f"{path}:{reader.line_num}: {exc}") from None


def _number(path: Path, number: int, row: dict[str, str], column: str) -> float:
    text = (row.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{path}:{number}: {column} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise TraceError(f"{path}:{number}: {column} {text!r} is not a number")
    return value


def read_philly(path: Path) -> Trace:
    """Read the Philly job table (timestamp, duration, num_gpus, cluster).

    Submit times count from the first job's; the virtual cluster is both the user and
    the group (the trace has no user ids). Philly recorded no time limits, so each
    job's limit is its run time, rounded up to a second.
    """
    trace = Trace(str(path), [])
    first: float | None = None
    raw: list[tuple[float, float, int, str, int]] = []
    for number, row in _rows(path, ("timestamp", "duration", "num_gpus", "cluster")):
        try:
            stamp = datetime.strptime(row["timestamp"].strip(), "%Y-%m-%d %H:%M:%S")
        except ValueError:
            raise TraceError(f"{path}:{number}: timestamp {row['timestamp']!r} is not "
                             "YYYY-MM-DD HH:MM:SS") from None
        at = stamp.replace(tzinfo=timezone.utc).timestamp()
        duration = _number(path, number, row, "duration")
        gpus = _number(path, number, row, "num_gpus")
        if duration < 0 or gpus != int(gpus):
            raise TraceError(f"{path}:{number}: duration and num_gpus must be a time and a "
                             "whole number of GPUs")
        if gpus <= 0:
            trace.skipped["no GPUs"] += 1
            continue
        raw.append((at, duration, int(gpus), row["cluster"].strip() or "vc", number - 1))
        first = at if first is None else min(first, at)
    raw.sort()
    trace.header["VirtualClusters"] = str(len({r[3] for r in raw}))
    trace.estimated = len(raw)
    for at, duration, gpus, vc, job_id in raw:
        trace.jobs.append(TraceJob(job_id, at - (first or 0.0), duration,
                                   max(1, math.ceil(duration)), gpus, user=vc, group=vc))
    return trace


def read_alibaba(path: Path, nodes: Path | None = None) -> Trace:
    """Read an Alibaba 2023 GPU pod list, with its node list as the cluster.

    A pod arrives at ``creation_time`` and runs from ``scheduled_time`` to
    ``deletion_time``. A pod asking for a fraction of a GPU (``gpu_milli`` < 1000) asks
    for that share of one GPU (the replay shares the cluster's GPUs in thousandths).
    Pods with no GPU or no complete times are skipped and counted. The node list
    (default: the ``*node_list*`` file beside the pod list) becomes the trace's cluster.
    """
    if "node_list" in path.name:
        raise TraceError(f"{path}: this is an Alibaba node list; give the pod list as the "
                         "trace (the node list is read from beside it, or from --node-list)")
    trace = Trace(str(path), [])
    needed = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time",
              "deletion_time", "scheduled_time")
    for number, row in _rows(path, needed):
        gpus = _number(path, number, row, "num_gpu")
        if gpus <= 0:
            trace.skipped["no GPU (CPU-only pod)"] += 1
            continue
        if gpus != int(gpus):
            raise TraceError(f"{path}:{number}: num_gpu {gpus:g} is not a whole number of GPUs "
                             "(a fraction of one is num_gpu 1 with gpu_milli)")
        milli = _number(path, number, row, "gpu_milli")
        if milli < 0 or milli != int(milli) or (0 < milli < 1000 and gpus != 1):
            raise TraceError(f"{path}:{number}: gpu_milli {milli:g} with num_gpu {gpus:g}: "
                             "a fraction is of one GPU, in whole thousandths")
        times = [(row.get(c) or "").strip() for c in ("creation_time", "scheduled_time",
                                                       "deletion_time")]
        if not all(times):
            trace.skipped["no start or end time"] += 1
            continue
        created, scheduled, deleted = (_number(path, number, row, c) for c in (
            "creation_time", "scheduled_time", "deletion_time"))
        if deleted < scheduled:
            trace.skipped["no start or end time"] += 1
            continue
        run = deleted - scheduled
        trace.jobs.append(TraceJob(
            number - 1, created, run, max(1, math.ceil(run)), int(gpus), user="pod",
            group=(row.get("qos") or "default").strip() or "default",
            cpus=math.ceil(_number(path, number, row, "cpu_milli") / 1000),
            mem_mb=int(_number(path, number, row, "memory_mib")),
            gpu_milli=int(milli) if 0 < milli < 1000 else 0))
    trace.estimated = len(trace.jobs)
    trace.jobs.sort(key=lambda j: (j.submit, j.job_id))
    node_list = nodes or _beside(path)
    if node_list is not None:
        for number, row in _rows(node_list, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
            gpus = int(_number(node_list, number, row, "gpu"))
            if gpus > 0:
                trace.nodes.append((row["sn"].strip(), gpus,
                                    (row["model"].strip() or "gpu").lower(),
                                    int(_number(node_list, number, row, "cpu_milli")) // 1000,
                                    int(_number(node_list, number, row, "memory_mib"))))
    return trace


def _beside(path: Path) -> Path | None:
    for candidate in sorted(path.parent.glob("*node_list*")):
        if "gpu_node" in candidate.name:
            return candidate
    found = sorted(path.parent.glob("*node_list*"))
    return found[0] if found else None
