"""The pending queue as a pass reads it: all at once, or kept between passes and read
again only where rows changed.

Every UPDATE of a row writes a new version of it whose ``xmin`` is the writing
transaction's id, so a pending job whose ``(id, xmin)`` is the one read before is the
row read before. A kept queue therefore costs a pass one narrow statement (the ids and
versions of the pending rows) and the full columns of only the rows that are new or
changed since the last pass: with a long queue and few starts, most of it is reused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import cast, literal_column, select, type_coerce
from sqlalchemy.orm import Session
from sqlalchemy.types import NullType, Text

from gpusched.core.model import PendingJob, Reason
from gpusched.db.models import Job

# The version of a row: xmin as text (PostgreSQL's xid has no order worth using here).
_VERSION = cast(literal_column("jobs.xmin"), Text)

_COLUMNS = (
    Job.id, Job.partition, Job.gpus, Job.uid, Job.submit_time, Job.time_limit,
    Job.reason, Job.user_name, Job.account, Job.qos, Job.hold, Job.begin_time,
    Job.dependency, Job.name, Job.array_job_id, Job.array_tasks,
    Job.array_max_running, type_coerce(Job.gpu_types, NullType()), Job.nodes,
    Job.cpus, Job.mem_mb, Job.expected_start,
    type_coerce(Job.nodelist, NullType()), type_coerce(Job.exclude_nodes, NullType()),
    Job.admin_priority, Job.exclusive,
)


def _job(row: Sequence[Any]) -> PendingJob:
    (jid, part, n, uid, submitted, limit, reason, user, account, qos, hold, begin,
     dependency, name, array_job, array_tasks, array_cap, types, nodes, cpus, mem, expected,
     nodelist, exclude, fixed, exclusive) = row[:26]
    return PendingJob(jid, part, n // nodes, uid, submitted.timestamp(), limit, Reason(reason),
                      user, account, qos, hold, begin.timestamp() if begin else None,
                      dependency, name, array_job, array_tasks, array_cap, tuple(types), nodes,
                      cpus, mem, expected.timestamp() if expected else None, tuple(nodelist),
                      tuple(exclude), fixed, exclusive)


def read_pending(session: Session) -> tuple[PendingJob, ...]:
    """Every pending job, read in full."""
    # Core rows (no ORM loading), and the type lists as the driver gives them: a queue
    # of thousands is read in tens of milliseconds.
    return tuple(_job(row) for row in session.connection().execute(
        select(*_COLUMNS).where(Job.state == "PENDING")))


# Up to this many changed rows are read by id; more, and the whole queue is read.
STALE_BY_ID = 200


class PendingRows:
    """Pending jobs kept between passes of one leader, each with its row's version."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[str, PendingJob]] = {}
        self.last_read = 0  # rows read in full by the last call, for tests and logs

    def drop(self) -> None:
        """Forget everything kept: the next read is a full one."""
        self._kept = {}

    def read(self, session: Session) -> tuple[PendingJob, ...]:
        """Every pending job, in the order the versions query gives them; rows whose
        version is the one kept are not read again."""
        conn = session.connection()
        versions = conn.execute(
            select(Job.id, _VERSION).where(Job.state == "PENDING")).all()
        kept = self._kept
        stale = [jid for jid, version in versions
                 if (seen := kept.get(jid)) is None or seen[0] != version]
        fresh: dict[int, tuple[str, PendingJob]] = {}
        if stale:
            query = select(*_COLUMNS, _VERSION).where(Job.state == "PENDING")
            if len(stale) <= STALE_BY_ID:
                query = query.where(Job.id.in_(stale))
            wanted = set(stale)
            for row in conn.execute(query):
                if row[0] in wanted:
                    fresh[row[0]] = (row[26], _job(row))
        self.last_read = len(fresh)
        now_kept: dict[int, tuple[str, PendingJob]] = {}
        for jid, version in versions:
            entry = fresh.get(jid)
            if entry is None:
                seen = kept.get(jid)
                # Gone from the queue between the two statements.
                if seen is None or seen[0] != version:
                    continue
                entry = seen
            now_kept[jid] = entry
        self._kept = now_kept
        return tuple(entry[1] for entry in now_kept.values())
