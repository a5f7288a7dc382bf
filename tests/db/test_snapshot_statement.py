"""The pass's snapshot, read in one statement (db/schedule.py), against a real database:
what it says of nodes, GPUs, links, running jobs and usage is what their rows say; a
start whose GPU is gone rolls the whole pass back."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.core.model import NodeState, Plan, Start
from gpusched.core.topology import link_rank
from gpusched.db import agents, jobs, submit
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.models import Allocation, FairShareUsage, Gpu, Job, NodeCommand
from gpusched.db.partitions import sync_partitions
from gpusched.db.schedule import apply_plan, load_snapshot

ALICE = jobs.Identity(1000, 1000)


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url, pool_size=2)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),))
        for n, kind in ((1, "a100"), (2, "h100")):
            agents.register_node(s, {
                "node": f"n{n}", "uid": 0, "cpus": 16 * n, "memory_mb": 1000 * n,
                "block": "b1" if n == 1 else None,
                "gpus": [{"index": i, "uuid": f"G-{n}-{i}", "type": kind} for i in range(3)]
                + ([{"index": 100, "uuid": "MIG-1-0", "parent": 0, "mig_profile": "1g.10gb"}]
                   if n == 1 else []),
                "links": [{"a": 2, "b": 0, "kind": "NVLINK", "nvlinks": 12},
                          {"a": 1, "b": 2, "kind": "PCIE_SWITCH"}]})
        # A GPU gone from n2: no longer offered, nor its links.
        agents.register_node(s, {"node": "n2", "uid": 0, "gpus": [
            {"index": i, "uuid": f"G-2-{i}", "type": "h100"} for i in range(2)],
            "links": [{"a": 0, "b": 1, "kind": "SYSTEM"}]})
    yield factory
    engine.dispose()


def _submit(sessions: sessionmaker[Session], **body: object) -> int:
    with sessions() as s, s.begin():
        return submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", **body},
                                 ALICE).id


def _start(sessions: sessionmaker[Session], start: Start) -> set[str]:
    with sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        return apply_plan(s, snapshot, Plan(starts=(start,)), node_ids)


def test_the_snapshot_says_what_the_rows_say(sessions: sessionmaker[Session]) -> None:
    limited = _submit(sessions, gpus=2, time_limit=60)
    stopping = _submit(sessions, gpus=1)
    _start(sessions, Start(limited, "n1", ("G-1-2", "G-1-0")))
    _start(sessions, Start(stopping, "n2", ("G-2-1",)))
    preempted = datetime(2031, 5, 6, 7, 8, 9, 123457, UTC)
    with sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id == stopping).values(preempted_at=preempted))
        s.execute(update(Job).where(Job.id == limited).values(
            start_time=datetime(2031, 5, 6, 7, 0, 0, 999999, UTC)))
        s.add_all([FairShareUsage(user_name="alice", account="lab", usage=2.0,
                                  updated_at=datetime.now(UTC)),
                   FairShareUsage(user_name="bob", account="lab", usage=1 / 3,
                                  updated_at=datetime.now(UTC))])
    with sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s, preempt_grace=30.0)
        rows = {job.id: job for job in s.scalars(select(Job))}
        gpu_ids = dict(s.execute(select(Gpu.uuid, Gpu.id)).all())
    assert list(node_ids) == ["n1", "n2"]
    n1, n2 = snapshot.nodes
    assert (n1.name, n1.state, n1.cpus, n1.memory_mb, n1.block) == ("n1", NodeState.UP, 16,
                                                                    1000, "b1")
    assert [(g.uuid, g.index, g.gpu_type, g.mig_profile, g.parent, g.mig_mode)
            for g in n1.gpus] == [
        ("G-1-0", 0, "a100", None, None, True), ("G-1-1", 1, "a100", None, None, False),
        ("G-1-2", 2, "a100", None, None, False), ("MIG-1-0", 100, "gpu", "1g.10gb", 0, False)]
    assert n1.links == {(0, 2): link_rank("NVLINK", 12), (1, 2): link_rank("PCIE_SWITCH", 0)}
    assert [g.uuid for g in n2.gpus] == ["G-2-0", "G-2-1"] and "G-2-2" in gpu_ids
    assert n2.links == {(0, 1): link_rank("SYSTEM", 0)}
    running = {job.job_id: job for job in snapshot.running}
    start = rows[limited].start_time
    assert start is not None
    assert running[limited].gpu_uuids == ("G-1-0", "G-1-2")  # in index order
    assert running[limited].start_time == start.timestamp()
    assert running[limited].end_time == start.timestamp() + 60
    assert not running[limited].preempting
    assert running[stopping].end_time == preempted.timestamp() + 30.0
    assert running[stopping].preempting and running[stopping].node == "n2"
    assert snapshot.usage == {("alice", "lab"): 2.0, ("bob", "lab"): 1 / 3}
    assert all(type(v) is float for v in snapshot.usage.values())
    assert snapshot.pending == ()


def test_a_start_whose_gpu_is_gone_rolls_the_pass_back(sessions: sessionmaker[Session]) -> None:
    job_id = _submit(sessions, gpus=2)
    with pytest.raises(LookupError):
        _start(sessions, Start(job_id, "n1", ("G-1-0", "G-9-9")))
    with sessions() as s:
        assert s.scalar(select(Job.state).where(Job.id == job_id)) == "PENDING"
        assert s.scalar(select(func.count()).select_from(Allocation)) == 0
        assert s.scalar(select(func.count()).select_from(NodeCommand)) == 0
    assert _start(sessions, Start(job_id, "n1", ("G-1-0", "G-1-1"))) == {"n1"}


def test_pending_times_read_back_to_the_microsecond(
        sessions: sessionmaker[Session]) -> None:
    waiting = _submit(sessions, gpus=1)
    at = datetime.now(UTC) + timedelta(hours=1, microseconds=7)
    with sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id == waiting).values(expected_start=at,
                                                              begin_time=at))
    with sessions() as s, s.begin():
        snapshot, _ = load_snapshot(s)
    (job,) = snapshot.pending
    assert job.expected_start == at.timestamp() and job.begin_time == at.timestamp()
