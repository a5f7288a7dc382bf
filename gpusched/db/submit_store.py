"""Storing a submission: its script and its job row in one INSERT, built from the row
its checks made (the row's keys name the columns, the model gives their types, so a
column added to the row needs nothing here), and the stable facts former submissions
read (``KnownFacts``), which let a submission store its job in one round trip
(db/submit_known.py) with a guarded form of the same INSERT."""

from __future__ import annotations

import re
import threading
from functools import lru_cache
from typing import Any

from psycopg import Connection, Cursor, RawCursor
from psycopg.types.json import Jsonb
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from gpusched.db.associations import LOCK_USER, QUEUED
from gpusched.db.engine import driver
from gpusched.db.models import Job
from gpusched.db.notify import CHANNEL
from gpusched.db.submit_facts import FACTS_VERSION, Facts
from gpusched.messages import JobRequest

# Columns of a new job that follow from others: its id (taken first, as an array's
# record is its own array_job_id), its script's, and when an allocation's client was
# last seen (it is, as it submits).
_DERIVED = ("id", "script_id", "array_job_id", "client_seen")


@lru_cache(maxsize=1)
def _column_types() -> dict[str, str]:
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    return {column.name: str(column.type.compile(dialect=dialect))
            for column in Job.__table__.columns}


@lru_cache(maxsize=32)
def _insert(columns: tuple[str, ...], guard: str | None) -> str:
    """The INSERT of a job's script and row (``columns``, each a parameter of its
    name), queuing the NOTIFY it wants, if any (delivered at the commit). With
    ``guard`` (the CTEs before it and a ``go`` CTE of one row or none), nothing is
    stored unless ``go`` has its row."""
    types = _column_types()
    unknown = sorted(set(columns) - set(types) | set(columns) & set(_DERIVED))
    if unknown:
        raise ValueError(f"a job row names columns jobs has not, or derived ones: {unknown}")
    names = ", ".join((*_DERIVED, *columns))
    values = ", ".join(f"CAST(%({name})s AS {types[name]})" for name in columns)
    return (
        f"WITH {guard + ', ' if guard else ''}script AS (INSERT INTO job_scripts"
        " (script, args, environment) SELECT %(script)s, CAST(%(args)s AS text[]),"
        f" %(environment)s{' FROM go' if guard else ''} RETURNING id),"
        " new AS (SELECT nextval('jobs_id_seq') AS id FROM script),"
        f" job AS (INSERT INTO jobs ({names})"
        " SELECT new.id, script.id, CASE WHEN %(array)s THEN new.id END,"
        f" CASE WHEN %(interactive)s THEN now() END, {values} FROM new, script"
        " RETURNING id, CASE WHEN CAST(%(wake)s AS text) IS NOT NULL"
        " THEN pg_notify(%(channel)s, %(wake)s) END)"
        f" SELECT (SELECT id FROM job){', (SELECT found FROM earlier)' if guard else ''}")


@lru_cache(maxsize=32)
def _numbered(statement: str) -> tuple[str, tuple[str, ...]]:
    """``statement`` with PostgreSQL's own placeholders ($1, ...) for its named ones,
    and the names in their order."""
    names: list[str] = []

    def number(found: re.Match[str]) -> str:
        if found.group(1) not in names:
            names.append(found.group(1))
        return f"${names.index(found.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, statement), tuple(names)


def execute(conn: Connection[Any], statement: str, params: dict[str, Any]) -> Cursor[Any]:
    """Run ``statement`` (named placeholders) with ``params`` as PostgreSQL's own
    placeholders: psycopg then sends it as it is, where it would parse again, at every
    run, a statement longer than its cache takes (4,096 characters, 50 parameters), as
    a job's INSERT is."""
    text, names = _numbered(statement)
    return RawCursor(conn).execute(text, [params[name] for name in names])


def store_params(request: JobRequest, row: dict[str, Any], wake: str | None) -> dict[str, Any]:
    """The parameters of _insert for a job ``row`` of ``request``; ``wake``: the NOTIFY
    it queues (None: none)."""
    return {"script": request.script, "args": list(request.args),
            "environment": Jsonb(dict(request.environment)), **row,
            "array": row["array_tasks"] is not None, "wake": wake, "channel": CHANNEL}


