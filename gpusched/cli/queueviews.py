"""gqueue's listings beyond the plain queue: squeue's filters the controller's listing
does not take (``-q``, ``-w``, ``-L``, ``-R``), ``-r`` (one pending array task a line), ``-S``
sorting, ``-O``/``-l`` formats, the dependencies' states of ``%E``, and ``-s`` (steps).
Each reads the JOB objects of ``GET /v1/jobs`` and works on them here."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from gpusched.cli.listing import (
    HEADERS,
    RIGHT_ALIGNED,
    SHRINKABLE,
    START_FIELDS,
    START_HEADERS,
    TABLE_FIELDS,
    job_columns,
    job_objects,
    jobs_path,
    node_set,
    queue_columns,
    start_row,
)
from gpusched.cli.output import print_columns, print_table
from gpusched.cli.queueformat import (
    LONG_FORMAT,
    Field,
    format_fields,
    parse_format,
    parse_long_format,
    parse_sort,
    render_format,
    sort_fields,
    sort_jobs,
)
from gpusched.client import ApiClient
from gpusched.core.timefmt import format_duration
from gpusched.errors import UsageError

_ARRAY_FIELDS = ("job_id", "display_id", "array_job_id", "array_task_id", "array_tasks",
                 "array_max_running")


@dataclass
class View:
    """What a listing shows and how (gqueue's options)."""

    as_json: bool
    start: bool
    noheader: bool
    fmt: str | None
    long_format: str | None
    long: bool
    sort: str | None
    array: bool
    qos: str | None
    nodelist: str | None
    licenses: str | None
    verbose: bool
    reservation: str | None = None

    def __post_init__(self) -> None:
        text = LONG_FORMAT if self.long else self.fmt
        self.fields: list[Field] | None = (
            parse_long_format(self.long_format) if self.long_format is not None
            else parse_format(text) if text is not None else None)
        self.sort_keys = parse_sort(self.sort) if self.sort is not None else []
        self.qos_names = _names(self.qos, "--qos")
        self.nodes = node_set(self.nodelist)
        self.license_names = _names(self.licenses, "--licenses")
        self.reservations = _names(self.reservation, "--reservation")

    def wanted(self) -> tuple[str, ...] | None:
        """The JOB fields to ask for (None: every one, for --json)."""
        if self.as_json:
            return None
        shown = (format_fields(self.fields) if self.fields is not None
                 else START_FIELDS if self.start else TABLE_FIELDS)
        extra = [*sort_fields(self.sort_keys), *(_ARRAY_FIELDS if self.array else ()),
                 *(("qos",) if self.qos_names else ()),
                 *(("node", "node_names") if self.nodes else ()),
                 *(("licenses",) if self.license_names else ()),
                 *(("reservation",) if self.reservations else ()),
                 *(("hold",) if ({f.code for f in self.fields or ()}
                                 | {code for code, _ in self.sort_keys}) & {"p", "Q"} else ())]
        return tuple(dict.fromkeys([*shown, *extra]))

    def path_maker(self, **filters: Any) -> Callable[[], str]:
        """The listing's path (its filters checked now)."""
        path = jobs_path(**filters, fields=self.wanted())
        return lambda: path


def _names(text: str | None, flag: str) -> set[str] | None:
    if text is None:
        return None
    names = {w.strip() for w in text.split(",") if w.strip()}
    if not names:
        raise UsageError(f"{flag}: give at least one name")
    return names


def _license_names(text: object) -> set[str]:
    """The license names of a job's ``licenses`` (``matlab:2,comsol``)."""
    return {item.partition(":")[0].strip() for item in str(text or "").split(",") if item.strip()}


def select_jobs(view: View, jobs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The jobs the client-side filters keep: QOS, nodes (a job on any of them), licenses
    (a job asking for any of them)."""
    kept = []
    for job in jobs:
        if view.qos_names is not None and job.get("qos") not in view.qos_names:
            continue
        if view.nodes is not None:
            on = set(job.get("node_names") or ([job["node"]] if job.get("node") else []))
            if job.get("state") == "PENDING" or not on & view.nodes:
                continue
        if view.license_names is not None and not _license_names(
                job.get("licenses")) & view.license_names:
            continue
        if view.reservations is not None and job.get("reservation") not in view.reservations:
            continue
        kept.append(job)
    return kept


def expand_arrays(jobs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """squeue -r: an array's pending tasks, folded on one line (``12_[4-9]``), one line
    each (``12_4``, ``12_5``, ...)."""
    from gpusched.core.arrays import iter_tasks

    out: list[dict[str, Any]] = []
    for job in jobs:
        tasks = job.get("array_tasks")
        if not tasks or job.get("array_task_id") is not None:
            out.append(job)
            continue
        array_id = job.get("array_job_id") or job.get("job_id")
        for task in iter_tasks(str(tasks)):
            out.append({**job, "array_task_id": task, "array_tasks": None,
                        "display_id": f"{array_id}_{task}"})
    return out


def dependency_items(text: str) -> list[tuple[str, str, list[str]]]:
    """A dependency as ``(item, kind, [target, ...])``: ``afterok:12:13`` is one item
    of kind afterok with targets 12 and 13 (``12+30`` and ``12_3`` kept as written)."""
    items = []
    for item in (p.strip() for p in text.replace("?", ",").split(",")):
        if item:
            kind, _, rest = item.partition(":")
            items.append((item, kind.strip().lower(), [t for t in rest.split(":") if t]))
    return items


_ENDED_OK = "COMPLETED"


def dependency_state(kind: str, targets: Sequence[dict[str, Any] | None]) -> str:
    """``satisfied``, ``unfulfilled`` or ``failed``: what the targets' states make of a
    dependency of ``kind``."""
    if kind == "singleton":
        return "unfulfilled"
    if any(t is None for t in targets):  # purged: gone long ago, as Slurm treats it
        return "failed" if kind in ("afterok", "afternotok") else "satisfied"
    states = [str(t["state"]) for t in targets if t is not None]
    if kind == "after":
        return "unfulfilled" if "PENDING" in states else "satisfied"
    if any(s in ("PENDING", "RUNNING") for s in states):
        return "unfulfilled"
    if kind == "afterok":
        return "satisfied" if all(s == _ENDED_OK for s in states) else "failed"
    if kind == "afternotok":
        return "satisfied" if all(s != _ENDED_OK for s in states) else "failed"
    return "satisfied"  # afterany, aftercorr: every target ended


def add_dependency_states(client: ApiClient, jobs: list[dict[str, Any]]) -> None:
    """Give each job with a dependency ``_dependency_states``: ``[(item, state), ...]``
    (one request for all their targets)."""
    wanted: set[int] = set()
    parsed: dict[int, list[tuple[str, str, list[str]]]] = {}
    for at, job in enumerate(jobs):
        if job.get("dependency"):
            parsed[at] = dependency_items(str(job["dependency"]))
            for _, _, targets in parsed[at]:
                for target in targets:
                    head = target.partition("+")[0].partition("_")[0]
                    if head.isascii() and head.isdigit() and len(head) <= 18:
                        wanted.add(int(head))
    known: dict[str, dict[str, Any]] = {}
    if wanted:
        path = jobs_path(user=None, states=None, show_all=True, ids=sorted(wanted),
                         fields=("job_id", "state", "array_job_id", "array_task_id"))
        for found_job in job_objects(client.request("GET", path)):
            known.setdefault(str(found_job["job_id"]), found_job)
            if found_job.get("array_job_id") is not None:
                known[f"{found_job['array_job_id']}_{found_job['array_task_id']}"] = found_job
    for at, items in parsed.items():
        states = []
        for item, kind, targets in items:
            found = [_target_jobs(known, t.partition("+")[0]) for t in targets]
            flat: list[dict[str, Any] | None] = [j for group in found for j in group]
            states.append((item, dependency_state(kind, flat)))
        if jobs[at].get("state") != "PENDING":
            states = [(item, "satisfied") for item, _ in states]
        jobs[at]["_dependency_states"] = states


def add_priorities(client: ApiClient, jobs: list[dict[str, Any]]) -> None:
    """Give each pending job its ``priority`` (0 to 1; 0 while held), as ``gpusched
    prio`` shows it (one request)."""
    pending = [job for job in jobs if job.get("state") == "PENDING"]
    if not pending:
        return
    ids = sorted({int(job["job_id"]) for job in pending})
    path = "/v1/priority" + (f"?ids={','.join(map(str, ids))}" if len(ids) <= 200 else "")
    totals = {row["job_id"]: row["priority"] for row in client.request("GET", path)["jobs"]}
    for job in pending:
        job["priority"] = 0.0 if job.get("hold") else totals.get(job["job_id"], 0.0)


def _target_jobs(known: dict[str, dict[str, Any]], target: str) -> list[dict[str, Any] | None]:
    """The jobs a dependency target names: one job or task, or every task of an array."""
    if target in known:
        return [known[target]]
    tasks = [job for job in known.values() if str(job.get("array_job_id")) == target]
    return list(tasks) or [None]


def show_view(view: View, path_of: Callable[[], str]) -> None:
    """Print one listing as ``view`` says."""
    path = path_of()
    if view.verbose:
        print(f"gqueue: GET {path}", file=sys.stderr)
    with ApiClient() as client:
        jobs = select_jobs(view, job_objects(client.request("GET", path)))
        if view.array:
            jobs = expand_arrays(jobs)
        codes = {f.code for f in view.fields or ()} | {code for code, _ in view.sort_keys}
        if "E" in codes:
            add_dependency_states(client, jobs)
        if codes & {"p", "Q"}:
            add_priorities(client, jobs)
    now = datetime.now(timezone.utc)
    if view.sort_keys:
        jobs = sort_jobs(jobs, view.sort_keys, now)
    if view.verbose:
        print(f"gqueue: {len(jobs)} job(s)", file=sys.stderr)
    if view.as_json:
        print(json.dumps({"jobs": jobs}))
    elif view.fields is not None:
        if not view.noheader:
            print(render_format(view.fields, None, now))
        for job in jobs:
            print(render_format(view.fields, job, now))
    elif view.start:
        print_table(START_HEADERS, [start_row(job) for job in jobs],
                    right_aligned=frozenset({0, 6}), shrinkable=frozenset({1, 2, 3, 7}),
                    show_header=not view.noheader)
    else:
        print_columns(HEADERS, queue_columns(job_columns({"jobs": jobs}, TABLE_FIELDS), now),
                      right_aligned=RIGHT_ALIGNED, shrinkable=SHRINKABLE,
                      show_header=not view.noheader)


def show_steps(path: str, noheader: bool, verbose: bool) -> None:
    """squeue -s: the running steps of the running jobs ``path`` lists: STEPID, NAME,
    PARTITION, USER, TIME, NODELIST."""
    from gpusched.core.hostlist import compress_hostlist

    rows = []
    with ApiClient() as client:
        jobs = job_objects(client.request("GET", path))
        for job in jobs:
            if verbose:
                print(f"gqueue: GET /v1/jobs/{job['job_id']}/steps", file=sys.stderr)
            for step in client.request("GET", f"/v1/jobs/{job['job_id']}/steps")["steps"]:
                if step["state"] != "RUNNING":
                    continue
                rows.append([f"{job.get('display_id') or job['job_id']}.{step['step_id']}",
                             str(step.get("name") or ""), str(job.get("partition") or ""),
                             str(job.get("user") or ""), format_duration(step["elapsed_s"]),
                             compress_hostlist(step.get("node_names") or [])])
    print_table(["STEPID", "NAME", "PARTITION", "USER", "TIME", "NODELIST"], rows,
                right_aligned=frozenset({4}), shrinkable=frozenset({1, 2, 3, 5}),
                show_header=not noheader)
