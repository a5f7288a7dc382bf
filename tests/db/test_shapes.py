"""Multi-node jobs, typed GPUs and reservations against a real database."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpusched.core.model import Policy
from gpusched.core.plan import plan
from gpusched.db import agents, commands, job_views, jobs
from gpusched.db.models import Allocation, Gpu, Job, Node
from gpusched.db.schedule import apply_plan, load_snapshot
from gpusched.errors import UsageError
from tests.db.test_transitions import ALICE, _submit, sessions  # noqa: F401  (a fixture)


def _pass(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        apply_plan(s, snapshot, plan(snapshot, time.time(), Policy()), node_ids)


def _second_node(sessions: sessionmaker[Session], **extra: object) -> None:
    with sessions() as s, s.begin():
        agents.register_node(s, {"node": "n2", "uid": 0, "cpus": 16, "memory_mb": 1000,
                                 "gpus": [{"index": i, "uuid": f"H-{i}", "type": "h100-80gb"}
                                          for i in range(2)], **extra})


def test_a_multi_node_job_holds_gpus_on_each_node_and_runs_on_the_first(
        sessions: sessionmaker[Session]) -> None:
    _second_node(sessions)
    job_id = _submit(sessions, gpus=4, nodes=2)
    _pass(sessions)
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.state == "RUNNING" and job.node_names == ["n1", "n2"]
        held = sorted(s.execute(select(Node.name, Allocation.gpu_id).join(
            Node, Node.id == Allocation.node_id).where(Allocation.job_id == job_id)).all())
        assert [name for name, _ in held] == ["n1", "n1", "n2", "n2"]
        nodes = {n.name: n for n in s.scalars(select(Node))}
    with sessions() as s, s.begin():
        nodes = {n.name: n for n in s.scalars(select(Node))}
        # The batch script runs on the first node alone, as Slurm's does.
        claimed = commands.claim(s, nodes["n1"])
        assert [(c.kind, c.job_id) for c in claimed] == [("launch", job_id)]
        assert commands.claim(s, nodes["n2"]) == []
        # ... and sees only its own node's GPUs (CUDA_VISIBLE_DEVICES), as Slurm's does.
        on_n1 = set(s.scalars(select(Gpu.uuid).join(Allocation, Allocation.gpu_id == Gpu.id)
                              .where(Allocation.job_id == job_id,
                                     Allocation.node_id == nodes["n1"].id)))
        assert len(on_n1) == 2 and set(claimed[0].payload.gpu_uuids) == on_n1
    with sessions() as s:
        assert job_views.get_job(s, job_id, ALICE)["start_kind"] == "immediate"


def test_typed_requests_go_to_their_type_and_reservations_are_stored(
        sessions: sessionmaker[Session]) -> None:
    _second_node(sessions)
    h100 = _submit(sessions, gpus=2, gpu_types=["h100"], time_limit=600)
    after = _submit(sessions, gpus=2, gpu_types=["h100"], time_limit=600)
    _pass(sessions)
    with sessions() as s:
        first = job_views.get_job(s, h100, ALICE)
        assert first["node"] == "n2" and first["gpu_uuids"] == ["H-0", "H-1"]
        waiting = job_views.get_job(s, after, ALICE)
        assert waiting["reason"] == "Resources" and waiting["expected_start"] is not None
        assert waiting["gpu_types"] == ["h100"]
    with sessions() as s, s.begin():
        jobs.cancel_job(s, h100, ALICE)
    with sessions() as s, s.begin():  # the agent reports the end: the GPUs come back
        assert agents.record_end(s, h100, {"node": "n2", "outcome": "cancelled"})
    _pass(sessions)
    with sessions() as s:
        assert job_views.get_job(s, after, ALICE)["expected_start"] is None  # it started


@pytest.mark.parametrize(("body", "words"), [
    ({"gpus": 3, "nodes": 2}, "cannot be spread evenly over 2 nodes"),
    ({"gpus": 1, "gpu_types": ["a100"]}, "no node in partition gpu has that"),
    ({"gpus": 3, "nodes": 3}, "has only 2 such node(s)"),
    ({"gpus": 1, "gpu_types": ["h100"], "cpus": 64}, "no node in partition gpu has that"),
    ({"gpus": 1, "gpu_types": ["h100"], "mem_mb": 2000}, "no node in partition gpu has that"),
    ({"gpus": 0, "gpu_types": ["l4"]}, "a GPU type needs a number of GPUs"),
    ({"gpus": 1, "gpu_types": ["Not A Type"]}, "is not a GPU type"),
    ({"gpus": 1, "nodes": 0}, "nodes: expected a number of nodes"),
    ({"gpus": 1, "mem_mb": -1}, "mem_mb: expected MiB of memory per node from 0 to"),
])
def test_impossible_shapes_are_refused_and_nothing_stored(
        sessions: sessionmaker[Session], body: dict[str, object], words: str) -> None:
    _second_node(sessions)
    with pytest.raises(UsageError) as err:
        _submit(sessions, **body)
    assert words in str(err.value)
    with sessions() as s:
        assert s.scalars(select(Job)).first() is None


def test_registered_links_and_mig_slices_steer_placement(sessions: sessionmaker[Session]) -> None:
    whole = [{"index": i, "uuid": f"A-{i}", "type": "a100-80gb"} for i in range(5)]
    slices = [{"index": 10 + i, "uuid": f"MIG-{i}", "type": "a100-80gb", "mig_profile": "1g.10gb",
               "parent": 4} for i in range(3)]
    links = [{"a": 0, "b": 2, "kind": "NVLINK", "nvlinks": 12},
             {"a": 1, "b": 3, "kind": "NVLINK", "nvlinks": 12},
             {"a": 0, "b": 1, "kind": "SYSTEM"}, {"a": 2, "b": 3, "kind": "SYSTEM"}]
    with sessions() as s, s.begin():
        agents.register_node(s, {"node": "m1", "uid": 0, "gpus": whole + slices, "links": links})
    pair = _submit(sessions, gpus=2, gpu_types=["a100"])
    mig = _submit(sessions, gpus=2, gpu_types=["1g.10gb"])
    _pass(sessions)
    three = _submit(sessions, gpus=3, gpu_types=["a100"])  # GPU 4 is in MIG mode: only 2 left
    _pass(sessions)
    with sessions() as s:
        got = {j: job_views.get_job(s, j, ALICE) for j in (pair, mig, three)}
    assert set(got[pair]["gpu_uuids"]) in ({"A-0", "A-2"}, {"A-1", "A-3"})  # an NVLinked pair
    assert got[mig]["gpu_uuids"] == ["MIG-0", "MIG-1"]
    assert (got[three]["state"], got[three]["reason"]) == ("PENDING", "Resources")
    with sessions() as s, s.begin(), pytest.raises(UsageError, match="parent GPU 9"):
        agents.register_node(s, {"node": "m2", "uid": 0, "gpus": [
            {"index": 0, "uuid": "MIG-x", "mig_profile": "1g.10gb", "parent": 9}]})
