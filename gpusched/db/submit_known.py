"""A submission in one round trip to PostgreSQL, when the stable facts it needs were
read by a submission before it (``KnownFacts``).

Its checks (submit.check_submission, the same code as every submission's) run on those
facts before anything is sent; then one autocommit statement takes the user's
submissions lock and stores the job only if the stable facts are still the ones checked
(their version: submit_facts.FACTS_VERSION), every node and job the submission names
exists, its submit key is new and the user's queued jobs leave room under its limits;
else it stores nothing, and the submission is made again the ordinary way
(store_submission), which reads everything afresh and gives the exact answer: the job
stored before with the same key, a refusal, or the job."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from psycopg import Connection, OperationalError
from psycopg.errors import UniqueViolation
from sqlalchemy.orm import Session, sessionmaker

from gpusched.core.licenses import Licenses
from gpusched.db.associations import Association, QosRow, SubmitLimit
from gpusched.db.direct import DirectConnections
from gpusched.db.jobs import Identity
from gpusched.db.submit import (
    Submitted,
    check_submission,
    first_partition,
    needs_pass,
    store_submission,
)
from gpusched.db.submit_facts import PartitionFacts
from gpusched.db.submit_store import (
    KnownFacts,
    execute,
    guarded_insert,
    store_params,
)
from gpusched.errors import GpuschedError
from gpusched.messages import JobRequest


class _NotKnown(Exception):
    """The checks want a fact the known ones lack."""


class _NoReads:
    """Reads for checks that must find everything in the known facts."""

    def partition(self, name: str | None) -> PartitionFacts:
        raise _NotKnown

    def check_licenses(self, asked: Licenses) -> None:
        if asked:
            raise _NotKnown

    def association(self, user: str, account: str) -> Association:
        raise _NotKnown

    def qos(self, name: str) -> QosRow | None:
        raise _NotKnown

    def session(self) -> Session:
        raise _NotKnown


def _room(limits: list[SubmitLimit], adding: int, per_qos: bool) -> int | None:
    """How many queued jobs the user may have for ``adding`` more to pass none of
    ``limits`` (those counting one QOS, or those counting all); None: no such limit."""
    most = [limit.most for limit in limits if (limit.qos is not None) == per_qos]
    return min(most) - adding if most else None


def store_known(conn: Connection[Any], body: dict[str, Any], who: Identity,
                known: KnownFacts, max_submit_jobs: int | None = None,
                notify: bool = False) -> tuple[Submitted, bool] | None:
    """store_submission in one round trip on ``conn`` (idle: outside any transaction;
    in autocommit or not), committed, where the facts ``known`` allow it: the job and
    whether it is new; None where the submission must be made the ordinary way (nothing
    stored). A body that does not parse is refused here."""
    request = JobRequest.parse(body)
    user, first = who.user, first_partition(request)
    facts = known.get(user, first, request.account, request.qos)
    if facts is None or facts.version is None:
        return None
    named_nodes = set(request.nodelist) | set(request.exclude)
    named_jobs = request.dependency_job_ids
    facts = facts._replace(known_nodes=named_nodes, known_jobs=set(named_jobs))
    try:
        checked = check_submission(request, who, facts, _NoReads(), max_submit_jobs)
    except (_NotKnown, GpuschedError):  # a refusal is made from facts read afresh
        return None
    room, qos_room = (_room(checked.limits, checked.adding, False),
                      _room(checked.limits, checked.adding, True))
    wake = "sched" if notify and needs_pass(checked.stored) else None
    pooled = not conn.autocommit  # a pool's connection, given back as it was taken
    if pooled:
        conn.autocommit = True  # the one statement is the transaction
    try:
        statement = guarded_insert(tuple(checked.row), bool(named_nodes), bool(named_jobs),
                                   bool(checked.limits))
        found = execute(conn, statement, {
            **store_params(request, checked.row, wake), "facts_version": facts.version,
            "named": sorted(named_nodes), "jobs": sorted(named_jobs), "room": room,
            "qos_room": qos_room, "counted_qos": checked.qos}).fetchone()
    except UniqueViolation:  # the same submit key, stored meanwhile: see store_submission
        return None
    finally:
        if pooled:
            conn.autocommit = False
    assert found is not None  # the statement answers one row
    job_id, earlier = found
    if job_id is not None:
        return checked.stored._replace(id=int(job_id)), True
    if earlier is not None:
        return Submitted(int(earlier[0]), earlier[1], earlier[2]), False
    return None


def store(sessions: sessionmaker[Session], body: dict[str, Any], who: Identity,
          known: KnownFacts, max_submit_jobs: int | None = None,
          notify: bool = False, direct: DirectConnections | None = None
          ) -> tuple[Submitted, bool]:
    """A submission as the API makes it: store_known on a connection of ``direct`` (or,
    without it, a pooled connection of ``sessions``), else store_submission (which keeps
    what it reads in ``known``)."""
    who = replace(who, name=who.user)  # looked up once
    done = None
    if direct is not None:
        conn = direct.take()
        if conn is not None:
            try:
                done = store_known(conn, body, who, known, max_submit_jobs, notify)
            except OperationalError:  # made again the ordinary way, which reports it
                direct.discard(conn)
            except BaseException:
                direct.give(conn)
                raise
            else:
                direct.give(conn)
    else:
        pooled = sessions.kw["bind"].raw_connection()
        try:
            conn = pooled.driver_connection
            assert conn is not None  # a connection the pool has just given
            done = store_known(conn, body, who, known, max_submit_jobs, notify)
        except OperationalError:  # made again the ordinary way, which reports it
            pooled.invalidate()
        finally:
            pooled.close()
    if done is not None:
        return done
    with sessions() as session, session.begin():
        return store_submission(session, body, who, max_submit_jobs, notify, known)
