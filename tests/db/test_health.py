"""GPU health against a real database: a failing GPU or slice leaves service, the job on
it is stopped and then requeued or FAILED, and an admin brings the GPU back."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpusched.db import agents, health, job_views
from gpusched.db.models import Gpu, Job, Partition
from gpusched.db.schedule import load_snapshot
from gpusched.errors import NotFound, UsageError
from tests.db.node import node_sessions, start_on

M = "MIG-00000000-0000-4000-8000-00000000000{}"


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    with node_sessions(db_url, [
            {"index": 0, "uuid": "GPU-0"}, {"index": 1, "uuid": "GPU-1"},
            {"index": 2, "uuid": "GPU-2"},
            {"index": 300, "uuid": M.format(1), "mig_profile": "3g.40gb", "parent": 2},
            {"index": 301, "uuid": M.format(2), "mig_profile": "3g.40gb", "parent": 2}]) as factory:
        yield factory


def _run(sessions: sessionmaker[Session], uuid: str, **body: object) -> int:
    return start_on(sessions, (uuid,), **body)


def _end(sessions: sessionmaker[Session], job_id: int) -> Job:
    with sessions() as s, s.begin():
        assert agents.record_end(s, job_id, {"node": "n1", "outcome": "cancelled",
                                             "signal": 15, "end_time": 1e9})
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.expunge(job)
        return job


def _healthy(sessions: sessionmaker[Session]) -> dict[str, bool]:
    with sessions() as s:
        return dict(s.execute(select(Gpu.uuid, Gpu.healthy)).all())  # type: ignore[arg-type]


def test_a_failed_gpu_stops_its_job_which_is_requeued(sessions: sessionmaker[Session]) -> None:
    job_id = _run(sessions, "GPU-1")
    with sessions() as s, s.begin():
        stopping = health.report_faults(s, "n1", {"faults": [{"uuid": "GPU-1", "reason": "Xid 79"}]})
    assert stopping == {"n1"}
    assert _healthy(sessions)["GPU-1"] is False and _healthy(sessions)["GPU-0"] is True
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.cancel_requested_at is not None
        assert job.gpu_failure == "GPU n1:1 (GPU-1) failed: Xid 79"
        gpu = s.scalars(select(Gpu).where(Gpu.uuid == "GPU-1")).one()
        assert (gpu.health_reason, gpu.unhealthy_at is not None) == ("Xid 79", True)
        snapshot, _ = load_snapshot(s)
    views = {g.uuid: g.healthy for n in snapshot.nodes for g in n.gpus}
    assert views["GPU-1"] is False  # the scheduler no longer offers it
    ended = _end(sessions, job_id)
    assert (ended.state, ended.restarts, ended.gpu_failure) == ("PENDING", 1, None)
    assert ended.error_message == "requeued: GPU n1:1 (GPU-1) failed: Xid 79"


def test_no_requeue_ends_failed_naming_the_gpu(sessions: sessionmaker[Session]) -> None:
    job_id = _run(sessions, "GPU-0", requeue=False)
    with sessions() as s, s.begin():
        health.report_faults(s, "n1", {"faults": [{"uuid": "GPU-0", "reason": "GPU lost"}]})
    ended = _end(sessions, job_id)
    assert (ended.state, ended.error_message) == ("FAILED", "GPU n1:0 (GPU-0) failed: GPU lost")


def test_partition_default_decides_when_the_job_does_not(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        s.execute(update(Partition).values(requeue=False))
    job_id = _run(sessions, "GPU-0")
    other = _run(sessions, "GPU-1", requeue=True)
    with sessions() as s, s.begin():
        health.report_faults(s, "n1", {"faults": [{"uuid": "GPU-0", "reason": "ECC"},
                                                  {"uuid": "GPU-1", "reason": "ECC"}]})
    assert _end(sessions, job_id).state == "FAILED"
    assert _end(sessions, other).state == "PENDING"


def test_a_failed_slice_is_only_itself_and_a_failed_parent_takes_its_slices(
        sessions: sessionmaker[Session]) -> None:
    on_slice = _run(sessions, M.format(2))
    with sessions() as s, s.begin():
        health.report_faults(s, "n1", {"faults": [{"uuid": M.format(1), "reason": "Xid 94"}]})
    states = _healthy(sessions)
    assert (states[M.format(1)], states[M.format(2)], states["GPU-2"]) == (False, True, True)
    with sessions() as s:
        assert s.get(Job, on_slice).gpu_failure is None  # type: ignore[union-attr]
    with sessions() as s, s.begin():
        health.report_faults(s, "n1", {"faults": [{"uuid": "GPU-2", "reason": "GPU lost"}]})
    assert not any(_healthy(sessions)[u] for u in ("GPU-2", M.format(1), M.format(2)))
    with sessions() as s:
        assert "GPU n1:2" in (s.get(Job, on_slice).gpu_failure or "")  # type: ignore[union-attr]
    with sessions() as s, s.begin():
        assert health.resume_gpu(s, "n1", 2)["uuid"] == "GPU-2"
    assert all(_healthy(sessions)[u] for u in ("GPU-2", M.format(1), M.format(2)))


def test_bad_reports_change_nothing(sessions: sessionmaker[Session]) -> None:
    for body in [{"faults": [{"uuid": "GPU-0", "reason": "x"}, {"uuid": "GPU-9", "reason": "x"}]},
                 {"faults": "GPU-0"}, {"faults": [{"uuid": "GPU-0"}]}]:
        with pytest.raises(UsageError), sessions() as s, s.begin():
            health.report_faults(s, "n1", body)
    assert all(_healthy(sessions).values())
    with pytest.raises(NotFound), sessions() as s, s.begin():
        health.report_faults(s, "n9", {"faults": []})
    with pytest.raises(NotFound), sessions() as s, s.begin():
        health.resume_gpu(s, "n1", 7)


def test_a_clean_period_returns_gpus(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        health.report_faults(s, "n1", {"faults": [{"uuid": "GPU-0", "reason": "too hot"}]})
    with sessions() as s, s.begin():
        assert health.resume_after(s, 3600) == []
        s.execute(update(Gpu).where(Gpu.uuid == "GPU-0")
                  .values(unhealthy_at=datetime.now(UTC) - timedelta(hours=2)))
    with sessions() as s, s.begin():
        assert health.resume_after(s, 3600) == ["GPU-0"]
    assert _healthy(sessions)["GPU-0"] is True


def _sample(sessions: sessionmaker[Session], idle_after: float = 3600, **utils: int) -> list[int]:
    gpus = [{"uuid": uuid.replace("_", "-"), "util": util, "mem_used_mb": util * 100,
             "temperature": 40, "power_mw": 50000} for uuid, util in utils.items()]
    with sessions() as s, s.begin():
        return health.record_samples(s, "n1", {"gpus": gpus}, 1.0, idle_after)


def test_samples_roll_up_into_the_jobs_holding_the_gpus(sessions: sessionmaker[Session]) -> None:
    job_id = _run(sessions, "GPU-0")
    on_slice = _run(sessions, M.format(1))
    _sample(sessions, GPU_0=50, GPU_2=10)
    _sample(sessions, GPU_0=100, GPU_2=30)
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.util_samples == 2
        body = job_views.job_json(job, None, False)
        assert (body["gpu_util_avg"], body["gpu_util_peak"]) == (75.0, 100)
        assert (body["gpu_mem_avg_mb"], body["gpu_mem_peak_mb"]) == (7500.0, 10000)
        sliced = s.get(Job, on_slice)
        assert sliced is not None  # a slice is charged its parent GPU's sample
        assert (sliced.util_samples, sliced.util_peak) == (2, 30)
        gpu = s.scalars(select(Gpu).where(Gpu.uuid == "GPU-2")).one()
        assert (gpu.util, gpu.mem_used_mb, gpu.sampled_at is not None) == (30, 3000, True)


def test_a_job_idle_long_enough_is_flagged_and_work_clears_it(
        sessions: sessionmaker[Session]) -> None:
    job_id = _run(sessions, "GPU-0")
    assert _sample(sessions, idle_after=0.2, GPU_0=0) == []
    with sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id == job_id)
                  .values(idle_since=datetime.now(UTC) - timedelta(seconds=1)))
    assert _sample(sessions, idle_after=0.2, GPU_0=1) == [job_id]
    with sessions() as s:
        assert job_views.job_json(s.get(Job, job_id), None, False)["idle"] is True  # type: ignore[arg-type]
    _sample(sessions, idle_after=0.2, GPU_0=60)
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None and (job.idle, job.idle_since) == (False, None)


def test_bad_samples_are_refused(sessions: sessionmaker[Session]) -> None:
    for body in [{"gpus": "x"}, {"gpus": [{"uuid": "GPU-0", "util": "high", "mem_used_mb": 0,
                                           "temperature": 1, "power_mw": 1}]},
                 {"gpus": [{"uuid": "GPU-0", "util": -1, "mem_used_mb": 0, "temperature": 1,
                            "power_mw": 1}]}]:
        with pytest.raises(UsageError), sessions() as s, s.begin():
            health.record_samples(s, "n1", body, 1.0, 60)
