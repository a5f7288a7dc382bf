"""The API's JOB object (docs/api.md): its fields, built in Python for one job or a
listing, or by PostgreSQL as one JSON text for a table of plain fields."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    Float,
    Integer,
    Select,
    Text,
    case,
    cast,
    func,
    literal,
    null,
    select,
    text,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY, aggregate_order_by
from sqlalchemy.orm import Session, aliased
from sqlalchemy.sql.elements import ColumnElement

from gpusched.core.bounds import MAX_LIST
from gpusched.core.jobcontrol import JobRefError, parse_job_refs
from gpusched.db.jobcontrol import (
    STATE_SQL,
    ref_condition,
    shown_state,
    state_condition,
)
from gpusched.db.jobs import Identity
from gpusched.db.models import Allocation, Gpu, Job, Node
from gpusched.db.placements import job_placements
from gpusched.errors import NotFound, UsageError


def _warn_json(number: int | None, seconds: int | None, batch_only: bool) -> dict[str, Any] | None:
    if number is None:
        return None
    return {"signal": number, "seconds": seconds, "batch_only": batch_only}


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def display_id(job_id: int, array_job: int | None, task: int | None, tasks: str | None,
               cap: int | None) -> str:
    """How squeue names a job: ``17``, an array task ``12_3``, pending tasks ``12_[4-9%2]``."""
    if array_job is None:
        return str(job_id)
    if tasks is not None:
        return f"{array_job}_[{tasks}{'' if cap is None else f'%{cap}'}]"
    return f"{array_job}_{task}"


Field = tuple[tuple[str, ...], Callable[..., Any] | None]


def _avg(total: float, count: int) -> float | None:
    return total / count if count else None


def _same(column: str) -> Field:
    return (column,), None


def _when(column: str) -> Field:
    return (column,), _iso


# The JOB object's fields (docs/api.md): the Job columns each reads, and the function
# making it from their values (None: the one column as it is). "node" and "gpu_uuids"
# come from the job's placement instead.
JOB_FIELDS: dict[str, Field] = {
    "job_id": _same("id"), "name": _same("name"), "user": _same("user_name"),
    "uid": _same("uid"), "partition": _same("partition"), "account": _same("account"),
    "qos": _same("qos"), "state": (("state", "suspended_at"), shown_state),
    "reason": _same("reason"),
    "gpus": _same("gpus"), "time_limit": _same("time_limit"), "hold": _same("hold"),
    "begin_time": _when("begin_time"), "dependency": _same("dependency"),
    "submit_time": _when("submit_time"), "start_time": _when("start_time"),
    "end_time": _when("end_time"), "exit_code": _same("exit_code"),
    "signal": _same("signal"), "error_message": _same("error_message"),
    "work_dir": _same("work_dir"), "output": _same("output"), "error": _same("error"),
    "array_job_id": _same("array_job_id"), "array_task_id": _same("array_task_id"),
    "array_tasks": _same("array_tasks"), "array_max_running": _same("array_max_running"),
    "gpu_types": (("gpu_types",), list),
    "nodes": _same("nodes"), "cpus": _same("cpus"), "mem_mb": _same("mem_mb"),
    "start_kind": _same("start_kind"), "expected_start": _when("expected_start"),
    "node_names": _same("node_names"), "restarts": _same("restarts"),
    "nodelist": _same("nodelist"), "exclude": _same("exclude_nodes"),
    "warn_signal": (("warn_signal", "warn_seconds", "warn_batch_only"), _warn_json),
    "admin_priority": _same("admin_priority"), "exclusive": _same("exclusive"),
    "preempted_by": _same("preempted_by"), "requeue": _same("requeue"),
    "gpu_failure": _same("gpu_failure"),
    "gpu_util_avg": (("util_sum", "util_samples"), _avg),
    "gpu_util_peak": _same("util_peak"),
    "gpu_mem_avg_mb": (("mem_sum_mb", "util_samples"), _avg),
    "gpu_mem_peak_mb": _same("mem_peak_mb"), "gpu_samples": _same("util_samples"),
    "idle": _same("idle"), "idle_since": _when("idle_since"),
    "idle_warned_at": _when("idle_warned_at"), "idle_action": _same("idle_action"),
    "idle_action_at": _when("idle_action_at"), "idle_reason": _same("idle_reason"),
    "gres_flags": _same("gres_flags"), "max_rss_bytes": _same("max_rss_bytes"),
    "cpu_usec": _same("cpu_usec"), "interactive": _same("interactive"),
    "share_mode": _same("share_mode"), "share": _same("share_units"),
    "gpu_mem_mb": _same("gpu_mem_mb"), "licenses": _same("licenses"),
    "nice": _same("nice"), "open_mode": _same("open_mode"), "time_min": _same("time_min"),
    "deadline": _when("deadline"),
    "reservation": _same("reservation"),
    "container": _same("container"),
    "constraint": _same("constraints"),
    "mail_type": _same("mail_types"), "mail_user": _same("mail_user"),
    "suspended_at": _when("suspended_at"),
    "suspended_seconds": (("suspended_seconds",), round), "top_rank": _same("top_rank"),
    "display_id": (("id", "array_job_id", "array_task_id", "array_tasks", "array_max_running"),
                   display_id),
}
PLACEMENT_FIELDS = ("node", "gpu_uuids")
_ALL_FIELDS = tuple(JOB_FIELDS) + PLACEMENT_FIELDS


def job_json(job: Job, placement: tuple[str, list[str]] | None, private: bool) -> dict[str, Any]:
    """The API's JOB object (docs/api.md); ``private`` adds script, args and environment."""
    node, uuids = placement if placement else (None, [])
    body: dict[str, Any] = {}
    for field, (columns, make) in JOB_FIELDS.items():
        values = [getattr(job, c) for c in columns]
        body[field] = values[0] if make is None else make(*values)
    body.update(node=node, gpu_uuids=uuids)
    if private:
        payload = job.payload
        body.update(script=payload.script, args=list(payload.args),
                    environment=dict(payload.environment))
    return body


