"""Advance reservations against a real PostgreSQL: making one (nodes named, a GPU count
or a node count picked among the free ones), the refusals (unknown nodes, busy nodes
without IGNORE_JOBS, an overlap without OVERLAP or MAINT, bad windows: nothing stored),
updating and deleting (refused while jobs ask for it), the admin NOTIFY on every write,
a submission with --reservation (refused unless it exists and lets the user in), and the
snapshot carrying reservations and jobs' reservations into the pass."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.core.model import Plan, Policy, Start
from gpusched.core.plan import plan
from gpusched.db import agents, jobs, reservations, submit
from gpusched.db.engine import make_engine, make_sessionmaker, psycopg_dsn
from gpusched.db.models import AdvanceReservationRow, Job
from gpusched.db.notify import open_listener, received
from gpusched.db.partitions import sync_partitions
from gpusched.db.schedule import apply_plan, load_snapshot
from gpusched.errors import Conflict, NotFound, UsageError
from gpusched.messages.reservations import ReservationRequest

USER = jobs.Identity(1000, 1000)  # cloudsdk here; any user name works below
HOUR = 3600


@pytest.fixture
def db(db_url: str) -> Iterator[sessionmaker[Session]]:
    """Nodes n1, n2, n3 with two GPUs each."""
    engine = make_engine(db_url, pool_size=4)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),))
        for name in ("n1", "n2", "n3"):
            agents.register_node(s, {"node": name, "uid": 0, "gpus": [
                {"index": i, "uuid": f"{name}-{i}"} for i in range(2)]})
    yield factory
    engine.dispose()


def _name() -> str:
    import pwd
    return pwd.getpwuid(USER.uid).pw_name


def _create(db: sessionmaker[Session], **body: object) -> dict[str, object]:
    for key in ("start", "end"):
        if isinstance(body.get(key), float):
            body[key] = datetime.fromtimestamp(body[key], UTC).isoformat()  # type: ignore[arg-type]
    with db() as s, s.begin():
        return reservations.create_reservation(s, ReservationRequest.parse(body))


def _count(db: sessionmaker[Session]) -> int:
    with db() as s:
        return s.scalar(select(func.count()).select_from(AdvanceReservationRow)) or 0


def _submit(db: sessionmaker[Session], **body: object) -> int:
    with db() as s, s.begin():
        return submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", **body},
                                 USER).id


def test_make_show_update_and_delete_and_what_is_refused(db: sessionmaker[Session]) -> None:
    start = time.time() + HOUR
    made = _create(db, name="maint", start=start, duration=HOUR, nodes=["n1", "n2"],
                   users=["root"], flags=["MAINT"])
    assert (made["nodes"], made["state"], made["flags"]) == (["n1", "n2"], "INACTIVE", ["MAINT"])
    assert made["node_list"] == "n[1-2]" and made["whole_nodes"] is True
    # A GPU count picks GPUs among the free nodes; MAINT lets it overlap maint.
    gpus = _create(db, name="ml", start=start, duration=HOUR, gpus=3, users=["alice"])
    assert sum(gpus["gpus"].values()) == 3  # type: ignore[union-attr]
    refusals = [
        (dict(name="maint", start=start, duration=60, nodes=["n3"], users=["a"]), Conflict,
         "exists already"),
        (dict(name="x", start=start, duration=60, nodes=["n9"], users=["a"]), NotFound, "n9"),
        (dict(name="x", start=start, duration=60, nodes=["n3"]), UsageError, "users or accounts"),
        (dict(name="x", start=start, duration=60, users=["a"]), UsageError, "nodes"),
        (dict(name="x", start=start + 600, duration=60, gpus=4, users=["a"]), Conflict,
         "only 3 GPU"),  # n1, n2 held whole by maint... but ml overlaps only itself
        (dict(name="x", start=start, end=start - 1, nodes=["n3"], users=["a"]), UsageError,
         "end after"),
        (dict(name="x", start=time.time() - 2 * HOUR, duration=60, nodes=["n3"],
              users=["a"]), UsageError, "over already"),
        (dict(name="x", start=start, duration=2 * 86400, nodes=["n3"], users=["a"],
              flags=["DAILY"]), UsageError, "at most a day"),
        (dict(name="x", start=start, duration=60, nodes=["n1"], users=["a"]), Conflict,
         "busy: n1"),  # ml holds GPUs there (maint, MAINT, may be overlapped)
    ]
    for body, error, words in refusals:
        with pytest.raises(error, match=words):
            _create(db, **body)
    assert _count(db) == 2
    with db() as s, s.begin():
        changed = reservations.update_reservation(
            s, "ml", ReservationRequest.parse({"users": ["alice", "bob"], "duration": 2 * HOUR}))
    assert changed["users"] == ["alice", "bob"] and changed["duration"] == 2 * HOUR
    with db() as s, s.begin(), pytest.raises(NotFound):
        reservations.update_reservation(s, "nope", ReservationRequest.parse({"users": ["a"]}))
    with db() as s:
        assert [r["name"] for r in reservations.list_reservations(s)] == ["maint", "ml"]
    with db() as s, s.begin():
        reservations.delete_reservation(s, "maint")
    assert _count(db) == 1


def test_busy_nodes_need_ignore_jobs_and_every_write_notifies(
        db: sessionmaker[Session], db_url: str) -> None:
    job_id = _submit(db, gpus=1, time_limit=2 * HOUR)
    with db() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        apply_plan(s, snapshot, Plan(starts=(Start(job_id, "n1", ("n1-0",)),)), node_ids)
    soon = time.time() + 60
    with pytest.raises(Conflict, match="requested nodes are busy: n1"):
        _create(db, name="now", start=soon, duration=HOUR, nodes=["n1"], users=["root"])
    # A node count avoids the busy node; IGNORE_JOBS takes it anyway.
    picked = _create(db, name="two", start=soon, duration=HOUR, node_count=2, users=["root"])
    assert picked["nodes"] == ["n2", "n3"]
    with open_listener(psycopg_dsn(db_url)) as conn:
        _create(db, name="now", start=soon, duration=HOUR, nodes=["n1"], users=["root"],
                flags=["IGNORE_JOBS", "OVERLAP"])
        deadline = time.monotonic() + 10
        heard: list[str] = []
        while "admin" not in heard and time.monotonic() < deadline:
            heard += list(received(conn, 0.2))
        assert "admin" in heard
    with db() as s:
        snapshot, _ = load_snapshot(s)
        # What each node's listing names: the one going on (a MAINT one first).
        assert reservations.node_reservations(s, soon + 1) == {
            "n1": "now", "n2": "two", "n3": "two"}
        assert reservations.node_reservations(s, soon - 1) == {}
    _create(db, name="zmaint", start=soon, duration=HOUR, nodes=["n1"], users=["root"],
            flags=["MAINT", "IGNORE_JOBS"])
    with db() as s:
        assert reservations.node_reservations(s, soon + 1)["n1"] == "zmaint"
    assert {r.name for r in snapshot.advance_reservations} == {"two", "now"}


def test_jobs_ask_for_a_reservation_and_the_pass_holds_it(db: sessionmaker[Session]) -> None:
    user = _name()
    _create(db, name="mine", start=time.time() - 60, duration=HOUR, nodes=["n1"],
            users=[user])
    _create(db, name="theirs", start=time.time() - 60, duration=HOUR, nodes=["n2"],
            users=["-" + user])
    with db() as s:
        before = s.scalar(select(func.count()).select_from(Job))
    with db() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),
                            PartitionConfig("small", nodes=("n3",))))
    for name, words, part in (
            ("nope", "no such reservation", "gpu"), ("theirs", "access denied", "gpu"),
            ("bad name!", "invalid reservation name", "gpu"),
            ("mine", "holds no node of partition small", "small")):
        with pytest.raises(UsageError, match=words):
            _submit(db, gpus=1, time_limit=600, reservation=name, partition=part)
    with db() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == before  # nothing stored
    inside = _submit(db, gpus=1, time_limit=600, reservation="mine")
    outside = _submit(db, gpus=2, time_limit=600)
    too_long = _submit(db, gpus=1, time_limit=2 * HOUR, reservation="mine")
    with db() as s:
        snapshot, _ = load_snapshot(s)
    asked = {j.job_id: j.reservation for j in snapshot.pending}
    assert asked[inside] == "mine" and asked[outside] is None
    decided = plan(snapshot, time.time(), Policy())
    where = {s.job_id: s.node for s in decided.starts}
    assert where[inside] == "n1" and where[outside] == "n3"
    # Longer than what is left of the reservation: it starts, its limit cut to its end.
    cut = next(s for s in decided.starts if s.job_id == too_long)
    assert cut.node == "n1" and cut.time_limit is not None and cut.time_limit <= HOUR
    with db() as s, s.begin(), pytest.raises(Conflict, match="in use by 2"):
        reservations.delete_reservation(s, "mine")


def test_the_database_holds_the_bounds(db: sessionmaker[Session]) -> None:
    for values in ("('x', now(), now() - interval '1 hour', '{n1}', '{0}')",
                   "('', now(), now() + interval '1 hour', '{n1}', '{0}')",
                   "('y', now(), now() + interval '1 hour', '{n1,n2}', '{0}')",
                   "('z', now(), now() + interval '1 hour', '{}', '{}')"):
        with db() as s, s.begin(), pytest.raises(IntegrityError):
            s.execute(text("INSERT INTO advance_reservations (name, start_time, end_time, "
                           f"nodes, node_gpus) VALUES {values}"))
    _submit(db, gpus=1)
    with db() as s, s.begin(), pytest.raises(IntegrityError):
        s.execute(text("UPDATE jobs SET reservation = repeat('r', 65)"))


def test_two_made_at_once_do_not_both_take_the_same_nodes(db: sessionmaker[Session]) -> None:
    start = datetime.fromtimestamp(time.time() + HOUR, UTC).isoformat()
    body = {"start": start, "duration": 600, "nodes": ["n3"], "users": ["root"]}
    outcome: list[object] = []
    first = db()
    first.begin()
    reservations.create_reservation(first, ReservationRequest.parse({**body, "name": "a"}))

    def second() -> None:
        try:
            with db() as s, s.begin():
                reservations.create_reservation(s, ReservationRequest.parse(
                    {**body, "name": "b"}))
            outcome.append("made")
        except Conflict as exc:
            outcome.append(exc)

    thread = threading.Thread(target=second)
    thread.start()
    thread.join(1.0)
    assert thread.is_alive() and not outcome  # it waits for the first to finish
    first.commit()
    first.close()
    thread.join(10.0)
    assert len(outcome) == 1 and isinstance(outcome[0], Conflict), outcome
    assert "busy" in str(outcome[0])  # n3 is held by a from then on
    assert _count(db) == 1
