"""Licenses against a real PostgreSQL: ``gpusched admin apply`` stores the [licenses]
table (the complete set) and sends the admin NOTIFY; a submission asking for a license
the cluster lacks, or for more than it has, stores nothing; the snapshot carries the
cluster's counts and what pending and running jobs ask for; the database holds the
bounds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gpusched.adminconfig import parse_admin_config
from gpusched.db import jobs, submit
from gpusched.db.admin import apply_config, plan_changes
from gpusched.db.engine import make_engine, make_sessionmaker, psycopg_dsn
from gpusched.db.licenses import license_usage
from gpusched.db.models import Job, License, Partition
from gpusched.db.notify import open_listener, received
from gpusched.db.schedule import load_snapshot
from gpusched.errors import UsageError

ALICE = jobs.Identity(1000, 1000)
BODY = {"script": "#!/bin/sh\n", "work_dir": "/tmp", "gpus": 0}


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    e = make_engine(db_url, pool_size=2)
    yield e
    e.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    made = make_sessionmaker(engine)
    with made() as s, s.begin():
        s.add(Partition(name="gpu", nodes=["*"], is_default=True))
    return made


def licenses(**counts: int) -> Any:
    return parse_admin_config([("lic.toml", {"licenses": counts})])


def stored(sessions: sessionmaker[Session]) -> dict[str, int]:
    with sessions() as s:
        return {lic.name: lic.count for lic in s.scalars(select(License))}


def test_apply_stores_the_complete_set_and_shows_the_changes(
        sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        assert plan_changes(s, licenses(matlab=1, ansys=4)) == [
            "+ license matlab (count 1)", "+ license ansys (count 4)"]
        apply_config(s, licenses(matlab=1, ansys=4))
    assert stored(sessions) == {"matlab": 1, "ansys": 4}
    with sessions() as s, s.begin():
        assert plan_changes(s, licenses(matlab=3)) == ["~ license matlab: count 1 -> 3",
                                                       "- license ansys"]
        apply_config(s, licenses(matlab=3))
    assert stored(sessions) == {"matlab": 3}
    # A file without a [licenses] table leaves them as they are.
    with sessions() as s, s.begin():
        apply_config(s, parse_admin_config([("q.toml", {"qos": [{"name": "normal"}]})]))
    assert stored(sessions) == {"matlab": 3}


def test_writing_licenses_sends_the_admin_notify(
        db_url: str, sessions: sessionmaker[Session]) -> None:
    with open_listener(psycopg_dsn(db_url)) as conn:
        with sessions() as s, s.begin():
            apply_config(s, licenses(matlab=1))
        deadline = time.monotonic() + 10
        heard: list[str] = []
        while "admin" not in heard and time.monotonic() < deadline:
            heard += list(received(conn, 0.2))
        assert "admin" in heard


def test_a_refused_submission_stores_nothing(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        apply_config(s, licenses(matlab=1))
    for asked, words in (("matlab:2", "more than the cluster's 1 matlab license"),
                         ("comsol", "no license 'comsol'"), ("a|b", "'|'")):
        with sessions() as s, s.begin():
            with pytest.raises(UsageError) as err:
                submit.submit_job(s, {**BODY, "licenses": asked}, ALICE)
            assert words in err.value.message
        with sessions() as s:
            assert s.scalar(select(func.count()).select_from(Job)) == 0


def test_the_snapshot_and_the_usage_carry_licenses(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        apply_config(s, licenses(matlab=2, ansys=1))
    with sessions() as s, s.begin():
        first = submit.submit_job(s, {**BODY, "licenses": "matlab,ansys"}, ALICE).id
        second = submit.submit_job(s, {**BODY, "licenses": "matlab:2"}, ALICE).id
        plain = submit.submit_job(s, BODY, ALICE).id
    with sessions() as s, s.begin():
        assert s.get(Job, first).licenses == "ansys:1,matlab:1"  # type: ignore[union-attr]
        snapshot, _ = load_snapshot(s)
    assert dict(snapshot.licenses) == {"matlab": 2, "ansys": 1}
    asked = {job.job_id: job.licenses for job in snapshot.pending}
    assert asked == {first: (("ansys", 1), ("matlab", 1)), second: (("matlab", 2),),
                     plain: ()}
    # A running job (as a pass leaves it) holds its licenses in the usage listing.
    with sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id == first).values(state="RUNNING"))
        use = {u.name: (u.total, u.used, u.free) for u in license_usage(s)}
    assert use == {"ansys": (1, 1, 0), "matlab": (2, 1, 1)}


def test_the_database_holds_the_bounds(sessions: sessionmaker[Session]) -> None:
    for statement in ("INSERT INTO licenses (name, count) VALUES ('x', -1)",
                      "UPDATE jobs SET licenses = repeat('a', 5000)"):
        with sessions() as s, s.begin():
            submit.submit_job(s, BODY, ALICE)
        with pytest.raises(IntegrityError):
            with sessions() as s, s.begin():
                s.execute(text(statement))
