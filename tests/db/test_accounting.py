"""Accounting against a real database: GPU-hours from allocations, billed by type, cut
to a report's window, every run of a requeued job counted."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from gpusched.db import accounting
from gpusched.db.models import Allocation, GpuBilling, Job
from tests.db.node import node_sessions, start_on

T0 = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    with node_sessions(db_url, [{"index": 0, "uuid": "GPU-0", "type": "a100-80gb"},
                                {"index": 1, "uuid": "GPU-1", "type": "a100-80gb"},
                                {"index": 2, "uuid": "GPU-2", "type": "l4"}]) as factory:
        with factory() as s, s.begin():
            s.add(GpuBilling(gpu_type="a100-80gb", weight=2.0))
        yield factory


def _ran(sessions: sessionmaker[Session], uuids: tuple[str, ...], hours: tuple[float, float]) -> int:
    """A job that held ``uuids`` from T0 + hours[0] to T0 + hours[1] and completed."""
    job_id = start_on(sessions, uuids, gpus=len(uuids))
    begin, end = T0 + timedelta(hours=hours[0]), T0 + timedelta(hours=hours[1])
    with sessions() as s, s.begin():
        s.execute(update(Allocation).where(Allocation.job_id == job_id)
                  .values(allocated_at=begin, released_at=end))
        s.execute(update(Job).where(Job.id == job_id).values(
            state="COMPLETED", submit_time=begin, start_time=begin, end_time=end, exit_code=0))
    return job_id


def test_gpu_hours_billed_by_type_and_cut_to_the_window(sessions: sessionmaker[Session]) -> None:
    both = _ran(sessions, ("GPU-0", "GPU-2"), (0, 3))  # 3 h on an A100 (x2) and an L4
    small = _ran(sessions, ("GPU-2",), (4, 5))
    with sessions() as s:
        records = {r["job_id"]: r for r in accounting.job_records(s, start=T0)}
        report = accounting.usage_report(s, T0 + timedelta(hours=2), T0 + timedelta(hours=10))
    assert records[both]["gpu_hours"] == pytest.approx(6.0)
    assert records[both]["billed_gpu_hours"] == pytest.approx(3 * 2.0 + 3 * 1.0)
    assert records[both]["elapsed_s"] == 3 * 3600
    assert records[small]["gpu_hours"] == pytest.approx(1.0)
    # From hour 2: 1 h of the first job on both GPUs (billed 3) and the whole second.
    assert report == [{"account": None, "user": records[both]["user"], "jobs": 2,
                       "gpu_hours": pytest.approx(3.0), "billed_gpu_hours": pytest.approx(4.0)}]


def test_filters_and_window(sessions: sessionmaker[Session]) -> None:
    early = _ran(sessions, ("GPU-0",), (0, 1))
    late = _ran(sessions, ("GPU-2",), (10, 11))
    with sessions() as s:
        after = [r["job_id"] for r in accounting.job_records(s, start=T0 + timedelta(hours=5))]
        before = [r["job_id"] for r in accounting.job_records(s, start=T0, end=T0 + timedelta(hours=5))]
        failed = accounting.job_records(s, states=["FAILED"], start=T0)
        nobody = accounting.job_records(s, users=["nobody"], start=T0)
    assert (after, before, failed, nobody) == ([late], [early], [], [])