def parse_fields(text: str) -> tuple[str, ...]:
    """``?fields=job_id,state,...``: JOB field names, checked; a usage error names an
    unknown one."""
    fields = tuple(dict.fromkeys(f.strip() for f in text.split(",") if f.strip()))
    unknown = [f for f in fields if f not in _ALL_FIELDS]
    if unknown or not fields:
        raise UsageError(f"fields: unknown JOB field {unknown[0]!r}" if unknown
                         else "fields: name at least one JOB field")
    return fields


def _iso_sql(column: Any) -> ColumnElement[str]:
    """``_iso`` in SQL: what ``datetime.isoformat()`` writes for the session's time zone
    (microseconds only when there are some); NULL stays NULL."""
    micro = case((func.extract("microseconds", column) % 1000000 == 0, ""),
                 else_=func.to_char(column, ".US"))
    return (func.to_char(column, 'YYYY-MM-DD"T"HH24:MI:SS') + micro
            + func.to_char(column, "TZH:TZM"))


def _text(column: Any) -> ColumnElement[str]:
    return cast(column, Text)


# JOB fields PostgreSQL can write as JSON exactly as job_json does (same values, same
# strings): a table of only these is built by the database as one JSON text.
# (Floats are left out: PostgreSQL writes 5.0 as 5.)
SQL_FIELDS: dict[str, Any] = {  # column expressions
    **{field: getattr(Job, columns[0]) for field, (columns, make) in JOB_FIELDS.items()
       if make is None and not isinstance(getattr(Job, columns[0]).type, Float)},
    **{field: _iso_sql(getattr(Job, columns[0])) for field, (columns, make) in JOB_FIELDS.items()
       if make is _iso},
    "gpu_types": Job.gpu_types,
    "state": STATE_SQL, "suspended_seconds": cast(func.round(Job.suspended_seconds), Integer),
    "display_id": case(
        (Job.array_job_id.is_(None), _text(Job.id)),
        (Job.array_tasks.is_not(None),
         _text(Job.array_job_id) + "_[" + Job.array_tasks
         + func.coalesce("%" + _text(Job.array_max_running), "") + "]"),
        else_=_text(Job.array_job_id) + "_" + _text(Job.array_task_id)),
    "node": Node.name,
}


def _list_filters(query: dict[str, str]) -> list[ColumnElement[bool]]:
    """The WHERE conditions of ``GET /v1/jobs``'s query parameters."""
    where: list[ColumnElement[bool]] = []
    if query.get("state"):
        where.append(state_condition([s.strip().upper() for s in query["state"].split(",")]))
    elif query.get("all") not in ("1", "true", "yes"):
        where.append(Job.state.in_(["PENDING", "RUNNING"]))
    for key, column in (("user", Job.user_name), ("partition", Job.partition),
                        ("account", Job.account), ("name", Job.name)):
        if query.get(key):
            where.append(column.in_([w.strip() for w in query[key].split(",")]))
    if query.get("ids"):
        try:
            refs = parse_job_refs([query["ids"]], MAX_LIST)
        except JobRefError as exc:
            raise UsageError(f"ids: {exc}") from None
        where.append(ref_condition(refs))
    return where


