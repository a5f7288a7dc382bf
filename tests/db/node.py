"""A database with one registered node ``n1``, and jobs started on chosen GPUs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.core.model import Plan, Start
from gpusched.db import agents, jobs, submit
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.partitions import sync_partitions
from gpusched.db.schedule import apply_plan, load_snapshot

ALICE = jobs.Identity(1000, 1000)


@contextmanager
def node_sessions(db_url: str, gpus: list[dict[str, Any]]) -> Iterator[sessionmaker[Session]]:
    """Sessions on ``db_url`` after partition ``gpu`` and node ``n1`` with ``gpus``."""
    engine = make_engine(db_url, pool_size=2)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),))
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": gpus})
    try:
        yield factory
    finally:
        engine.dispose()


def start_on(sessions: sessionmaker[Session], uuids: tuple[str, ...], **body: object) -> int:
    """Submit a job as ALICE and start it on ``uuids`` of ``n1``, as a pass would."""
    with sessions() as s, s.begin():
        job_id = submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", **body}, ALICE).id
    with sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        apply_plan(s, snapshot, Plan(starts=(Start(job_id, "n1", uuids),)), node_ids)
    return job_id
