"""Submissions in one statement (db/submit_known.py) against a real database: they store
exactly what the ordinary path stores and refuse what it refuses, store nothing when
what they knew has changed, and keep the limits under concurrent submissions."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, func, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from gpusched.adminconfig import parse_admin_config
from gpusched.core.arrays import fold, task_count
from gpusched.db import agents
from gpusched.db.admin import apply_config
from gpusched.db.associations import QUEUED
from gpusched.db.controlmodels import SubmitFactsVersion
from gpusched.db.engine import make_engine, make_sessionmaker, psycopg_dsn
from gpusched.db.jobs import Identity
from gpusched.db.models import Gpu, Job, JobScript, Node, Partition
from gpusched.db.submit import store_submission
from gpusched.db.submit_known import store, store_known
from gpusched.db.submit_store import KnownFacts
from gpusched.errors import GpuschedError, LimitReached, UsageError

ALICE = Identity(1000, 1000, "alice")
BOB = Identity(1001, 1001, "bob")
CONFIG: dict[str, Any] = {
    "partition": [{"name": "gpu", "default": True, "max_time": "2:00:00"},
                  {"name": "debug", "nodes": ["n1"]}],
    "account": [{"name": "physics", "qos": ["normal", "high"], "default_qos": "normal"},
                {"name": "bio"}],
    "user": [{"name": "alice", "accounts": ["physics", "bio"], "max_submit_jobs": 6},
             {"name": "bob", "accounts": ["bio"]}],
    "qos": [{"name": "normal"}, {"name": "high", "max_submit_jobs_per_user": 3}],
}
BODY: dict[str, Any] = {"script": "#!/bin/sh\ntrue\n", "work_dir": "/tmp"}
# The columns a submission does not choose: told apart by the database.
UNCHOSEN = {"id", "submit_time", "script_id", "array_job_id", "submit_key"}


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url, pool_size=4)
    maker = make_sessionmaker(engine)
    with maker() as s, s.begin():
        apply_config(s, parse_admin_config([("test.toml", CONFIG)]))
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": [
            {"uuid": f"GPU-{i}", "index": i, "name": "A100", "memory_mb": 40960}
            for i in range(4)]})
    yield maker
    engine.dispose()


def _rows(sessions: sessionmaker[Session]) -> int:
    with sessions() as s:
        return int(s.scalar(select(func.count()).select_from(Job)) or 0) + int(
            s.scalar(select(func.count()).select_from(JobScript)) or 0)


def _row(sessions: sessionmaker[Session], job_id: int) -> dict[str, Any]:
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return {c.name: getattr(job, c.key) for c in Job.__mapper__.columns
                if c.name not in UNCHOSEN} | {"script": job.payload.script}


def _known(sessions: sessionmaker[Session], body: dict[str, Any], who: Identity,
           known: KnownFacts, limit: int | None = None) -> Any:
    """store_known on a pooled connection, as submit_known.store makes it."""
    pooled = sessions.kw["bind"].raw_connection()
    try:
        return store_known(pooled.driver_connection, body, who, known, limit)
    finally:
        pooled.close()


def _ordinary(sessions: sessionmaker[Session], body: dict[str, Any], who: Identity,
              known: KnownFacts | None = None, limit: int | None = None) -> Any:
    with sessions() as s, s.begin():
        return store_submission(s, body, who, limit, known=known)


def test_a_known_submission_is_one_statement_storing_what_the_ordinary_path_does(
        sessions: sessionmaker[Session], tmp_path: Path) -> None:
    known = KnownFacts()
    body = {**BODY, "gpus": 2, "time_limit": 600, "account": "physics", "name": "x",
            "mail_type": ["END"], "nodelist": ["n1"], "array": "1,3%2"}
    assert _known(sessions, body, ALICE, known) is None  # nothing known yet
    first, created = _ordinary(sessions, body, ALICE, known)
    assert created
    pooled = sessions.kw["bind"].raw_connection()
    trace = tmp_path / "trace"
    try:
        conn = pooled.driver_connection
        with trace.open("w") as out:  # what it sends PostgreSQL, message by message
            conn.pgconn.trace(out.fileno())
            try:
                again = store_known(conn, body, ALICE, known)
            finally:
                conn.pgconn.untrace()
    finally:
        pooled.close()
    sent = [line.split("\t")[3].split()[0] for line in trace.read_text().splitlines()
            if line.split("\t")[1] == "F"]
    assert sent.count("Sync") == 1 and "Query" not in sent  # one statement, no BEGIN
    assert again is not None and again[1] is True
    assert _row(sessions, again[0].id) == _row(sessions, first.id)
    assert again[0].hold is None and again[0].reason == "None"


def test_a_submit_key_sent_before_answers_its_job(sessions: sessionmaker[Session]) -> None:
    known = KnownFacts()
    body = {**BODY, "submit_key": "k" * 16}
    stored, created = _ordinary(sessions, {**BODY, "submit_key": "other"}, ALICE, known)
    first = _known(sessions, body, ALICE, known)
    assert first is not None and first[1]
    before = _rows(sessions)
    again = _known(sessions, body, ALICE, known)
    assert again == (first[0], False)
    assert _rows(sessions) == before


@pytest.mark.parametrize("change", [
    update(Partition).where(Partition.name == "gpu").values(state="DRAIN"),
    update(Partition).where(Partition.name == "gpu").values(max_time=60),
])
def test_facts_changed_since_they_were_known_store_nothing(
        sessions: sessionmaker[Session], change: Any) -> None:
    known = KnownFacts()
    body = {**BODY, "partition": "gpu", "time_limit": 600}
    _ordinary(sessions, body, ALICE, known)
    with sessions() as s, s.begin():
        s.execute(change)
    before = _rows(sessions)
    assert _known(sessions, body, ALICE, known) is None
    assert _rows(sessions) == before
    with pytest.raises(UsageError):  # the ordinary path reads them afresh and refuses
        store(sessions, body, ALICE, known)
    assert _rows(sessions) == before


def _version(sessions: sessionmaker[Session]) -> int:
    with sessions() as s:
        return int(s.scalar(select(SubmitFactsVersion.version)) or 0)


# What submissions read of nodes and GPUs, changed; and writes of what they do not read.
_NODE_FACTS = [
    update(Node).where(Node.name == "n1").values(cpus=Node.cpus + 8),
    update(Node).where(Node.name == "n1").values(memory_mb=1024),
    update(Gpu).where(Gpu.uuid == "GPU-0").values(present=False),
    update(Gpu).where(Gpu.uuid == "GPU-1").values(mig_profile="1g.10gb"),
    update(Gpu).where(Gpu.uuid == "GPU-2").values(memory_mb=81920),
    delete(Gpu).where(Gpu.uuid == "GPU-3"),
]
_NOT_FACTS = [
    update(Node).where(Node.name == "n1").values(last_seen=func.now(), state="DRAIN"),
    update(Node).where(Node.name == "n1").values(cpus=Node.cpus),  # the same value
    update(Gpu).where(Gpu.uuid == "GPU-0").values(healthy=False, health_reason="xid 79"),
]


def _known_then(sessions: sessionmaker[Session], change: Any) -> tuple[KnownFacts, int]:
    """Facts known from an ordinary submission, then ``change`` made; the facts and the
    version before the change."""
    known = KnownFacts()
    _ordinary(sessions, BODY, BOB, known)
    before = _version(sessions)
    with sessions() as s, s.begin():
        s.execute(change)
    return known, before


@pytest.mark.parametrize("change", _NODE_FACTS)
def test_a_change_of_what_submissions_read_of_nodes_and_gpus_is_seen(
        sessions: sessionmaker[Session], change: Any) -> None:
    known, before = _known_then(sessions, change)
    assert _version(sessions) > before
    rows = _rows(sessions)
    assert _known(sessions, BODY, BOB, known) is None  # nothing stored on what changed
    assert _rows(sessions) == rows
    stored, created = store(sessions, BODY, BOB, known)  # read afresh, and known again
    assert created and _known(sessions, BODY, BOB, known) is not None


@pytest.mark.parametrize("change", _NOT_FACTS)
def test_writes_of_what_submissions_do_not_read_keep_the_fast_path(
        sessions: sessionmaker[Session], change: Any) -> None:
    known, before = _known_then(sessions, change)
    assert _version(sessions) == before
    assert _known(sessions, BODY, BOB, known) is not None


def test_every_row_written_of_an_admin_table_raises_the_version_once_per_commit(
        sessions: sessionmaker[Session]) -> None:
    seen = [_version(sessions)]
    for statement in ("UPDATE partitions SET max_time = max_time",  # two rows: once
                      "UPDATE account_users SET max_submit_jobs = max_submit_jobs"
                      " WHERE user_name = 'bob'",
                      "UPDATE accounts SET parent = parent", "UPDATE qos SET max_wall = NULL"):
        with sessions() as s, s.begin():
            s.execute(text(statement))
        seen.append(_version(sessions))
    assert [b - a for a, b in zip(seen, seen[1:])] == [1, 1, 1, 1]
    with sessions() as s, s.begin():  # no row written: nothing changed
        s.execute(text("DELETE FROM account_users WHERE user_name = 'nobody'"))
    assert _version(sessions) == seen[-1]


def test_a_node_or_job_named_that_is_gone_stores_nothing(
        sessions: sessionmaker[Session]) -> None:
    known = KnownFacts()
    _ordinary(sessions, BODY, ALICE, known)
    before = _rows(sessions)
    assert _known(sessions, {**BODY, "exclude": ["n9"]}, ALICE, known) is None
    assert _known(sessions, {**BODY, "dependency": "afterok:999"}, ALICE, known) is None
    assert _rows(sessions) == before


def test_limits_hold_in_the_statement_and_across_concurrent_submissions(
        sessions: sessionmaker[Session]) -> None:
    known = KnownFacts()
    body = {**BODY, "hold": True, "account": "physics", "qos": "high"}
    _ordinary(sessions, body, ALICE, known)
    assert _known(sessions, {**body, "array": "0-2"}, ALICE, known) is None  # 1 + 3 > 3
    refused: list[Exception] = []

    def submit_many() -> None:
        for _ in range(6):
            try:
                store(sessions, {**body, "submit_key": os.urandom(8).hex()}, ALICE, known)
            except LimitReached as exc:
                refused.append(exc)

    threads = [threading.Thread(target=submit_many) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Job).where(Job.qos == "high")) == 3
    assert len(refused) == 3 * 6 - 2 and all("MaxSubmitJobsPerUser" in str(e) for e in refused)


# Bodies on the edges of what this cluster takes: the same outcome either way.
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "partition": st.sampled_from(["gpu", "gpu", "debug", "nope", "gpu,debug"]),
    "account": st.sampled_from(["physics", "physics", "bio", "theory"]),
    "qos": st.sampled_from(["normal", "normal", "high", "scavenger"]),
    "gpus": st.integers(0, 5),
    "nodes": st.sampled_from([1, 1, 2]),
    "time_limit": st.sampled_from([60, 600, 7201]),
    "nodelist": st.sampled_from([["n1"], ["n1"], ["n2"]]),
    "exclude": st.sampled_from([[], ["n3"]]),
    "array": st.sampled_from(["0-1", "1,5,9-20:3%2"]),
    "hold": st.booleans(),
    "licenses": st.sampled_from(["matlab:1"]),
    "mail_type": st.sampled_from([["END"], ["BEGIN", "FAIL"]]),
    "dependency": st.sampled_from(["afterok:1", "afterany:99999"]),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.fixed_dictionaries({}, optional=FIELDS), st.sampled_from([ALICE, BOB]),
       st.sampled_from([None, 8]))
def test_known_and_ordinary_submissions_agree(sessions: sessionmaker[Session],
                                              fields: dict[str, Any], who: Identity,
                                              limit: int | None) -> None:
    with sessions() as s, s.begin():  # each example from an empty queue
        s.execute(delete(Job))
        s.execute(delete(JobScript))
    known = KnownFacts()
    body = {**BODY, **fields}
    try:
        _ordinary(sessions, body, who, known, limit)  # what it reads is known after it
    except GpuschedError:
        pass

    def known_first() -> Any:
        done = _known(sessions, body, who, known, limit)
        event("one statement" if done is not None else "made again")
        return done if done is not None else _ordinary(sessions, body, who, known, limit)

    outcomes = []
    for way in (known_first, lambda: _ordinary(sessions, body, who, None, limit)):
        before = _rows(sessions)
        try:
            job, created = way()
            outcomes.append(_row(sessions, job.id))
        except GpuschedError as exc:
            outcomes.append({"refused": f"{type(exc).__name__}: {exc.message}"})
            assert _rows(sessions) == before
    assert outcomes[0] == outcomes[1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sets(st.integers(0, 300), min_size=1, max_size=40))
def test_the_statement_counts_an_arrays_tasks_as_core_arrays_does(
        db_url: str, ids: set[int]) -> None:
    tasks = fold(sorted(ids))
    counting = QUEUED.format(qos="'normal'").replace(
        "FROM jobs WHERE uid = %(uid)s AND state IN ('PENDING', 'RUNNING')",
        "FROM (SELECT CAST(%(tasks)s AS text) AS array_tasks, 'normal' AS qos) AS jobs")
    with psycopg.connect(psycopg_dsn(db_url)) as conn:
        counts = conn.execute("SELECT " + counting, {"tasks": tasks}).fetchone()
    assert counts is not None and list(counts[0]) == [task_count(tasks)] * 2 == [len(ids)] * 2


def test_a_known_partition_remembers_the_shapes_that_fit_and_not_those_refused(
        sessions: sessionmaker[Session]) -> None:
    known = KnownFacts()
    _ordinary(sessions, BODY, BOB, known)
    facts = known.get("bob", None, None, None)
    assert facts is not None and facts.first.fits == {}
    assert _known(sessions, {**BODY, "gpus": 2}, BOB, known) is not None
    assert len(facts.first.fits) == 1  # checked on the nodes once, then remembered
    assert _known(sessions, {**BODY, "gpus": 2}, BOB, known) is not None
    assert len(facts.first.fits) == 1
    with pytest.raises(UsageError):  # 8 GPUs fit no node: refused, the ordinary way
        store(sessions, {**BODY, "gpus": 8}, BOB, known)
    after = known.get("bob", None, None, None)
    assert after is not None and all(shape[0] != 8 for shape in after.first.fits)
