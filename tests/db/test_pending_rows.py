"""The pending queue kept between passes (db/pending_rows.py) against a real database:
after any mix of submits, changes, starts and cancels it reads as the whole queue read
afresh, and it reads in full only the rows that are new or changed."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.core.model import PendingJob
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.jobs import Identity
from gpusched.db.models import Job
from gpusched.db.partitions import sync_partitions
from gpusched.db.pending_rows import PendingRows, read_pending
from gpusched.db.submit import submit_job

ALICE = Identity(1000, 1000, "alice")
QUEUE = 220
BODY = {"script": "#!/bin/sh\ntrue\n", "work_dir": "/tmp/work"}


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url, pool_size=2)
    maker = make_sessionmaker(engine)
    with maker() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),))
    yield maker
    engine.dispose()


def _submit(sessions: sessionmaker[Session], count: int, **fields: object) -> list[int]:
    with sessions() as s, s.begin():
        return [submit_job(s, {**BODY, **fields}, ALICE).id for _ in range(count)]


def _by_id(jobs: tuple[PendingJob, ...]) -> list[PendingJob]:
    return sorted(jobs, key=lambda job: job.job_id)


def _read(sessions: sessionmaker[Session], kept: PendingRows) -> tuple[list[PendingJob], list[PendingJob]]:
    with sessions() as s, s.begin():
        return _by_id(kept.read(s)), _by_id(read_pending(s))


def test_only_new_and_changed_rows_are_read_again(sessions: sessionmaker[Session]) -> None:
    ids = _submit(sessions, 30)
    kept = PendingRows()
    mine, fresh = _read(sessions, kept)
    assert mine == fresh and [j.job_id for j in mine] == ids
    assert kept.last_read == 30

    mine, fresh = _read(sessions, kept)
    assert mine == fresh and kept.last_read == 0  # nothing changed

    with sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id == ids[3]).values(hold="user"))
        s.execute(update(Job).where(Job.id == ids[4]).values(reason="Resources"))
        s.execute(update(Job).where(Job.id == ids[5]).values(state="CANCELLED"))
        s.execute(update(Job).where(Job.id == ids[6]).values(state="RUNNING"))
    added = _submit(sessions, 2, gpus=2)
    mine, fresh = _read(sessions, kept)
    assert mine == fresh
    assert kept.last_read == 4  # two changed, two new; two gone from the queue
    assert {j.job_id: j.hold for j in mine}[ids[3]] == "user"
    assert {j.job_id for j in mine} == (set(ids) - {ids[5], ids[6]}) | set(added)

    kept.drop()
    mine, fresh = _read(sessions, kept)
    assert mine == fresh and kept.last_read == len(fresh)


def test_random_changes_read_as_a_fresh_queue(sessions: sessionmaker[Session]) -> None:
    rng = random.Random(17)
    kept = PendingRows()
    _submit(sessions, QUEUE)
    mine, fresh = _read(sessions, kept)
    assert mine == fresh and kept.last_read == QUEUE
    for _ in range(25):
        with sessions() as s, s.begin():
            pending = list(s.scalars(select(Job.id).where(Job.state == "PENDING")))
            for job_id in rng.sample(pending, min(len(pending), rng.randint(0, 6))):
                change = rng.choice([{"state": "CANCELLED"}, {"hold": "user"}, {"hold": None},
                                     {"reason": "Priority"}, {"time_limit": rng.randint(1, 99)},
                                     {"state": "RUNNING"}, {"admin_priority": rng.choice(
                                         [None, 5.0, 2.5, 1e-7])},
                                     {"begin_time": datetime(2030, 1, 2, 3, 4, 5,
                                                             rng.randrange(10**6), UTC)},
                                     {"expected_start": datetime.fromtimestamp(
                                         rng.uniform(1e9, 2e9), UTC)},
                                     {"expected_start": None}, {"gpu_types": ["a100", "h100"]},
                                     {"nodelist": ["n1", "n2"], "exclude_nodes": ["n3"]},
                                     {"array_tasks": "3-9:2", "array_max_running": 2}])
                s.execute(update(Job).where(Job.id == job_id).values(**change))
        _submit(sessions, rng.randint(0, 3))
        mine, fresh = _read(sessions, kept)
        assert mine == fresh
        assert kept.last_read <= 9
