"""A partition that re-partitions its MIG GPUs (dynamic_mig) takes a job asking for a
MIG profile that no slice offers now but its GPUs' model has; one that does not
re-partition refuses it, and a profile the model lacks is refused either way."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.db import agents, jobs, submit
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.models import Partition
from gpusched.db.partitions import sync_partitions
from gpusched.errors import UsageError

ALICE = jobs.Identity(1000, 1000)


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url, pool_size=2)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),))
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": [
            {"index": 0, "uuid": "GPU-1-0", "type": "a100-80gb", "memory_mb": 81920},
            {"index": 100, "uuid": "MIG-1-0", "parent": 0, "mig_profile": "7g.80gb",
             "memory_mb": 80896}]})
    yield factory
    engine.dispose()


def _submit(sessions: sessionmaker[Session], gpus: str) -> int:
    with sessions() as s, s.begin():
        return submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp",
                                     "gpus": 1, "gpu_types": [gpus]}, ALICE).id


def _dynamic(sessions: sessionmaker[Session], on: bool) -> None:
    with sessions() as s, s.begin():
        s.execute(update(Partition).values(dynamic_mig=on))


def test_a_profile_no_slice_offers_is_taken_only_where_gpus_may_be_split(
        sessions: sessionmaker[Session]) -> None:
    with pytest.raises(UsageError, match="no node in partition gpu has that"):
        _submit(sessions, "1g.10gb")
    _dynamic(sessions, True)
    assert _submit(sessions, "1g.10gb") > 0
    assert _submit(sessions, "7g.80gb") > 0  # the slice there now
    with pytest.raises(UsageError, match="no node in partition gpu has that"):
        _submit(sessions, "1g.5gb")  # an A100 40GB profile: not this model's
