"""Shares of GPUs through the database: a pass over jobs asking for MPS shares stores
allocations with their units and memory, the next snapshot sees them as shares of a
GPU held by its carrier, and the launch orders carry each job's share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.core.model import Policy
from gpusched.core.plan import plan
from gpusched.db import agents, commands, jobs, submit
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.models import Allocation, Gpu, Job, Node, Partition
from gpusched.db.partitions import sync_partitions
from gpusched.db.schedule import apply_plan, load_snapshot
from gpusched.messages.agent import ShareGrant

ALICE = jobs.Identity(1000, 1000)


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url, pool_size=2)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),))
        s.execute(update(Partition).values(sharing="mps", shares=100))
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": [
            {"index": i, "uuid": f"GPU-1-{i}", "type": "a100", "memory_mb": 40_000}
            for i in range(2)]})
    yield factory
    engine.dispose()


def _submit(sessions: sessionmaker[Session], **body: object) -> int:
    with sessions() as s, s.begin():
        return submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp",
                                     "time_limit": 600, **body}, ALICE).id


def _pass(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        decided = plan(snapshot, snapshot.pending[0].submit_time + 1 if snapshot.pending
                       else 0.0, Policy())
        apply_plan(s, snapshot, decided, node_ids)


def test_shares_are_allocated_seen_and_launched(sessions: sessionmaker[Session]) -> None:
    first = _submit(sessions, share_mode="mps", share=60)
    second = _submit(sessions, share_mode="mps", share=40, gpu_mem_mb=10_000)
    _pass(sessions)
    whole = _submit(sessions, gpus=2)
    # Short enough to end before the two-GPU job's reservation (when 1-0's shares end).
    third = _submit(sessions, share_mode="mps", share=50, time_limit=10)
    _pass(sessions)
    with sessions() as s, s.begin():
        rows = s.execute(select(Allocation.job_id, Gpu.uuid, Allocation.units,
                                Allocation.mem_mb).join(Gpu, Gpu.id == Allocation.gpu_id)
                         .order_by(Allocation.job_id)).all()
        states = dict(s.execute(select(Job.id, Job.state)).all())
        snapshot, _ = load_snapshot(s)
        node = s.scalars(select(Node)).one()
        orders = {c.job_id: c.payload for c in commands.claim(s, node)}
    # Two shares fill GPU 1-0 (best fit keeps 1-1 whole); the two-GPU job cannot start
    # while a GPU is shared, and the third share backfills on 1-1.
    assert rows == [(first, "GPU-1-0", 60, 24_000), (second, "GPU-1-0", 40, 10_000),
                    (third, "GPU-1-1", 50, 20_000)]
    assert states[whole] == "PENDING"
    running = {job.job_id: job for job in snapshot.running}
    assert running[first].shares == (("GPU-1-0", 60, 24_000),)
    assert running[first].gpu_uuids == ()
    assert all(gpu.sharing == "mps" and gpu.shares == 100 and gpu.memory_mb == 40_000
               for gpu in snapshot.nodes[0].gpus)
    assert orders[first].share == ShareGrant("mps", "GPU-1-0", 60, 100, 24_000)
    assert orders[second].share == ShareGrant("mps", "GPU-1-0", 40, 100, 10_000)
    assert orders[first].gpu_uuids == ("GPU-1-0",)
    # A third pass starts nothing more: GPU 1-0 is full and 1-1 has 50 units left,
    # which the whole-GPU job cannot use.
    _pass(sessions)
    with sessions() as s:
        assert s.scalar(select(Job.state).where(Job.id == whole)) == "PENDING"
        assert len(s.execute(select(Allocation.job_id)).all()) == 3


def test_a_gpu_memory_job_on_an_mps_share_is_launched_with_it(
        sessions: sessionmaker[Session]) -> None:
    job = _submit(sessions, gpu_mem_mb=10_000)
    _pass(sessions)
    with sessions() as s, s.begin():
        node = s.scalars(select(Node)).one()
        orders = {c.job_id: c.payload for c in commands.claim(s, node)}
    assert orders[job].share == ShareGrant("mps", "GPU-1-0", 25, 100, 10_000)


def test_a_gpu_memory_job_of_another_partition_gets_the_units_of_the_sharing_one(
        sessions: sessionmaker[Session]) -> None:
    # Partition "whole" (exclusive, first by name would be "gpu") over the same node:
    # its memory-only job gets an MPS share of a GPU that partition "gpu" shares by 100
    # units, and its launch order says so.
    with sessions() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True), PartitionConfig("whole")))
        s.execute(update(Partition).where(Partition.name == "gpu").values(sharing="mps",
                                                                          shares=100))
    job = _submit(sessions, gpu_mem_mb=20_000, partition="whole")
    _pass(sessions)
    with sessions() as s, s.begin():
        node = s.scalars(select(Node)).one()
        orders = {c.job_id: c.payload for c in commands.claim(s, node)}
    assert orders[job].share == ShareGrant("mps", "GPU-1-0", 50, 100, 20_000)
