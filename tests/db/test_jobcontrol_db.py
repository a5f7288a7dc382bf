"""Job control against a real database: array task references (resolved, split off,
listed), suspend and resume (who may, the commands, the time not counted), ``top``
(the queue order it gives), and ``update`` of pending and running jobs with Slurm's
rules; a refused change stores nothing."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.core.arrays import fold
from gpusched.core.jobcontrol import JobRef, task_in
from gpusched.core.model import Policy
from gpusched.core.plan import plan, queue_order
from gpusched.db import (
    accounting,
    agents,
    health,
    job_views,
    jobcontrol,
    jobupdate,
    steps,
)
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.models import Job, NodeCommand
from gpusched.db.partitions import sync_partitions
from gpusched.db.schedule import apply_plan, load_snapshot
from gpusched.errors import Conflict, NotFound, PermissionDenied, UsageError
from gpusched.messages.steps import StepRequest
from tests.db.test_transitions import ALICE, BOB, ROOT, _submit


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    """Partitions ``gpu`` (the default) and ``short`` (an hour at most), node ``n1``
    with two GPUs."""
    engine = make_engine(db_url, pool_size=2)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),
                            PartitionConfig("short", max_time=3600)))
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": [
            {"index": i, "uuid": f"GPU-{i}"} for i in range(2)]})
    yield factory
    engine.dispose()


def _pass(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        apply_plan(s, snapshot, plan(snapshot, time.time(), Policy()), node_ids)


def _job(sessions: sessionmaker[Session], job_id: int) -> dict[str, Any]:
    with sessions() as s:
        return job_views.get_job(s, job_id, ROOT)


def _listed(sessions: sessionmaker[Session], **query: str) -> list[int]:
    with sessions() as s:
        return [j["job_id"] for j in job_views.list_jobs(s, query)["jobs"]]


def test_task_membership_in_sql_matches_the_core(sessions: sessionmaker[Session]) -> None:
    rng = random.Random(22)
    cases = []
    for _ in range(300):
        ids = sorted(rng.sample(range(60), rng.randint(1, 25)))
        cases.append((fold(ids), rng.randint(0, 62)))
    with sessions() as s:
        answers = s.execute(text(
            "SELECT gpusched_task_in(t, n) FROM unnest(CAST(:ts AS text[]), "
            "CAST(:ns AS integer[])) WITH ORDINALITY AS c(t, n, i) ORDER BY i"),
            {"ts": [t for t, _ in cases], "ns": [n for _, n in cases]}).scalars().all()
        assert s.scalar(text("SELECT gpusched_task_in(NULL, 1)")) is False
    assert answers == [task_in(t, n) for t, n in cases]


def test_task_references_resolve_split_and_list(sessions: sessionmaker[Session]) -> None:
    array = _submit(sessions, gpus=1, array="0-3")
    with sessions() as s, s.begin():
        assert jobcontrol.resolve_ref(s, JobRef(array, 2)) == array  # a look: nothing split
        assert jobcontrol.resolve_ref(s, JobRef(array, 2), BOB) == array  # not his to split
        with pytest.raises(NotFound, match=f"{array}_7"):
            jobcontrol.resolve_ref(s, JobRef(array, 7), ALICE)
    assert _listed(sessions, ids=f"{array}_2") == [array]
    assert _listed(sessions, ids=f"{array}_9") == []
    with sessions() as s, s.begin():
        task = jobcontrol.resolve_ref(s, JobRef(array, 2), ALICE)
    assert task != array
    with sessions() as s, s.begin():
        assert jobcontrol.resolve_ref(s, JobRef(array, 2), ALICE) == task  # found, not split again
    record, split = _job(sessions, array), _job(sessions, task)
    assert (record["array_tasks"], split["array_task_id"], split["state"]) == ("0-1,3", 2, "PENDING")
    assert split["display_id"] == f"{array}_2"
    assert _listed(sessions, ids=f"{array}_2") == [task]
    assert _listed(sessions, ids=f"{array}_3,{array}_2") == [array, task]
    assert _listed(sessions, ids=str(array)) == [array, task]
    with pytest.raises(UsageError, match="invalid job id"):
        _listed(sessions, ids=f"{array}_x")
    # Started tasks have rows of their own; a task started or split is not in the record.
    _pass(sessions)
    with sessions() as s, s.begin():
        started = s.scalar(select(Job.id).where(Job.array_job_id == array,
                                                Job.array_task_id == 0))
        assert jobcontrol.resolve_ref(s, JobRef(array, 0)) == started


def _running(sessions: sessionmaker[Session], launched: bool = True, **body: object) -> int:
    """A job started by a pass and (``launched``) confirmed by its node's agent."""
    job_id = _submit(sessions, **{"gpus": 1, **body})
    _pass(sessions)
    assert _job(sessions, job_id)["state"] == "RUNNING"
    if launched:
        with sessions() as s, s.begin():
            s.execute(update(Job).where(Job.id == job_id).values(launched_at=func.now()))
    return job_id