def job_table_json(session: Session, query: dict[str, str]) -> bytes | None:
    """``GET /v1/jobs?fields=...`` as the JSON text of its answer, built by PostgreSQL
    (no Python object per job: a queue of 10,000 takes the database about 20 ms); None
    when a field asked for is not among ``SQL_FIELDS``."""
    fields = parse_fields(query["fields"])
    if not set(fields) <= SQL_FIELDS.keys():
        return None
    row = func.json_build_array(*(SQL_FIELDS[f] for f in fields))
    stmt = (select(_text(func.coalesce(func.json_agg(aggregate_order_by(row, Job.id)),
                                       text("'[]'::json"))))
            .select_from(Job).outerjoin(Node, Node.id == Job.node_id)
            .where(*_list_filters(query)))
    rows = session.connection().execute(stmt).scalar_one()
    head = json.dumps({"fields": list(fields)}, separators=(",", ":"))[:-1]
    return f'{head},"rows":{rows}}}'.encode()


# Python's json writes a float as repr() does; PostgreSQL's shortest form (with
# extra_float_digits >= 1) has the same digits below 1e15, less the ".0" of a whole
# number. A listing with a float at or above 1e15 (or NaN, or infinite) is built in
# Python instead (see job_list_json).
FLOAT_LIMIT = 1e15
_FLOAT_FIELDS: dict[str, Any] = {  # column expressions
    "admin_priority": Job.admin_priority,
    "gpu_util_avg": case((Job.util_samples != 0, Job.util_sum / cast(Job.util_samples, Float))),
    "gpu_mem_avg_mb": case((Job.util_samples != 0,
                            Job.mem_sum_mb / cast(Job.util_samples, Float))),
}


def _float_json(value: Any) -> ColumnElement[Any]:
    """``value`` as JSON text written as Python writes it (NULL at or above FLOAT_LIMIT,
    where no JSON text is); NULL stays NULL."""
    shortest = cast(value, Text)
    return cast(case(
        (func.abs(value) >= FLOAT_LIMIT, null()),
        (value == 0, case((shortest == "-0", "-0.0"), else_="0.0")),
        ((func.strpos(shortest, ".") > 0) | (func.strpos(shortest, "e") > 0), shortest),
        else_=shortest + ".0"), JSON)


def _warn_signal_json() -> ColumnElement[Any]:
    """``_warn_json`` in SQL, written compactly as Python's json writes it."""
    batch = case((Job.warn_batch_only, "true"), (~Job.warn_batch_only, "false"), else_="null")
    return cast(case((Job.warn_signal.is_not(None),
                      '{"signal":' + _text(Job.warn_signal) + ',"seconds":'
                      + func.coalesce(_text(Job.warn_seconds), "null") + ',"batch_only":'
                      + batch + "}")), JSON)


def _gpu_uuids() -> ColumnElement[Any]:
    """``job_placements``' GPU UUIDs of a started job (its latest run's, in index
    order); an empty list for a job that has not started."""
    runs = aliased(Allocation)
    latest = (select(func.max(runs.allocated_at)).where(runs.job_id == Job.id)
              .correlate(Job).scalar_subquery())
    uuids = (select(func.array_agg(aggregate_order_by(Gpu.uuid, Gpu.index, Gpu.id)))
             .select_from(Allocation).join(Gpu, Gpu.id == Allocation.gpu_id)
             .where(Allocation.job_id == Job.id, Allocation.allocated_at == latest)
             .correlate(Job).scalar_subquery())
    empty = cast(literal("{}"), ARRAY(Text))
    return case((Job.node_id.is_(None), empty), else_=func.coalesce(uuids, empty))


def _job_object_columns() -> list[ColumnElement[Any]]:
    """Every field of the JOB object, in job_json's order, as a labelled column whose
    JSON PostgreSQL writes as Python's json writes job_json's value."""
    columns: dict[str, Any] = {}  # column expressions
    for field in JOB_FIELDS:
        if field in _FLOAT_FIELDS:
            columns[field] = _float_json(_FLOAT_FIELDS[field])
        elif field == "warn_signal":
            columns[field] = _warn_signal_json()
        else:
            columns[field] = SQL_FIELDS[field]
    columns["node"] = Node.name
    columns["gpu_uuids"] = _gpu_uuids()
    return [column.label(field) for field, column in columns.items()]


