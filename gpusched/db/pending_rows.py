"""The pending queue as a pass reads it: all at once, or kept between passes and read
again only where rows changed.

Every UPDATE of a row writes a new version of it whose ``xmin`` is the writing
transaction's id, so a pending job whose ``(id, xmin)`` is the one read before is the
row read before. A kept queue is sent with the pass's snapshot query (load_snapshot in
db/schedule.py), which gives, in the same statement, the id and version of every pending
row and the full columns of only those whose version is not the one kept: with a long
queue and few starts, most of it is reused, and the queue costs no statement of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import select, text, type_coerce
from sqlalchemy.orm import Session
from sqlalchemy.types import NullType

from gpusched.core.licenses import stored_licenses
from gpusched.core.model import PendingJob, Reason
from gpusched.db.models import Job

# The version of a pending row: xmin (PostgreSQL's xid has no order worth using here).
_VERSION = "CAST(CAST(j.xmin AS text) AS bigint)"
# The columns of a pending job that _json_job reads (times in seconds since the epoch).
_FIELDS: tuple[str, ...] = (
    "j.id", "j.partition", "j.gpus", "j.uid", "extract(epoch FROM j.submit_time)",
    "j.time_limit", "j.reason", "j.user_name", "j.account", "j.qos", "j.hold",
    "extract(epoch FROM j.begin_time)", "j.dependency", "j.name", "j.array_job_id",
    "j.array_tasks", "j.array_max_running", "j.gpu_types", "j.nodes", "j.cpus", "j.mem_mb",
    "extract(epoch FROM j.expected_start)", "j.nodelist", "j.exclude_nodes",
    "j.admin_priority", "j.exclusive", "j.share_units", "j.share_mode", "j.gpu_mem_mb",
    "j.licenses", "j.top_rank",
)
# sbatch's --nice, --time-min and --deadline (migration 0030), last: see _with_flags.
_FIELDS += ("j.nice", "j.time_min", "extract(epoch FROM j.deadline)")
# The pending jobs, for the snapshot query: a JSON array of columns (one JSON array
# each, a row's values at the same place in each): the id and version of every pending
# row, then the _FIELDS of the rows not kept with that version (:kept_ids and
# :kept_versions, array texts). One statement: what it reads of the queue is all of one
# moment.
PENDING_SQL = (
    f"(SELECT json_build_array(json_agg(j.id), json_agg({_VERSION}), "
    + ", ".join(f"json_agg({field}) FILTER (WHERE k.id IS NULL)" for field in _FIELDS)
    + ") FROM jobs AS j LEFT JOIN unnest(CAST(:kept_ids AS bigint[]), "
    "CAST(:kept_versions AS bigint[])) AS k(id, version) "
    f"ON k.id = j.id AND k.version = {_VERSION} WHERE j.state = 'PENDING')"
)
_READ = text(f"SELECT {PENDING_SQL}")

_COLUMNS: tuple[Any, ...] = (
    Job.id, Job.partition, Job.gpus, Job.uid, Job.submit_time, Job.time_limit,
    Job.reason, Job.user_name, Job.account, Job.qos, Job.hold, Job.begin_time,
    Job.dependency, Job.name, Job.array_job_id, Job.array_tasks,
    Job.array_max_running, type_coerce(Job.gpu_types, NullType()), Job.nodes,
    Job.cpus, Job.mem_mb, Job.expected_start,
    type_coerce(Job.nodelist, NullType()), type_coerce(Job.exclude_nodes, NullType()),
    Job.admin_priority, Job.exclusive, Job.share_units, Job.share_mode, Job.gpu_mem_mb,
    Job.licenses, Job.top_rank,
)

_COLUMNS += (Job.nice, Job.time_min, Job.deadline)
_FLAGS = _FIELDS.index("j.nice")  # where they are in a row of either


def _with_flags(job: PendingJob, row: Sequence[Any]) -> PendingJob:
    """``job`` with its --nice, --time-min and --deadline from its row (most jobs have
    none of them, and are given back as they are)."""
    nice, time_min, deadline = row[_FLAGS:_FLAGS + 3]
    if not nice and time_min is None and deadline is None:
        return job
    return replace(job, nice=nice or 0, time_min=time_min, deadline=None if deadline is None
                   else float(deadline) if isinstance(deadline, int | float)
                   else deadline.timestamp())


def _job(row: Sequence[Any]) -> PendingJob:
    (jid, part, n, uid, submitted, limit, reason, user, account, qos, hold, begin,
     dependency, name, array_job, array_tasks, array_cap, types, nodes, cpus, mem, expected,
     nodelist, exclude, fixed, exclusive, share, share_mode, gpu_mem, licenses) = row[:30]
    return PendingJob(jid, part, n // nodes, uid, submitted.timestamp(), limit, Reason(reason),
                      user, account, qos, hold, begin.timestamp() if begin else None,
                      dependency, name, array_job, array_tasks, array_cap, tuple(types), nodes,
                      cpus, mem, expected.timestamp() if expected else None, tuple(nodelist),
                      tuple(exclude), fixed, exclusive, share or 0, share_mode, gpu_mem or 0,
                      stored_licenses(licenses), top=row[30])


def _float(value: float | None) -> float | None:
    """A JSON number (an int where it has no fraction) as a float."""
    return None if value is None else float(value)


def _json_job(row: Sequence[Any]) -> PendingJob:
    """A pending job from its _FIELDS as PENDING_SQL gives them."""
    (jid, part, n, uid, submitted, limit, reason, user, account, qos, hold, begin,
     dependency, name, array_job, array_tasks, array_cap, types, nodes, cpus, mem, expected,
     nodelist, exclude, fixed, exclusive, share, share_mode, gpu_mem, licenses) = row[:30]
    return PendingJob(jid, part, n // nodes, uid, float(submitted), limit, Reason(reason),
                      user, account, qos, hold, _float(begin), dependency, name, array_job,
                      array_tasks, array_cap, tuple(types), nodes, cpus, mem, _float(expected),
                      tuple(nodelist), tuple(exclude), _float(fixed), exclusive, share or 0,
                      share_mode, gpu_mem or 0, stored_licenses(licenses), top=row[30])


def read_pending(session: Session) -> tuple[PendingJob, ...]:
    """Every pending job, read in full (a statement of its own)."""
    # Core rows (no ORM loading), and the type lists as the driver gives them: a queue
    # of thousands is read in tens of milliseconds.
    return tuple(_with_flags(_job(row), row) for row in session.connection().execute(
        select(*_COLUMNS).where(Job.state == "PENDING")))


def _array(values: Any) -> str:
    """A PostgreSQL array literal of integers (cheaper to send than a list of them)."""
    return "{" + ",".join(map(str, values)) + "}"


class PendingRows:
    """Pending jobs kept between passes of one leader, each with its row's version.

    ``params`` gives what the snapshot query needs to leave the kept rows out, ``take``
    the queue from what it answered; a PendingRows made for one read (kept nothing)
    reads the whole queue.
    """

    def __init__(self) -> None:
        self._kept: dict[int, tuple[int, PendingJob]] = {}
        self._sent: dict[int, tuple[int, PendingJob]] = {}
        self.last_read = 0  # rows read in full by the last call, for tests and logs

    def drop(self) -> None:
        """Forget everything kept: the next read is a full one."""
        self._kept = {}

    def params(self) -> dict[str, str]:
        """The rows kept, as the snapshot query's :kept_ids and :kept_versions."""
        kept = self._sent = self._kept
        return {"kept_ids": _array(kept), "kept_versions": _array(v for v, _ in kept.values())}

    def take(self, answer: list[list[Any] | None]) -> tuple[PendingJob, ...]:
        """Every pending job, in the order the snapshot query gave them, from its
        PENDING_SQL answer to the last ``params``; kept from now on."""
        sent = self._sent
        ids, versions, *fields = answer
        fresh = ({row[0]: _with_flags(_json_job(row), row) for row in zip(*fields)}
                 if fields[0] else {})
        now_kept: dict[int, tuple[int, PendingJob]] = {}
        for jid, version in zip(ids or (), versions or ()):
            job = fresh.get(jid)
            # Not read: the version sent, the job as kept.
            now_kept[jid] = sent[jid] if job is None else (version, job)
        self._kept, self._sent, self.last_read = now_kept, {}, len(fresh)
        return tuple(entry[1] for entry in now_kept.values())

    def read(self, session: Session) -> tuple[PendingJob, ...]:
        """The queue read on its own (a pass reads it with its snapshot instead)."""
        return self.take(session.connection().execute(_READ, self.params()).scalar_one())
