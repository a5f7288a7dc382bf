"""Billing shares against a real database: a share of a GPU counts as its units over
the units the GPU offers (times the GPU type's billing weight), a MIG slice and a whole
GPU as one GPU of their type, in accounting records, the usage report and fair-share
usage alike; each figure is worked out by hand from the allocations made."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.core.model import Plan, Start
from gpusched.db import accounting, agents, submit
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.models import (
    Allocation,
    FairShareUsage,
    Gpu,
    GpuBilling,
    Job,
    Partition,
)
from gpusched.db.partitions import sync_partitions
from gpusched.db.schedule import apply_plan, load_snapshot
from gpusched.db.usage import accrue_usage, billed_rates
from tests.db.node import ALICE

T0 = datetime(2026, 11, 1, tzinfo=UTC)
HOUR = 3600.0


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    """n1: GPU-0 (a100, whole), GPU-1 (a100, shared by MPS in 100 units), GPU-2 (a100 in
    MIG mode, one 1g.10gb slice MIG-2-0); n2: GPU-9 (l4, shared as 4 shards). a100s
    bill 2, l4s 1."""
    engine = make_engine(db_url, pool_size=2)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),
                            PartitionConfig("mps", nodes=("n1",)),
                            PartitionConfig("sliced", nodes=("n2",))))
        s.execute(update(Partition).where(Partition.name == "mps").values(sharing="mps", shares=100))
        s.execute(update(Partition).where(Partition.name == "sliced")
                  .values(sharing="shard", shares=4))
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": [
            {"index": 0, "uuid": "GPU-0", "type": "a100", "memory_mb": 40_000},
            {"index": 1, "uuid": "GPU-1", "type": "a100", "memory_mb": 40_000},
            {"index": 2, "uuid": "GPU-2", "type": "a100", "memory_mb": 40_000},
            {"index": 20, "uuid": "MIG-2-0", "type": "a100", "mig_profile": "1g.10gb",
             "parent": 2, "memory_mb": 10_000}]})
        agents.register_node(s, {"node": "n2", "uid": 0, "gpus": [
            {"index": 0, "uuid": "GPU-9", "type": "l4", "memory_mb": 24_000}]})
        s.add_all([GpuBilling(gpu_type="a100", weight=2.0), GpuBilling(gpu_type="l4", weight=1.0)])
    yield factory
    engine.dispose()


def _start(sessions: sessionmaker[Session], node: str, uuids: tuple[str, ...],
           holds: tuple[int, int] | None = None, **body: object) -> int:
    """Submit a job as ALICE (account ``lab``) and start it on ``uuids`` of ``node``, as a
    pass would; ``holds``: the (units, GPU memory MB) of its one GPU it holds."""
    with sessions() as s, s.begin():
        job_id = submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", **body},
                                   ALICE).id
        s.execute(update(Job).where(Job.id == job_id).values(account="lab"))
    shares = () if holds is None else ((uuids[0], *holds),)
    with sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        apply_plan(s, snapshot, Plan(starts=(Start(job_id, node, uuids, shares=shares),)),
                   node_ids)
    return job_id


def _held(sessions: sessionmaker[Session], job_id: int, hours: tuple[float, float | None]) -> None:
    """The job's allocations (and the job) from T0 + hours[0] to T0 + hours[1] (None:
    running still)."""
    begin = T0 + timedelta(hours=hours[0])
    end = None if hours[1] is None else T0 + timedelta(hours=hours[1])
    with sessions() as s, s.begin():
        s.execute(update(Allocation).where(Allocation.job_id == job_id)
                  .values(allocated_at=begin, released_at=end))
        s.execute(update(Job).where(Job.id == job_id).values(
            submit_time=begin, start_time=begin, end_time=end,
            **({} if end is None else {"state": "COMPLETED", "exit_code": 0})))


def test_a_mix_of_whole_gpus_slices_and_shares_bills_what_was_worked_out_by_hand(
        sessions: sessionmaker[Session]) -> None:
    whole = _start(sessions, "n1", ("GPU-0",), gpus=1)
    mig = _start(sessions, "n1", ("MIG-2-0",), gpus=1, gpu_types=["1g.10gb"])
    quarter = _start(sessions, "n1", ("GPU-1",), (25, 10_000), partition="mps",
                     share_mode="mps", share=25)
    most = _start(sessions, "n1", ("GPU-1",), (60, 24_000), partition="mps",
                  share_mode="mps", share=60)
    memory = _start(sessions, "n1", ("GPU-1",), (10, 4_000), partition="mps", gpu_mem_mb=4_000)
    shards = _start(sessions, "n2", ("GPU-9",), (3, 0), partition="sliced",
                    share_mode="shard", share=3)
    for job_id, hours in ((whole, (0, 3)), (mig, (0, 2)), (quarter, (0, 4)), (most, (1, 2)),
                          (memory, (0, 1)), (shards, (0, 2))):
        _held(sessions, job_id, hours)
    # By hand: hours x GPU fraction, then x the type's weight (a100 2, l4 1).
    expected = {whole: (3 * 1.0, 3 * 1.0 * 2), mig: (2 * 1.0, 2 * 1.0 * 2),
                quarter: (4 * 0.25, 4 * 0.25 * 2), most: (1 * 0.6, 1 * 0.6 * 2),
                memory: (1 * 0.1, 1 * 0.1 * 2), shards: (2 * 0.75, 2 * 0.75 * 1)}
    with sessions() as s:
        records = {r["job_id"]: r for r in accounting.job_records(s, start=T0)}
        report = accounting.usage_report(s, T0 + timedelta(hours=1), T0 + timedelta(hours=3))
    assert {j: (pytest.approx(r["gpu_hours"]), pytest.approx(r["billed_gpu_hours"]))
            for j, r in records.items()} == expected
    assert {j: r["alloc_tres"] for j, r in records.items()} == {
        whole: "gres/gpu=1", mig: "gres/gpu:1g.10gb=1", quarter: "gres/mps=25",
        most: "gres/mps=60", memory: "gres/mps=10", shards: "gres/shard=3"}
    assert records[quarter]["alloc"] == [{
        "node": "n1", "gpu_index": 1, "gpu_uuid": "GPU-1", "gpu_type": "a100",
        "mig_profile": None, "share_mode": "mps", "units": 25, "of": 100, "mem_mb": 10_000,
        "fraction": 0.25}]
    assert [(h["of"], h["fraction"]) for h in records[shards]["alloc"]] == [(4, 0.75)]
    assert [(h["mig_profile"], h["units"], h["fraction"]) for h in records[mig]["alloc"]] \
        == [("1g.10gb", None, 1.0)]
    # Hours 1 to 3: whole 2 h (billed 4), MIG 1 h (2), quarter 2 h x 0.25 (1), most
    # 1 h x 0.6 (1.2), memory nothing, shards 1 h x 0.75 (0.75).
    assert report == [{"account": "lab", "user": records[whole]["user"], "jobs": 5,
                       "gpu_hours": pytest.approx(2 + 1 + 0.5 + 0.6 + 0.75),
                       "billed_gpu_hours": pytest.approx(4 + 2 + 1 + 1.2 + 0.75)}]


def test_fair_share_usage_accrues_shares_as_their_fraction(
        sessions: sessionmaker[Session]) -> None:
    whole = _start(sessions, "n1", ("GPU-0",), gpus=1)
    mig = _start(sessions, "n1", ("MIG-2-0",), gpus=1, gpu_types=["1g.10gb"])
    quarter = _start(sessions, "n1", ("GPU-1",), (25, 0), partition="mps",
                     share_mode="mps", share=25)
    shards = _start(sessions, "n2", ("GPU-9",), (1, 0), partition="sliced",
                    share_mode="shard", share=1)
    ended = _start(sessions, "n1", ("GPU-1",), (50, 0), partition="mps",
                   share_mode="mps", share=50)
    for job_id in (whole, mig, quarter, shards):
        _held(sessions, job_id, (0, None))
    _held(sessions, ended, (0, 1))  # released: bills nothing now
    rate = 1 * 2 + 1 * 2 + 0.25 * 2 + 0.25 * 1  # GPUs held now x weight, by hand
    with sessions() as s, s.begin():
        user = s.get(Job, whole).user_name  # type: ignore[union-attr]
        assert billed_rates(s) == {(user, "lab"): pytest.approx(rate)}
        accrue_usage(s, T0, half_life=0)  # first sight: nothing billed yet
        accrue_usage(s, T0 + timedelta(seconds=100), half_life=0)
        usage = s.scalars(select(FairShareUsage.usage)).one()
    assert usage == pytest.approx(100 * rate)


def test_a_share_of_a_partition_that_no_longer_shares_bills_the_whole_gpu(
        sessions: sessionmaker[Session]) -> None:
    """What the GPU offered is read from the partitions as they are now: a partition
    that stopped sharing leaves nothing to divide by, and the share bills as the GPU."""
    quarter = _start(sessions, "n1", ("GPU-1",), (25, 0), partition="mps",
                     share_mode="mps", share=25)
    _held(sessions, quarter, (0, 2))
    with sessions() as s, s.begin():
        before = accounting.job_records(s, ids=[quarter])[0]
        s.execute(update(Partition).where(Partition.name == "mps").values(shares=200))
        halved = accounting.job_records(s, ids=[quarter])[0]
        s.execute(update(Partition).where(Partition.name == "mps")
                  .values(sharing=None, shares=None))
        gone = accounting.job_records(s, ids=[quarter])[0]
    assert [r["gpu_hours"] for r in (before, halved, gone)] == pytest.approx([0.5, 0.25, 2.0])
    assert [r["alloc"][0]["of"] for r in (before, halved, gone)] == [100, 200, None]


def test_every_run_of_a_requeued_share_bills_and_the_latest_is_shown(
        sessions: sessionmaker[Session]) -> None:
    quarter = _start(sessions, "n1", ("GPU-1",), (25, 10_000), partition="mps",
                     share_mode="mps", share=25)
    _held(sessions, quarter, (0, 2))
    with sessions() as s, s.begin():  # its second run: the same share of GPU-0
        gpu, node = s.execute(select(Gpu.id, Gpu.node_id).where(Gpu.uuid == "GPU-0")).one()
        s.add(Allocation(job_id=quarter, gpu_id=gpu, node_id=node, units=25, mem_mb=10_000,
                         allocated_at=T0 + timedelta(hours=3),
                         released_at=T0 + timedelta(hours=4)))
    with sessions() as s:
        record, = accounting.job_records(s, ids=[quarter])
    assert record["gpu_hours"] == pytest.approx(2 * 0.25 + 1 * 0.25)
    assert record["billed_gpu_hours"] == pytest.approx((2 * 0.25 + 1 * 0.25) * 2)
    assert [(h["gpu_uuid"], h["units"], h["of"]) for h in record["alloc"]] == [("GPU-0", 25, 100)]
    assert record["alloc_tres"] == "gres/mps=25"