@cache
def _job_list_statement() -> Select[Any, Any, str]:
    """``job_list_json``'s statement before its filters: made once, since building a
    hundred column expressions costs more than the database takes for a short queue."""
    fields = select(*_job_object_columns()).correlate(Job, Node).lateral("job")
    documents = func.string_agg(cast(func.row_to_json(fields.table_valued()), Text),
                                aggregate_order_by(literal(","), Job.id))
    unusual = func.bool_or(func.greatest(*(func.abs(f) for f in _FLOAT_FIELDS.values()))
                           >= FLOAT_LIMIT)
    digits = cast(func.current_setting("extra_float_digits"), Text)
    return (select(func.coalesce(documents, ""), func.coalesce(unusual, False), digits)
            .select_from(Job).outerjoin(Node, Node.id == Job.node_id).join(fields, true()))


def job_list_json(session: Session, query: dict[str, str]) -> bytes | None:
    """``GET /v1/jobs`` without ``fields`` (``{"jobs": [JOB, ...]}``) as the JSON text
    PostgreSQL builds, the same JSON as ``list_jobs`` (no Python object per job: a
    queue of 1,000 in a few milliseconds); None when a float there is one Python
    writes otherwise (see FLOAT_LIMIT)."""
    stmt = _job_list_statement().where(*_list_filters(query))
    body, odd, extra_digits = session.connection().execute(stmt).one()
    if odd or int(extra_digits) < 1:
        return None
    return f'{{"jobs":[{body}]}}'.encode()


def list_jobs(session: Session, query: dict[str, str]) -> dict[str, Any]:
    """The queue (or, with ``all``, every job), filtered as ``GET /v1/jobs`` describes:
    ``{"jobs": [JOB, ...]}``, or with ``fields`` a table of just those JOB fields,
    ``{"fields": [...], "rows": [[...], ...]}`` (see also ``job_table_json``)."""
    fields = parse_fields(query["fields"]) if query.get("fields") else _ALL_FIELDS
    names = list(dict.fromkeys(["id", "node_id"] + [
        c for f in fields if f in JOB_FIELDS for c in JOB_FIELDS[f][0]]))
    stmt = select(*(getattr(Job, c) for c in names)).order_by(Job.id).where(
        *_list_filters(query))
    # The driver's own tuples, not ORM objects or even Core rows, turned into the answer
    # column by column.
    result = session.connection().execute(stmt)
    found = result.cursor.fetchall()
    result.close()
    started = [(row[0], row[1]) for row in found if row[1] is not None]  # id, node_id
    if "gpu_uuids" in fields:
        placed = job_placements(session, started)
    elif "node" in fields:
        placed = _node_names(session, started)
    else:
        placed = {}
    values = dict(zip(names, zip(*found))) if found else {name: () for name in names}
    columns: list[Sequence[Any]] = []
    for field in fields:
        if field in PLACEMENT_FIELDS:
            at = 0 if field == "node" else 1
            columns.append([placed[i][at] if i in placed else (None, [])[at] for i in values["id"]])
            continue
        reads, make = JOB_FIELDS[field]
        columns.append(values[reads[0]] if make is None else
                       list(map(make, *(values[c] for c in reads))))
    rows = list(zip(*columns))
    if query.get("fields"):
        return {"fields": list(fields), "rows": rows}
    return {"jobs": [dict(zip(fields, row)) for row in rows]}


def _node_names(session: Session, started: list[tuple[int, int]]
                ) -> dict[int, tuple[str, list[str]]]:
    """The node of each started job (job id, node id), without its GPUs."""
    if not started:
        return {}
    names = dict(session.execute(select(Node.id, Node.name).where(
        Node.id.in_({node_id for _, node_id in started}))).all())
    return {job_id: (names[node_id], []) for job_id, node_id in started}


def get_job(session: Session, job_id: int, who: Identity) -> dict[str, Any]:
    """One JOB object; its owner and admins also see the script and environment."""
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"invalid job id specified: {job_id}")
    private = who.is_admin or who.uid == job.uid
    return job_json(job, job_placements(session, [(job.id, job.node_id)]).get(job_id), private)