def _commands(sessions: sessionmaker[Session], job_id: int, kind: str) -> list[dict[str, Any]]:
    with sessions() as s:
        return list(s.scalars(select(NodeCommand.payload).where(
            NodeCommand.job_id == job_id, NodeCommand.kind == kind).order_by(NodeCommand.id)))


def test_suspend_and_resume(sessions: sessionmaker[Session]) -> None:
    job_id = _running(sessions, time_limit=600)
    pending = _submit(sessions, gpus=2)
    with sessions() as s, s.begin():
        with pytest.raises(PermissionDenied, match="only an administrator"):
            jobcontrol.suspend_job(s, job_id, ALICE, True)
        with pytest.raises(Conflict, match="PENDING: only a running job"):
            jobcontrol.suspend_job(s, pending, ROOT, True)
        with pytest.raises(Conflict, match="not suspended"):
            jobcontrol.suspend_job(s, job_id, ROOT, False)
    assert _commands(sessions, job_id, "suspend") == []
    began = datetime.now(UTC) - timedelta(seconds=100)
    with sessions() as s, s.begin():
        _, nodes = jobcontrol.suspend_job(s, job_id, ROOT, True, began)
    assert nodes == {"n1"}
    shown = _job(sessions, job_id)
    assert shown["state"] == "SUSPENDED" and shown["suspended_at"] is not None
    assert _listed(sessions, state="SUSPENDED") == [job_id]
    assert job_id not in _listed(sessions, state="RUNNING")
    with sessions() as s:
        assert job_views.job_list_json(s, {"state": "SUSPENDED"}) is not None
        stored = s.get(Job, job_id)
        assert stored is not None and stored.state == "RUNNING"  # its GPUs stay held
        snapshot, _ = load_snapshot(s)
    held = next(r for r in snapshot.running if r.job_id == job_id)
    assert held.end_time is not None and held.start_time is not None
    assert held.end_time - held.start_time >= 600 + 99  # the time suspended is not counted
    with sessions() as s, s.begin():
        with pytest.raises(Conflict, match="already suspended"):
            jobcontrol.suspend_job(s, job_id, ROOT, True)
        with pytest.raises(Conflict, match="suspended: no new steps"):
            steps.create_step(s, job_id, StepRequest.parse(
                {"argv": ["true"], "work_dir": "/tmp",
                 "io": {"host": "127.0.0.1", "port": 45_000, "token": "0f" * 32}}), ALICE)
    with sessions() as s, s.begin():
        jobcontrol.suspend_job(s, job_id, ROOT, False, began + timedelta(seconds=40))
    resumed = _job(sessions, job_id)
    assert resumed["state"] == "RUNNING" and resumed["suspended_seconds"] == 40
    sent = _commands(sessions, job_id, "suspend")
    assert [c["suspend"] for c in sent] == [True, False]
    assert sent[1]["time_limit"] == 640
    assert sent[1]["deadline"] == pytest.approx(
        datetime.fromisoformat(resumed["start_time"]).timestamp() + 640, abs=1)


def test_a_job_is_suspended_only_once_its_node_has_started_it(
        sessions: sessionmaker[Session]) -> None:
    job_id = _running(sessions, launched=False)
    with sessions() as s, s.begin():
        with pytest.raises(Conflict, match="still starting"):
            jobcontrol.suspend_job(s, job_id, ROOT, True)
    assert _commands(sessions, job_id, "suspend") == [] and _job(sessions, job_id)[
        "suspended_at"] is None
    with sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id == job_id).values(launched_at=func.now()))
    with sessions() as s, s.begin():
        jobcontrol.suspend_job(s, job_id, ROOT, True)
    assert len(_commands(sessions, job_id, "suspend")) == 1


