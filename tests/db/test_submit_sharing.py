"""Submitting a share of one GPU (--gres=mps:N, shard:N) or GPU memory (--gpu-mem)
against a real database: stored as asked, refused by partitions that do not share GPUs
that way (nothing stored), and moved only to partitions that do."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpusched.db import agents, jobs, jobupdate, submit
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.models import Job, JobScript, Partition
from gpusched.errors import UsageError

ALICE = jobs.Identity(1000, 1000)
ROOT = jobs.Identity(0, 0)


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url, pool_size=2)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        s.add_all([Partition(name="whole", nodes=["*"], is_default=True),
                   Partition(name="mps", nodes=["*"], sharing="mps", shares=100),
                   Partition(name="shard", nodes=["*"], sharing="shard", shares=4)])
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": [
            {"index": 0, "uuid": "GPU-0", "type": "a100-80gb", "memory_mb": 81920},
            {"index": 1, "uuid": "GPU-1", "type": "l4", "memory_mb": 23034}]})
    yield factory
    engine.dispose()


def _submit(sessions: sessionmaker[Session], **body: Any) -> int:
    with sessions() as s, s.begin():
        return submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", **body},
                                 ALICE).id


def _stored(sessions: sessionmaker[Session]) -> tuple[int, int]:
    with sessions() as s:
        return (s.scalar(select(func.count()).select_from(Job)) or 0,
                s.scalar(select(func.count()).select_from(JobScript)) or 0)


def _columns(sessions: sessionmaker[Session], job_id: int) -> tuple[Any, ...]:
    with sessions() as s:
        return tuple(s.execute(select(Job.gpus, Job.share_mode, Job.share_units, Job.gpu_mem_mb,
                                      Job.partition).where(Job.id == job_id)).one())


def test_shares_and_gpu_memory_are_stored_as_asked(sessions: sessionmaker[Session]) -> None:
    mps = _submit(sessions, partition="mps", share_mode="mps", share=50, gpu_mem_mb=20480)
    shard = _submit(sessions, partition="shard", share_mode="shard", share=4)
    memory = _submit(sessions, gpu_mem_mb=40000, gpu_types=["a100"], gpus=1)
    plain = _submit(sessions, gpus=1)
    assert _columns(sessions, mps) == (1, "mps", 50, 20480, "mps")
    assert _columns(sessions, shard) == (1, "shard", 4, None, "shard")
    assert _columns(sessions, memory) == (1, None, None, 40000, "whole")
    assert _columns(sessions, plain) == (1, None, None, None, "whole")
    # Of a partition list, the first that shares GPUs that way takes it.
    either = _submit(sessions, partition="whole,shard,mps", share_mode="mps", share=10)
    assert _columns(sessions, either)[4] == "mps"


@pytest.mark.parametrize(("body", "message"), [
    ({"share_mode": "mps", "share": 50},
     "partition whole does not share GPUs by MPS: it gives whole GPUs only"),
    ({"partition": "shard", "share_mode": "mps", "share": 50},
     "partition shard does not share GPUs by MPS: it shares them as shards (--gres=shard:N)"),
    ({"partition": "mps", "share_mode": "shard", "share": 1},
     "partition mps does not share GPUs as shards: it shares them by MPS (--gres=mps:N)"),
    ({"partition": "shard", "share_mode": "shard", "share": 5},
     "requested shard:5, more than the 4 units each GPU of partition shard offers"),
    ({"partition": "mps", "share_mode": "mps", "share": 101},
     "requested mps:101, more than the 100 units each GPU of partition mps offers"),
    ({"gpu_mem_mb": 90000},
     "requested a GPU with 90000 MiB of memory, but no GPU in partition whole has that much "
     "(the most: 81920 MiB)"),
    ({"gpu_mem_mb": 30000, "gpus": 1, "gpu_types": ["l4"]},
     "requested a GPU with 30000 MiB of memory, but no l4 GPU in partition whole has that "
     "much (the most: 23034 MiB)"),
    ({"partition": "mps", "share_mode": "mps", "share": 50, "gpus": 2},
     "gpus: a share of one GPU (share_mode mps) is one GPU, not 2"),
    # A list naming a partition that does not exist is refused, as sbatch refuses it.
    ({"partition": "whole,nope"}, "invalid partition specified: nope"),
    ({"partition": "whole,shard", "share_mode": "mps", "share": 5},
     "no partition of whole,shard takes the job (whole: partition whole does not share GPUs "
     "by MPS"),
])
def test_a_share_a_partition_does_not_offer_is_refused_and_nothing_stored(
        sessions: sessionmaker[Session], body: dict[str, Any], message: str) -> None:
    before = _stored(sessions)
    with pytest.raises(UsageError) as caught:
        _submit(sessions, **body)
    assert message in caught.value.message
    assert _stored(sessions) == before


def test_a_share_moves_only_to_a_partition_that_offers_it(
        sessions: sessionmaker[Session]) -> None:
    job_id = _submit(sessions, partition="mps", share_mode="mps", share=80)
    for target, message in (("whole", "partition whole does not share GPUs by MPS"),
                            ("shard", "partition shard does not share GPUs by MPS")):
        with sessions() as s, s.begin(), pytest.raises(UsageError, match=message):
            jobupdate.update_job(s, job_id, ROOT, {"partition": target})
    with sessions() as s, s.begin():
        s.add(Partition(name="mps2", nodes=["*"], sharing="mps", shares=50))
    with sessions() as s, s.begin(), pytest.raises(UsageError, match="more than the 50 units"):
        jobupdate.update_job(s, job_id, ROOT, {"partition": "mps2"})
    with sessions() as s, s.begin():
        s.add(Partition(name="mps3", nodes=["*"], sharing="mps", shares=200))
    with sessions() as s, s.begin():
        jobupdate.update_job(s, job_id, ROOT, {"partition": "mps3"})
    assert _columns(sessions, job_id) == (1, "mps", 80, None, "mps3")


def test_job_views_show_the_share_and_gpu_memory(sessions: sessionmaker[Session]) -> None:
    """The JOB object has share_mode, share and gpu_mem_mb; the listings PostgreSQL
    writes carry them exactly as the Python-built ones."""
    import json

    from gpusched.db import job_views

    mps = _submit(sessions, partition="mps", share_mode="mps", share=50, gpu_mem_mb=20480)
    memory = _submit(sessions, gpu_mem_mb=512)
    plain = _submit(sessions, gpus=1)
    with sessions() as s:
        shown = {j: job_views.get_job(s, j, ALICE) for j in (mps, memory, plain)}
        listed = job_views.list_jobs(s, {})
        by_sql = job_views.job_list_json(s, {})
        fields = {"fields": "job_id,gpus,share_mode,share,gpu_mem_mb"}
        table = job_views.job_table_json(s, fields)
        table_python = job_views.list_jobs(s, fields)
    assert [(shown[j]["gpus"], shown[j]["share_mode"], shown[j]["share"], shown[j]["gpu_mem_mb"])
            for j in (mps, memory, plain)] == [(1, "mps", 50, 20480), (1, None, None, 512),
                                               (1, None, None, None)]
    assert by_sql is not None and json.loads(by_sql) == json.loads(json.dumps(listed))
    assert table is not None and json.loads(table) == json.loads(json.dumps(table_python))
    assert json.loads(table)["rows"] == [[mps, 1, "mps", 50, 20480], [memory, 1, None, None, 512],
                                         [plain, 1, None, None, None]]