def store_job(session: Session, request: JobRequest, row: dict[str, Any],
              wake: str | None) -> int:
    """Store a job (``row``: its columns) and its script, and queue a NOTIFY of
    ``wake`` (None: none) with it; its id."""
    found = execute(driver(session), _insert(tuple(row), None),
                    store_params(request, row, wake)).fetchone()
    assert found is not None  # INSERT ... RETURNING of one row
    return int(found[0])


# The guard of a submission checked against known facts: the stable facts are still
# those known (their version, submit_facts.FACTS_VERSION, is the one read with them)
# and its submit key is new (the job stored with it is answered); and, where the
# submission names some or has limits, the nodes and jobs it names exist and the user's
# queued jobs leave room (CAST(NULL ...): no limit), in all and in QOS %(counted_qos)s.
# What it reads is of the statement's snapshot: it takes the user's submissions lock
# (LOCK_USER), waiting for a submission that holds it, and holds only if the version it
# updates is the one of that snapshot: no other submission of the user was stored since.
_GUARD = (
    "seen AS (SELECT version FROM user_submit_locks WHERE uid = %(uid)s),"
    f" locked AS ({LOCK_USER}),"
    " earlier AS (SELECT json_build_array(id, hold, reason) AS found FROM jobs"
    " WHERE uid = %(uid)s AND submit_key = CAST(%(submit_key)s AS text)){queued},"
    f" go AS (SELECT WHERE {FACTS_VERSION} = CAST(%(facts_version)s AS bigint)"
    " AND (SELECT version FROM locked) = COALESCE((SELECT version FROM seen), 0) + 1"
    " AND NOT EXISTS (SELECT FROM earlier){conditions})")
_NODES_NAMED = (" AND (SELECT count(*) FROM nodes WHERE name = ANY(CAST(%(named)s AS text[])))"
                " = cardinality(CAST(%(named)s AS text[]))")
_JOBS_NAMED = (" AND (SELECT count(*) FROM jobs WHERE id = ANY(CAST(%(jobs)s AS bigint[])))"
               " = cardinality(CAST(%(jobs)s AS bigint[]))")
_QUEUED = (", queued AS (SELECT "
           + QUEUED.format(qos="CAST(%(counted_qos)s AS text)") + " AS counts)")
_ROOM = (" AND (CAST(%(room)s AS bigint) IS NULL"
         " OR (SELECT counts[1] FROM queued) <= CAST(%(room)s AS bigint))"
         " AND (CAST(%(qos_room)s AS bigint) IS NULL"
         " OR (SELECT counts[2] FROM queued) <= CAST(%(qos_room)s AS bigint))")


@lru_cache(maxsize=32)
def guarded_insert(columns: tuple[str, ...], nodes_named: bool, jobs_named: bool,
                   limited: bool) -> str:
    """_insert under _GUARD, with the checks of the nodes and jobs named and of the
    limits where the submission has them: answers the new job's id (NULL when the
    guard held it back) and the job stored before with the submit key, if any."""
    conditions = "".join([_NODES_NAMED if nodes_named else "",
                          _JOBS_NAMED if jobs_named else "", _ROOM if limited else ""])
    return _insert(columns, _GUARD.replace("{queued}", _QUEUED if limited else "")
                   .replace("{conditions}", conditions))


class KnownFacts:
    """The stable facts (submit_facts.STABLE) the latest submissions read, by whom they
    were of and what they asked for: at most ``size`` of them, the oldest forgotten
    first. Never trusted as they are: a submission that uses them reads them again in
    its one statement and stores nothing if they changed."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._facts: dict[tuple[str, str | None, str | None, str | None], Facts] = {}
        self._lock = threading.Lock()

    def remember(self, user: str, partition: str | None, account: str | None,
                 qos: str | None, facts: Facts) -> None:
        """Keep the stable part of ``facts``, read for this user and these names."""
        stable = facts._replace(first=facts.first._replace(fits={}), known_nodes=set(),
                                known_jobs=set(), earlier=None, queued=None)
        with self._lock:
            self._facts.pop((user, partition, account, qos), None)
            self._facts[(user, partition, account, qos)] = stable
            while len(self._facts) > self.size:
                del self._facts[next(iter(self._facts))]

    def get(self, user: str, partition: str | None, account: str | None,
            qos: str | None) -> Facts | None:
        """The stable facts last read for this user and these names, if any."""
        return self._facts.get((user, partition, account, qos))