def test_top_moves_a_job_ahead_of_its_owners_others(sessions: sessionmaker[Session]) -> None:
    blocker = _running(sessions, gpus=2)
    first, bob, second, third = (_submit(sessions, gpus=1), _submit(sessions, BOB, gpus=1),
                                 _submit(sessions, gpus=1), _submit(sessions, gpus=1))

    def order() -> list[int]:
        with sessions() as s:
            snapshot, _ = load_snapshot(s)
        return [j.job_id for j in queue_order(snapshot, time.time(), Policy())]

    assert order() == [first, bob, second, third]
    with sessions() as s, s.begin():
        with pytest.raises(PermissionDenied):
            jobcontrol.top_jobs(s, [third], BOB)
        with pytest.raises(Conflict, match="only pending"):
            jobcontrol.top_jobs(s, [blocker], ROOT)
        jobcontrol.top_jobs(s, [third], ALICE)
    assert order() == [third, bob, first, second]  # Bob keeps his place
    with sessions() as s, s.begin():
        jobcontrol.top_jobs(s, [second, first], ALICE)
    assert order() == [second, bob, first, third]


def _update(sessions: sessionmaker[Session], job_id: int, who: Any, **body: Any) -> set[str]:
    with sessions() as s, s.begin():
        return jobupdate.update_job(s, job_id, who, body)[1]


def test_update_of_a_pending_job(sessions: sessionmaker[Session]) -> None:
    other = _submit(sessions, gpus=1)
    job_id = _submit(sessions, gpus=1, time_limit=7200, name="before")
    _update(sessions, job_id, ALICE, name="after", dependency=f"afterok:{other}", nodes=1,
            gpus_per_node=2, time_limit=3600, partition="short")
    job = _job(sessions, job_id)
    assert (job["name"], job["dependency"], job["gpus"], job["time_limit"], job["partition"]) \
        == ("after", f"afterok:{other}", 2, 3600, "short")
    before = _job(sessions, job_id)
    for who, body, error, words in (
            (ALICE, {"time_limit": 7200}, UsageError, "MaxTime"),  # short's hour
            (ALICE, {"partition": "gpu", "time_limit": 7200}, PermissionDenied, "raise"),
            (ALICE, {"priority": 5}, PermissionDenied, "priority"),
            (ALICE, {"nice": -1}, PermissionDenied, "negative nice"),
            (BOB, {"name": "mine"}, PermissionDenied, "belongs to"),
            (ALICE, {"gpus_per_node": 3}, UsageError, "no node"),
            (ALICE, {"dependency": "afterok:99999"}, UsageError, "99999 does not exist"),
            (ALICE, {"dependency": f"afterok:{job_id}"}, UsageError, "itself"),
            (ALICE, {"partition": "nosuch"}, UsageError, "invalid partition"),
            (ALICE, {"qos": "nosuch"}, UsageError, "qos"),
            (ALICE, {"nodes": 0}, UsageError, "nodes"),
            (ALICE, {"colour": "red"}, UsageError, "unknown: colour"),
            (ALICE, {"name": None}, UsageError, "name"),
            # -C's counts checked against the job's own shape, as at submit
            (ALICE, {"constraint": "a100*2"}, UsageError, "constraint: its counts name 2"),
            (ALICE, {"constraint": "a100&&"}, UsageError, "constraint")):
        with pytest.raises(error, match=words):
            _update(sessions, job_id, who, **body)
        assert _job(sessions, job_id) == before, body
    _update(sessions, job_id, ROOT, partition="gpu", time_limit=9000, priority=5, nice=-10)
    assert _job(sessions, job_id)["nice"] == -10
    _update(sessions, job_id, ALICE, dependency="", nice=50)
    job = _job(sessions, job_id)
    assert (job["time_limit"], job["admin_priority"], job["dependency"], job["nice"]) == (
        9000, 5.0, None, 50)


def test_update_of_a_running_job(sessions: sessionmaker[Session]) -> None:
    job_id = _running(sessions, time_limit=600)
    with pytest.raises(Conflict, match="only its time limit and name"):
        _update(sessions, job_id, ALICE, partition="short")
    with pytest.raises(PermissionDenied, match="raise"):
        _update(sessions, job_id, ALICE, time_limit=900)
    assert _update(sessions, job_id, ALICE, name="renamed") == set()
    assert _commands(sessions, job_id, "limit") == []
    with sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id == job_id).values(suspended_seconds=30))
    assert _update(sessions, job_id, ALICE, time_limit=300) == {"n1"}
    assert [c["time_limit"] for c in _commands(sessions, job_id, "limit")] == [330]
    with sessions() as s, s.begin():
        jobcontrol.suspend_job(s, job_id, ROOT, True)
    assert _update(sessions, job_id, ROOT, time_limit=1200) == set()  # resume tells it
    assert _job(sessions, job_id)["time_limit"] == 1200


