"""A job submitted held in an open partition, with no dependency, is stored with the
reason a pass would give it (JobHeldUser) and needs no pass; others still do."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.core.model import Policy
from gpusched.core.plan import plan
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.jobs import Identity
from gpusched.db.models import Partition
from gpusched.db.partitions import sync_partitions
from gpusched.db.schedule import load_snapshot
from gpusched.db.submit import needs_pass, submit_job

ALICE = Identity(1000, 1000, "alice")
BODY = {"script": "#!/bin/sh\ntrue\n", "work_dir": "/tmp/work"}


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url, pool_size=2)
    maker = make_sessionmaker(engine)
    with maker() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),
                            PartitionConfig("slow", max_time=3600)))
    yield maker
    engine.dispose()


def _stored(sessions: sessionmaker[Session], **fields: Any) -> tuple[int, str, bool]:
    with sessions() as s, s.begin():
        job = submit_job(s, {**BODY, **fields}, ALICE)
        return job.id, job.reason, needs_pass(job)


def _pass_reasons(sessions: sessionmaker[Session]) -> dict[int, str]:
    with sessions() as s, s.begin():
        snapshot, _ = load_snapshot(s)
    return {p.job_id: p.reason.value for p in plan(snapshot, time.time(), Policy()).pending}


def test_a_held_job_is_stored_with_the_reason_a_pass_gives(
        sessions: sessionmaker[Session]) -> None:
    held, reason, wanted = _stored(sessions, hold=True)
    assert (reason, wanted) == ("JobHeldUser", False)
    limited, reason, wanted = _stored(sessions, hold=True, partition="slow", time_limit=600)
    assert (reason, wanted) == ("JobHeldUser", False)
    after, reason, wanted = _stored(sessions, hold=True, dependency=f"afterok:{held}")
    assert (reason, wanted) == ("None", True)
    plain, reason, wanted = _stored(sessions)
    assert (reason, wanted) == ("None", True)
    reasons = _pass_reasons(sessions)
    assert reasons[held] == reasons[limited] == "JobHeldUser"


def test_a_held_job_in_a_down_partition_needs_a_pass(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        s.execute(update(Partition).where(Partition.name == "gpu").values(state="DOWN"))
    held, reason, wanted = _stored(sessions, hold=True)
    assert (reason, wanted) == ("None", True)
    assert _pass_reasons(sessions)[held] == "PartitionDown"
