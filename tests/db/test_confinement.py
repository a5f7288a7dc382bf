"""Confinement against a real database: launch orders carry the job's CPUs, memory and
--gres-flags; ends keep what the cgroup measured; OUT_OF_MEMORY; a failed prolog
requeues the job and drains the node; a failed epilog drains the node; registration
stores how the node confines jobs."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpusched.core.model import JobState, Policy
from gpusched.core.plan import plan
from gpusched.db import accounting, agents, commands, job_views, submit
from gpusched.db.health import set_node_state
from gpusched.db.jobs import cancel_job
from gpusched.db.models import Allocation, Job, Node
from gpusched.db.schedule import apply_plan, load_snapshot
from gpusched.errors import UsageError
from gpusched.messages import LaunchOrder
from tests.db.node import ALICE, node_sessions, start_on

GPUS = [{"index": 0, "uuid": "GPU-0"}, {"index": 1, "uuid": "GPU-1"}]


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    with node_sessions(db_url, GPUS) as factory:
        yield factory


def _job(sessions: sessionmaker[Session], job_id: int) -> Job:
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.expunge(job)
        return job


def _node(sessions: sessionmaker[Session], name: str = "n1") -> Node:
    with sessions() as s:
        node = s.scalars(select(Node).where(Node.name == name)).one()
        s.expunge(node)
        return node


def _end(sessions: sessionmaker[Session], job_id: int, **report: object) -> tuple[bool, bool]:
    with sessions() as s, s.begin():
        return agents.record_run_end(s, job_id, {"node": "n1", "run": 0, **report})


def _held(sessions: sessionmaker[Session], job_id: int) -> int:
    with sessions() as s:
        return len(s.scalars(select(Allocation).where(Allocation.job_id == job_id,
                                                      Allocation.released_at.is_(None))).all())


def test_a_launch_order_carries_cpus_memory_and_gres_flags(
        sessions: sessionmaker[Session]) -> None:
    shaped = start_on(sessions, ("GPU-0",), gpus=1, cpus=6, mem_mb=24576,
                      gres_flags="enforce-binding")
    plain = start_on(sessions, ("GPU-1",), gpus=1)
    with sessions() as s, s.begin():
        node = s.scalars(select(Node).where(Node.name == "n1")).one()
        orders = {c.job_id: c.payload for c in commands.claim(s, node)}
    first, second = orders[shaped], orders[plain]
    assert isinstance(first, LaunchOrder) and isinstance(second, LaunchOrder)
    assert (first.cpus, first.mem_mb, first.gres_flags) == (6, 24576, "enforce-binding")
    assert (second.cpus, second.mem_mb, second.gres_flags) == (0, 0, None)
    assert LaunchOrder.parse(first.to_json()) == first  # what the agent reads back


def test_gres_flags_are_stored_shown_and_bounded(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        job_id = submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp",
                                       "gres_flags": "disable-binding"}, ALICE).id
    assert _job(sessions, job_id).gres_flags == "disable-binding"
    with sessions() as s:
        shown = job_views.get_job(s, job_id, ALICE)
        table = job_views.list_jobs(s, {"fields": "job_id,gres_flags"})
        built = job_views.job_table_json(s, {"fields": "job_id,gres_flags"})
    assert shown["gres_flags"] == "disable-binding"
    assert table["rows"] == [(job_id, "disable-binding")]
    assert built is not None and b'"disable-binding"' in built
    with sessions() as s, s.begin(), pytest.raises(UsageError, match="gres_flags: expected one of"):
        submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp",
                              "gres_flags": "bind"}, ALICE)
    with sessions() as s:
        assert s.scalar(select(Job.id).where(Job.id != job_id)) is None  # nothing stored


def test_an_array_task_keeps_its_gres_flags_and_requeue(
        sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        record = submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", "gpus": 1,
                                       "array": "0-1", "gres_flags": "enforce-binding",
                                       "requeue": False}, ALICE).id
    with sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        apply_plan(s, snapshot, plan(snapshot, time.time(), Policy()), node_ids)
    with sessions() as s:
        tasks = s.execute(select(Job.array_task_id, Job.gres_flags, Job.requeue).where(
            Job.array_job_id == record, Job.state == "RUNNING")).all()
    assert sorted(tasks) == [(0, "enforce-binding", False), (1, "enforce-binding", False)]


def test_an_oom_kill_ends_out_of_memory_with_what_was_used(
        sessions: sessionmaker[Session]) -> None:
    job_id = start_on(sessions, ("GPU-0",), gpus=1, mem_mb=1024)
    assert _end(sessions, job_id, outcome="out_of_memory", exit_code=0, signal=9,
                max_rss_bytes=1024 * 2**20, cpu_usec=2_500_000, error="memory limit") \
        == (True, False)
    job = _job(sessions, job_id)
    assert (job.state, job.exit_code, job.signal) == ("OUT_OF_MEMORY", 0, 9)
    assert (job.max_rss_bytes, job.cpu_usec) == (1024 * 2**20, 2_500_000)
    assert JobState(job.state).terminal and JobState(job.state).short == "OOM"
    assert _held(sessions, job_id) == 0
    with sessions() as s:
        records = accounting.job_records(s, states=["OUT_OF_MEMORY"])
        everything = accounting.job_records(s)
    assert [(r["job_id"], r["state"], r["max_rss_bytes"], r["cpu_usec"]) for r in records] \
        == [(job_id, "OUT_OF_MEMORY", 1024 * 2**20, 2_500_000)]
    assert [r["job_id"] for r in everything] == [job_id]  # shown by default too


def test_every_end_that_measured_keeps_its_usage(sessions: sessionmaker[Session]) -> None:
    measured = start_on(sessions, ("GPU-0",), gpus=1)
    unmeasured = start_on(sessions, ("GPU-1",), gpus=1)
    _end(sessions, measured, outcome="completed", exit_code=0, max_rss_bytes=4096,
         cpu_usec=17)
    _end(sessions, unmeasured, outcome="failed", exit_code=3)
    assert (_job(sessions, measured).max_rss_bytes, _job(sessions, measured).cpu_usec) \
        == (4096, 17)
    assert (_job(sessions, unmeasured).max_rss_bytes, _job(sessions, unmeasured).cpu_usec) \
        == (None, None)


def test_a_failed_prolog_requeues_the_job_and_drains_the_node(
        sessions: sessionmaker[Session]) -> None:
    job_id = start_on(sessions, ("GPU-0",), gpus=1)
    submitted = _job(sessions, job_id).submit_time
    with sessions() as s, s.begin():
        waiting = submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp",
                                        "dependency": f"afternotok:{job_id}"}, ALICE).id
    assert _end(sessions, job_id, outcome="prolog_failed", exit_code=1,
                error="prolog failed: /scratch is not mounted\nmore detail") == (True, False)
    job = _job(sessions, job_id)
    assert (job.state, job.restarts, job.node_id, job.end_time) == ("PENDING", 1, None, None)
    assert job.submit_time == submitted
    assert job.error_message == "requeued: prolog failed: /scratch is not mounted (node n1)"
    assert _held(sessions, job_id) == 0
    node = _node(sessions)
    assert (node.state, node.reason, node.drained_by) == (
        "DRAIN", "prolog failed: /scratch is not mounted", None)
    with sessions() as s:  # not a failure: the afternotok job still waits, and no pass
        snapshot, _ = load_snapshot(s)  # puts either job on the drained node
    decided = plan(snapshot, time.time(), Policy())
    assert decided.starts == ()
    assert snapshot.job_states[job_id] is JobState.PENDING
    assert _job(sessions, waiting).state == "PENDING"
    # the same report again (an answer lost) changes nothing
    assert _end(sessions, job_id, outcome="prolog_failed", exit_code=1) == (False, True)
    assert _job(sessions, job_id).restarts == 1


def test_a_job_that_never_started_goes_back_to_the_queue(
        sessions: sessionmaker[Session]) -> None:
    """Its supervisor was lost before it forked the job (an agent killed while it
    launched it): requeued with its submit time, the node left as it is, and jobs that
    depend on it wait on; it starts again."""
    job_id = start_on(sessions, ("GPU-0",), gpus=1)
    with sessions() as s, s.begin():
        waiting = submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp",
                                        "dependency": f"afterok:{job_id}"}, ALICE).id
    lost = "job supervisor lost before it started the job"
    assert _end(sessions, job_id, outcome="not_started", error=lost) == (True, False)
    job = _job(sessions, job_id)
    assert (job.state, job.restarts, job.node_id) == ("PENDING", 1, None)
    assert job.error_message == f"requeued: {lost} (node n1)"
    assert _held(sessions, job_id) == 0
    assert _node(sessions).state == "UP"
    with sessions() as s:
        snapshot, _ = load_snapshot(s)
    decided = plan(snapshot, time.time(), Policy())
    assert [start.job_id for start in decided.starts] == [job_id]
    assert _job(sessions, waiting).reason != "DependencyNeverSatisfied"
    assert _end(sessions, job_id, outcome="not_started", error=lost) == (False, True)


def test_a_prolog_failing_under_a_cancel_ends_the_job_cancelled(
        sessions: sessionmaker[Session]) -> None:
    job_id = start_on(sessions, ("GPU-0",), gpus=1)
    with sessions() as s, s.begin():
        cancel_job(s, job_id, ALICE)
    _end(sessions, job_id, outcome="prolog_failed", exit_code=1, error="prolog failed: x")
    job = _job(sessions, job_id)
    assert (job.state, job.restarts) == ("CANCELLED", 0)
    assert _node(sessions).state == "DRAIN"


def test_a_failed_prolog_keeps_an_admins_drain_and_replaces_a_health_drain(
        sessions: sessionmaker[Session]) -> None:
    first = start_on(sessions, ("GPU-0",), gpus=1)
    second = start_on(sessions, ("GPU-1",), gpus=1)
    with sessions() as s, s.begin():
        set_node_state(s, "n1", True, "bad fan")
    _end(sessions, first, outcome="prolog_failed", exit_code=1, error="prolog failed: x")
    assert (_node(sessions).reason, _node(sessions).drained_by) == ("bad fan", None)
    with sessions() as s, s.begin():
        s.execute(Node.__table__.update().values(reason="health check: hot",
                                                 drained_by="health"))
    _end(sessions, second, outcome="prolog_failed", exit_code=1, error="prolog failed: y")
    assert (_node(sessions).reason, _node(sessions).drained_by) == ("prolog failed: y", None)


def test_a_failed_epilog_drains_the_node_and_the_job_ends_as_it_did(
        sessions: sessionmaker[Session]) -> None:
    job_id = start_on(sessions, ("GPU-0",), gpus=1)
    assert _end(sessions, job_id, outcome="completed", exit_code=0,
                epilog_error="epilog failed: exit 2: cannot unmount /scratch",
                max_rss_bytes=10, cpu_usec=20) == (True, False)
    job = _job(sessions, job_id)
    assert (job.state, job.exit_code, job.restarts, job.max_rss_bytes) == ("COMPLETED", 0, 0, 10)
    node = _node(sessions)
    assert (node.state, node.reason, node.drained_by) == (
        "DRAIN", "epilog failed: exit 2: cannot unmount /scratch", None)
    with sessions() as s, s.begin():  # the agent registering again keeps the drain
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": GPUS})
    assert (_node(sessions).state, _node(sessions).reason) == (
        "DRAIN", "epilog failed: exit 2: cannot unmount /scratch")
    with sessions() as s, s.begin():
        set_node_state(s, "n1", False)
    assert (_node(sessions).state, _node(sessions).reason) == ("UP", None)


def test_registration_stores_how_the_node_confines_jobs(
        sessions: sessionmaker[Session]) -> None:
    assert (_node(sessions).enforced, _node(sessions).enforcement) == (False, None)
    with sessions() as s, s.begin():
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": GPUS, "enforced": True,
                                 "enforcement": "cgroup v2 (devices, memory, cpuset)"})
    assert (_node(sessions).enforced, _node(sessions).enforcement) == (
        True, "cgroup v2 (devices, memory, cpuset)")
    for body, message in (({"enforced": "yes"}, "enforced: expected true or false"),
                          ({"enforcement": "x" * 257}, "enforcement: expected at most 256"),
                          ({"enforcement": "a\x1b[2Jb"}, "printable"),
                          ({"enforcement": 5}, "enforcement: expected")):
        with sessions() as s, s.begin(), pytest.raises(UsageError, match=message):
            agents.register_node(s, {"node": "n1", "uid": 0, "gpus": GPUS, "enforced": False,
                                     **body})
        assert (_node(sessions).enforced, _node(sessions).enforcement) == (
            True, "cgroup v2 (devices, memory, cpuset)")  # nothing changed
    with sessions() as s, s.begin():  # an agent that says nothing: not confined
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": GPUS})
    assert (_node(sessions).enforced, _node(sessions).enforcement) == (False, None)