def test_a_suspended_job_is_not_idle(sessions: sessionmaker[Session]) -> None:
    job_id = _running(sessions)
    idle = [{"uuid": f"GPU-{i}", "util": 0, "mem_used_mb": 0, "temperature": 40,
             "power_mw": 50_000} for i in range(2)]
    with sessions() as s, s.begin():
        health.record_samples(s, "n1", {"gpus": idle}, 1.0, 0)
    assert _job(sessions, job_id)["idle_since"] is not None
    with sessions() as s, s.begin():
        jobcontrol.suspend_job(s, job_id, ROOT, True)
    with sessions() as s, s.begin():
        assert health.record_samples(s, "n1", {"gpus": idle}, 1.0, 0) == []
    job = _job(sessions, job_id)
    assert (job["idle_since"], job["idle"], job["gpu_samples"]) == (None, False, 1)


def test_accounting_leaves_out_the_time_suspended(sessions: sessionmaker[Session]) -> None:
    job_id = _running(sessions)
    with sessions() as s, s.begin():  # started 300 s ago, suspended for the last 100
        s.execute(update(Job).where(Job.id == job_id).values(
            start_time=datetime.now(UTC) - timedelta(seconds=300)))
        jobcontrol.suspend_job(s, job_id, ROOT, True, datetime.now(UTC) - timedelta(seconds=100))
    with sessions() as s:
        record = next(r for r in accounting.job_records(s) if r["job_id"] == job_id)
    assert record["state"] == "SUSPENDED"
    assert record["suspended_s"] == pytest.approx(100, abs=5)
    assert record["elapsed_s"] == pytest.approx(200, abs=5)


def test_an_arrays_id_suspends_its_running_tasks(sessions: sessionmaker[Session]) -> None:
    array = _submit(sessions, gpus=1, array="0-2")
    _pass(sessions)  # tasks 0 and 1 start; 2 waits in the record
    with sessions() as s:
        running = list(s.scalars(select(Job.id).where(
            Job.array_job_id == array, Job.state == "RUNNING").order_by(Job.id)))
    assert len(running) == 2
    with sessions() as s, s.begin():  # their node confirms their launch
        s.execute(update(Job).where(Job.id.in_(running)).values(launched_at=func.now()))
    with sessions() as s, s.begin():
        _, nodes = jobcontrol.suspend_jobs(s, array, ROOT, True)
    assert nodes == {"n1"}
    assert [_job(sessions, j)["state"] for j in running] == ["SUSPENDED"] * 2
    assert _job(sessions, array)["state"] == "PENDING"
    with sessions() as s, s.begin():
        with pytest.raises(Conflict, match="PENDING: only a running job"):
            jobcontrol.suspend_jobs(s, array, ROOT, True)  # nothing left to suspend
        jobcontrol.suspend_jobs(s, running[0], ROOT, False)  # one task alone
    assert [_job(sessions, j)["state"] for j in running] == ["RUNNING", "SUSPENDED"]
    with sessions() as s, s.begin():
        jobcontrol.suspend_jobs(s, array, ROOT, False)
    assert [_job(sessions, j)["state"] for j in running] == ["RUNNING"] * 2


def test_suspend_reaches_every_node_of_the_job(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        agents.register_node(s, {"node": "n2", "uid": 0, "gpus": [
            {"index": 0, "uuid": "GPU-n2-0"}]})
    job_id = _running(sessions, gpus=2, nodes=2)
    assert sorted(_job(sessions, job_id)["node_names"]) == ["n1", "n2"]
    with sessions() as s, s.begin():
        _, nodes = jobcontrol.suspend_job(s, job_id, ROOT, True)
    assert nodes == {"n1", "n2"}
    with sessions() as s:
        told = sorted(s.execute(text(
            "SELECT n.name, c.payload->>'suspend' FROM node_commands AS c JOIN nodes AS n "
            "ON n.id = c.node_id WHERE c.job_id = :j AND c.kind = 'suspend'"), {"j": job_id}))
    assert told == [("n1", "true"), ("n2", "true")]
