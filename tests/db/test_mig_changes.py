"""Dynamic MIG's decisions against a real database: after a pass, which ``mig`` commands
are made for a partition with dynamic MIG (one per GPU to change, none for a busy GPU,
none within the interval, none twice), how the agent's poll hands them out, and when a
registration records a GPU's layout change."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.core.model import Plan, Policy, Start
from gpusched.core.plan import plan
from gpusched.db import agents, commands, jobs, mig_changes, submit
from gpusched.db.admincache import load_admin_tables
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.models import Gpu, Node, NodeCommand, Partition
from gpusched.db.partitions import sync_partitions
from gpusched.db.schedule import apply_plan, load_snapshot
from gpusched.messages.mig import MigLayout

ALICE = jobs.Identity(1000, 1000)
A, B, C = "GPU-a", "GPU-b", "GPU-c"  # A and B: one 7g.80gb slice each; C: one 1g.10gb


def _inventory(slices: dict[str, list[tuple[str, str]]] | None = None) -> dict[str, Any]:
    """Node n1: three A100 80GB in MIG mode with ``slices`` (by GPU: (uuid, profile))."""
    slices = slices or {A: [("MIG-a7", "7g.80gb")], B: [("MIG-b7", "7g.80gb")],
                        C: [("MIG-c1", "1g.10gb")]}
    gpus: list[dict[str, Any]] = []
    for index, uuid in enumerate((A, B, C)):
        gpus.append({"index": index, "uuid": uuid, "type": "a100-80gb", "memory_mb": 81920})
        for n, (mig, profile) in enumerate(slices[uuid]):
            gpus.append({"index": 10 * (index + 1) + n, "uuid": mig, "type": "a100-80gb",
                         "parent": index, "mig_profile": profile, "memory_mb": 9728})
    return {"node": "n1", "uid": 0, "gpus": gpus}


@pytest.fixture
def db(db_url: str) -> Iterator[sessionmaker[Session]]:
    """Partition gpu with dynamic MIG (10 minutes) over n1, whose 1g.10gb slice a job
    holds."""
    engine = make_engine(db_url, pool_size=2)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),))
        s.execute(update(Partition).values(dynamic_mig=True, mig_min_interval=600))
        agents.register_node(s, _inventory())
    _start(factory, _submit(factory), ("MIG-c1",))
    yield factory
    engine.dispose()


def _submit(db: sessionmaker[Session], profile: str = "1g.10gb", count: int = 1) -> int:
    with db() as s, s.begin():
        return submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp",
                                     "gpus": count, "gpu_types": [profile]}, ALICE).id


def _start(db: sessionmaker[Session], job_id: int, uuids: tuple[str, ...]) -> None:
    with db() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        apply_plan(s, snapshot, Plan(starts=(Start(job_id, "n1", uuids),)), node_ids)


def _pass(db: sessionmaker[Session], now: float | None = None) -> set[str]:
    """A pass as the scheduler runs it, then the dynamic-MIG step; the nodes to wake."""
    now = time.time() if now is None else now
    with db() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        decided = plan(snapshot, now, Policy())
        woken = apply_plan(s, snapshot, decided, node_ids)
        return woken | mig_changes.after_pass(s, snapshot, decided, node_ids,
                                              load_admin_tables(s).dynamic_mig, None, now)


def _mig_commands(db: sessionmaker[Session]) -> list[tuple[dict[str, Any], bool]]:
    with db() as s:
        return [(payload, done) for payload, done in s.execute(
            select(NodeCommand.payload, NodeCommand.done_at.is_not(None))
            .where(NodeCommand.kind == "mig").order_by(NodeCommand.id))]


def _changed(db: sessionmaker[Session], uuid: str, ago: float) -> None:
    with db() as s, s.begin():
        s.execute(update(Gpu).where(Gpu.uuid == uuid)
                  .values(mig_changed_at=datetime.now(UTC) - timedelta(seconds=ago)))


def test_a_waiting_profile_asks_one_idle_gpu_to_change_once(db: sessionmaker[Session]
                                                            ) -> None:
    waiting = _submit(db)
    assert _pass(db) == {"n1"}
    assert _mig_commands(db) == [({"gpu_uuid": A, "layout": ["1g.10gb"]}, False)]
    # The agent's poll hands it out with its typed payload, for no job.
    with db() as s, s.begin():
        (claimed,) = [c for c in commands.claim(s, s.scalars(select(Node)).one())
                      if c.kind != "launch"]  # the holder's launch
        assert (claimed.kind, claimed.job_id, claimed.payload) == (
            "mig", None, MigLayout(A, ("1g.10gb",)))
        assert claimed.to_json()["payload"] == {"gpu_uuid": A, "layout": ["1g.10gb"]}
    # While it is not done, passes ask for nothing more: its slice is on its way.
    assert _pass(db) == set()
    more = _submit(db)
    assert _pass(db) == {"n1"}  # a second waiting job: the other idle GPU
    assert _mig_commands(db)[1:] == [({"gpu_uuid": B, "layout": ["1g.10gb"]}, False)]
    assert _pass(db) == set() and len(_mig_commands(db)) == 2
    # Done: the agent registers the new slices; the pass starts the jobs on them.
    with db() as s, s.begin():
        s.execute(update(NodeCommand).values(done_at=datetime.now(UTC)))
        agents.register_node(s, _inventory({A: [("MIG-a1", "1g.10gb")],
                                            B: [("MIG-b1", "1g.10gb")],
                                            C: [("MIG-c1", "1g.10gb")]}))
    assert _pass(db) == {"n1"}
    with db() as s:
        placed = {job: (state, uuid) for job, state, uuid in s.execute(text(
            "SELECT j.id, j.state, g.uuid FROM jobs j LEFT JOIN allocations a ON"
            " a.job_id = j.id AND a.released_at IS NULL LEFT JOIN gpus g ON g.id = a.gpu_id"
            " WHERE j.id = ANY(:ids)"), {"ids": [waiting, more]})}
        stamped = dict(s.execute(select(Gpu.uuid, Gpu.mig_changed_at.is_not(None))
                                 .where(Gpu.parent_id.is_(None))).all())
    assert sorted(placed.values()) == [("RUNNING", "MIG-a1"), ("RUNNING", "MIG-b1")]
    assert stamped == {A: True, B: True, C: False}
    assert len(_mig_commands(db)) == 2


def test_a_busy_gpu_is_never_changed(db: sessionmaker[Session]) -> None:
    _start(db, _submit(db, "7g.80gb"), ("MIG-a7",))
    _submit(db)
    assert _pass(db) == {"n1"}
    assert _mig_commands(db) == [({"gpu_uuid": B, "layout": ["1g.10gb"]}, False)]
    with db() as s, s.begin():
        s.execute(update(NodeCommand).values(done_at=datetime.now(UTC)))
        s.execute(text("DELETE FROM node_commands"))
    _start(db, _submit(db, "7g.80gb"), ("MIG-b7",))
    assert _pass(db) == set() and _mig_commands(db) == []  # every GPU busy


def test_no_change_within_the_interval(db: sessionmaker[Session]) -> None:
    _changed(db, A, 500)
    _changed(db, B, 599)
    _submit(db)
    assert _pass(db) == set() and _mig_commands(db) == []
    _changed(db, B, 601)
    assert _pass(db) == {"n1"}
    assert _mig_commands(db) == [({"gpu_uuid": B, "layout": ["1g.10gb"]}, False)]
    # A change the agent refused (done, nothing registered) is not asked again within
    # the interval either: the command's time counts as the GPU's last change.
    with db() as s, s.begin():
        s.execute(update(NodeCommand).values(done_at=datetime.now(UTC)))
    assert _pass(db) == set() and len(_mig_commands(db)) == 1
    assert _pass(db, time.time() + 601) == {"n1"}
    assert [p["gpu_uuid"] for p, _ in _mig_commands(db)] == [B, A]


def test_a_command_left_without_an_answer_is_closed_and_decided_again(
        db: sessionmaker[Session]) -> None:
    _submit(db)
    assert _pass(db) == {"n1"}
    later = time.time() + mig_changes.OPEN_FOR + 1
    with db() as s, s.begin():  # A's last command is older than the interval by then
        s.execute(update(NodeCommand).values(
            created_at=datetime.now(UTC) - timedelta(seconds=700)))
    assert _pass(db, later) == {"n1"}
    assert _mig_commands(db) == [({"gpu_uuid": A, "layout": ["1g.10gb"]}, True),
                                 ({"gpu_uuid": A, "layout": ["1g.10gb"]}, False)]


def test_only_partitions_with_dynamic_mig_and_waiting_jobs(db: sessionmaker[Session]) -> None:
    assert _pass(db) == set()  # nobody waits
    _submit(db, "1g.10gb", 1)
    with db() as s, s.begin():
        s.execute(update(Partition).values(dynamic_mig=False))
    assert _pass(db) == set() and _mig_commands(db) == []
    with db() as s, s.begin():
        s.execute(update(Partition).values(dynamic_mig=True, state="DOWN"))
    assert _pass(db) == set() and _mig_commands(db) == []
    with db() as s, s.begin():
        s.execute(update(Partition).values(state="UP"))
        s.execute(update(Node).values(state="DRAIN"))
    assert _pass(db) == set() and _mig_commands(db) == []


def test_a_registration_records_which_gpus_changed_layout(db: sessionmaker[Session]) -> None:
    with db() as s, s.begin():
        agents.register_node(s, _inventory())  # the same slices: no change
        assert mig_changes.note_layouts(s, s.scalars(select(Node.id)).one(),
                                        _inventory()["gpus"]) == []
    with db() as s, s.begin():
        agents.register_node(s, _inventory({A: [("MIG-a7", "7g.80gb")],
                                            B: [("MIG-b3", "3g.40gb"), ("MIG-b4", "3g.40gb")],
                                            C: [("MIG-c1", "1g.10gb")]}))
    with db() as s:
        stamped = {u: at for u, at in s.execute(select(Gpu.uuid, Gpu.mig_changed_at)
                                                .where(Gpu.parent_id.is_(None)))}
        present = set(s.scalars(select(Gpu.uuid).where(Gpu.present, Gpu.parent_id.is_not(None))))
    assert stamped[A] is None and stamped[C] is None and stamped[B] is not None
    assert abs((datetime.now(UTC) - stamped[B]).total_seconds()) < 60
    assert present == {"MIG-a7", "MIG-b3", "MIG-b4", "MIG-c1"}


def test_a_stored_command_that_does_not_parse_is_closed_not_followed(
        db: sessionmaker[Session]) -> None:
    with db() as s, s.begin():
        node_id = s.scalars(select(Node.id)).one()
        s.add(NodeCommand(node_id=node_id, kind="mig", payload={"gpu_uuid": A}))
    _submit(db)
    assert _pass(db) == {"n1"}
    # Closed; it still counts as a change asked of A within the interval: B changes.
    assert _mig_commands(db) == [({"gpu_uuid": A}, True),
                                 ({"gpu_uuid": B, "layout": ["1g.10gb"]}, False)]
