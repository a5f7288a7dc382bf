"""Job steps against a real database: made under the job's lock with srun's layout, a
``step`` command to each of their nodes (claimed there with its StepLaunch), refused
whole when they can never fit and ``step_busy`` while running steps hold what they
need; ended by their nodes' reports (the worst node's state, exit codes, usage), by a
cancel, or with their job (the job's other nodes are told to kill); nodes register
their addresses, bounded."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.core.model import Plan, Start
from gpusched.db import agents, commands, jobs, jobupdate, node_failure, steps, submit
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.models import Job, JobStep, Node, NodeCommand
from gpusched.db.partitions import sync_partitions
from gpusched.db.schedule import apply_plan, load_snapshot
from gpusched.errors import Conflict, NotFound, PermissionDenied, StepBusy, UsageError
from gpusched.messages.agent import LimitJob
from gpusched.messages.steps import (
    StepCancel,
    StepCreated,
    StepIO,
    StepLaunch,
    StepRequest,
)

ALICE = jobs.Identity(1000, 1000)
BOB = jobs.Identity(1001, 1001)
ROOT = jobs.Identity(0, 0)
IO = StepIO("127.0.0.1", 40_000, "ab" * 32)


@pytest.fixture
def db(db_url: str) -> Iterator[sessionmaker[Session]]:
    """Nodes n1 (address 10.0.0.1) and n2 with two GPUs and 8 CPUs each."""
    engine = make_engine(db_url, pool_size=4)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),))
        for name, address in (("n1", "10.0.0.1"), ("n2", None)):
            agents.register_node(s, _inventory(name, address))
    yield factory
    engine.dispose()


def _inventory(name: str, address: str | None = None) -> dict[str, Any]:
    return {"node": name, "uid": 0, "cpus": 8, "address": address,
            "gpus": [{"index": i, "uuid": f"{name}-{i}"} for i in range(2)]}


def _running(db: sessionmaker[Session], nodes: tuple[str, ...] = ("n1", "n2"),
             **body: object) -> int:
    """A job of ALICE's started on every GPU of ``nodes`` (its batch script on the first)."""
    with db() as s, s.begin():
        job_id = submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp",
                                       "gpus": 2 * len(nodes), "nodes": len(nodes), **body},
                                   ALICE).id
    with db() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        uuids = tuple(f"{n}-{i}" for n in nodes for i in range(2))
        apply_plan(s, snapshot, Plan(starts=(Start(job_id, nodes[0], uuids, nodes=nodes),)),
                   node_ids)
    return job_id


def _ask(**fields: Any) -> StepRequest:
    return StepRequest(argv=("/usr/bin/hostname",), work_dir="/home/alice", io=IO, **fields)


def _create(db: sessionmaker[Session], job_id: int, who: jobs.Identity = ALICE,
            **fields: Any) -> StepCreated:
    with db() as s, s.begin():
        return steps.create_step(s, job_id, _ask(**fields), who)[0]


def _claim(db: sessionmaker[Session], node: str) -> list[Any]:
    with db() as s, s.begin():
        row = s.scalars(select(Node).where(Node.name == node)).one()
        return commands.claim(s, row)


def _report(db: sessionmaker[Session], job_id: int, step_id: int, node: str,
            outcome: str = "completed", **fields: Any) -> tuple[bool, bool]:
    with db() as s, s.begin():
        return steps.record_step_end(s, job_id, step_id,
                                     {"node": node, "outcome": outcome, **fields})


def _step(db: sessionmaker[Session], job_id: int, step_id: int) -> dict[str, Any]:
    with db() as s:
        return steps.get_step(s, job_id, step_id)


def _count(db: sessionmaker[Session]) -> tuple[int, int]:
    """(steps stored, step commands made)."""
    with db() as s:
        return (s.scalar(select(func.count()).select_from(JobStep)) or 0,
                s.scalar(select(func.count()).select_from(NodeCommand).where(
                    NodeCommand.kind.in_(("step", "step_cancel")))) or 0)


def test_a_step_runs_one_task_on_each_node_and_each_node_claims_its_part(
        db: sessionmaker[Session]) -> None:
    job_id = _running(db, mem_mb=1024, time_limit=3600)
    made = _create(db, job_id, environment={"PATH": "/usr/bin"})
    assert made == StepCreated(0, ("n1", "n2"), {"n1": (0,), "n2": (1,)}, 2, "10.0.0.1",
                               29_500 + (job_id * 31) % 2000)
    again = _create(db, job_id, overlap=True, nodes=1)
    assert (again.step_id, again.node_names, again.master_port) == (
        1, ("n1",), 29_500 + (job_id * 31 + 1) % 2000)
    n2 = _claim(db, "n2")
    assert [(c.kind, c.job_id, c.run) for c in n2] == [("step", job_id, 0)]
    launch = n2[0].payload
    assert isinstance(launch, StepLaunch)
    assert (launch.step_id, launch.node, launch.node_index, launch.user, launch.uid,
            launch.argv, launch.work_dir, launch.ntasks, launch.node_names,
            launch.tasks_per_node, launch.gpu_uuids, launch.mem_mb, launch.io,
            launch.environment, launch.name, launch.master_addr) == (
        0, "n2", 1, ALICE.user, 1000,
        ("/usr/bin/hostname",), "/home/alice", 2, ("n1", "n2"), (1, 1), ("n2-0", "n2-1"),
        1024, IO, {"PATH": "/usr/bin"}, "hostname", "10.0.0.1")
    assert [(t.task_id, t.local_id, t.gpu_uuids) for t in launch.tasks] == [
        (1, 0, ("n2-0", "n2-1"))]
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.start_time is not None
        assert launch.deadline == pytest.approx(job.start_time.timestamp() + 3600)
    # The batch node gets its launch, then both steps' parts, in order.
    assert [(c.kind, getattr(c.payload, "step_id", None)) for c in _claim(db, "n1")] == [
        ("launch", None), ("step", 0), ("step", 1)]
    view = _step(db, job_id, 0)
    assert (view["state"], view["node_names"], view["layout"], view["ntasks"],
            view["gpus"], view["uid"], view["end_time"], view["exit_code"]) == (
        "RUNNING", ["n1", "n2"], {"n1": [0], "n2": [1]}, 2,
        {"n1": ["n1-0", "n1-1"], "n2": ["n2-0", "n2-1"]}, 1000, None, None)


def test_the_environment_may_choose_the_rendezvous(db: sessionmaker[Session]) -> None:
    job_id = _running(db)
    made = _create(db, job_id, environment={"MASTER_ADDR": "head", "MASTER_PORT": "1234"})
    assert (made.master_addr, made.master_port) == ("head", 1234)
    with pytest.raises(UsageError, match="MASTER_PORT in the environment: expected a TCP "
                                         "port, got '70000'"):
        _create(db, job_id, overlap=True, environment={"MASTER_PORT": "70000"})
    assert _count(db) == (1, 2)


def test_a_step_the_job_can_never_run_is_refused_whole(db: sessionmaker[Session]) -> None:
    job_id = _running(db)
    with pytest.raises(UsageError, match="--nodes 3: the job has 2 nodes"):
        _create(db, job_id, nodes=3)
    with pytest.raises(UsageError, match="need 3 GPUs on a node for 3 tasks; the job has "
                                         "n1: 2 GPUs, n2: 2 GPUs"):
        _create(db, job_id, ntasks=5, gpus_per_task=1)
    with pytest.raises(UsageError, match=r"pty: a step with a pseudo-terminal runs one "
                                         r"task \(got 2\)"):
        _create(db, job_id, pty=True, nodes=2)
    with pytest.raises(UsageError, match=r"runs one task \(got 4\)"):
        _create(db, job_id, pty=True, ntasks=4)
    with pytest.raises(UsageError, match="pty: the terminal is the task's input and "
                                         "output; output, error and input files do not"):
        _create(db, job_id, pty=True, nodes=1, output="out-%t")
    with pytest.raises(PermissionDenied, match="belongs to"):
        _create(db, job_id, BOB)
    with pytest.raises(NotFound, match="invalid job id specified: 999"):
        _create(db, 999)
    assert _count(db) == (0, 0)
    # An administrator may run a step in anyone's job: it runs as the job's user.
    _create(db, job_id, ROOT)
    launch = _claim(db, "n2")[0].payload
    assert (launch.uid, launch.gid) == (1000, 1000)
    assert _step(db, job_id, 0)["uid"] == 0


def test_steps_run_only_in_a_running_job_not_being_stopped(db: sessionmaker[Session]) -> None:
    with db() as s, s.begin():
        pending = submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp",
                                        "gpus": 1, "hold": True}, ALICE).id
    with pytest.raises(Conflict, match=f"job {pending} is PENDING: steps run only inside a "
                                       "running job"):
        _create(db, pending)
    job_id = _running(db)
    with db() as s, s.begin():
        jobs.cancel_job(s, job_id, ALICE)
    with pytest.raises(Conflict, match=f"job {job_id} is being stopped"):
        _create(db, job_id)
    assert _count(db) == (0, 0)


def test_running_steps_hold_their_gpus_and_cpus_until_they_end(
        db: sessionmaker[Session]) -> None:
    job_id = _running(db, cpus=8)
    first = _create(db, job_id, ntasks=2, gpus_per_task=1, exact=True, cpus_per_task=2)
    second = _create(db, job_id, ntasks=2, gpus_per_task=1, exact=True, cpus_per_task=2)
    assert (first.node_names, second.node_names) == (("n1", "n2"), ("n1", "n2"))
    assert _step(db, job_id, 1)["gpus"] == {"n1": ["n1-1"], "n2": ["n2-1"]}
    assert _step(db, job_id, 1)["cpus"] == {"n1": 2, "n2": 2}
    with pytest.raises(StepBusy, match="held by its running steps") as busy:
        _create(db, job_id, nodes=1, gpus_per_task=1)
    assert busy.value.code == "step_busy" and busy.value.http_status == 409
    with pytest.raises(StepBusy):  # without --exact a step holds all of a node's CPUs
        _create(db, job_id, nodes=1)
    assert _count(db)[0] == 2
    # An overlapping step shares: it runs now and holds nothing of its own.
    assert _create(db, job_id, nodes=1, overlap=True).step_id == 2
    # Once step 0 has ended on both its nodes, its GPUs go to the next step.
    for node in ("n1", "n2"):
        assert _report(db, job_id, 0, node, exit_code=0) == (True, False)
    made = _create(db, job_id, nodes=2, gpus_per_task=1, exact=True)
    assert _step(db, job_id, made.step_id)["gpus"] == {"n1": ["n1-0"], "n2": ["n2-0"]}


def test_a_step_ends_once_every_node_has_reported(db: sessionmaker[Session]) -> None:
    job_id = _running(db)
    _create(db, job_id)
    assert _report(db, job_id, 0, "n1", exit_code=0, max_rss_bytes=100, cpu_usec=5,
                   tasks=[[0, 0, None]]) == (True, False)
    view = _step(db, job_id, 0)
    assert (view["state"], view["nodes_ended"], view["end_time"]) == ("RUNNING", ["n1"], None)
    assert _report(db, job_id, 0, "n1", exit_code=0) == (False, True)  # once per node
    assert _report(db, job_id, 0, "n3", exit_code=0) == (False, True)  # not its node
    assert _report(db, job_id, 0, "n2", run=1, exit_code=0) == (False, True)  # not its run
    assert _report(db, job_id, 7, "n2", exit_code=0) == (False, True)  # no such step
    with pytest.raises(UsageError, match="outcome"):
        _report(db, job_id, 0, "n2", outcome="fine")
    assert _report(db, job_id, 0, "n2", exit_code=0, max_rss_bytes=300, cpu_usec=7,
                   end_time=datetime.now(UTC).timestamp()) == (True, False)
    view = _step(db, job_id, 0)
    assert (view["state"], view["exit_code"], view["signal"], view["max_rss_bytes"],
            view["cpu_usec"], view["error"], view["end_time"] is not None) == (
        "COMPLETED", 0, None, 300, 12, None, True)


@pytest.mark.parametrize(("ends", "state", "exit_code", "signal"), [
    ((("completed", 0, None), ("failed", 3, None)), "FAILED", 3, None),
    ((("failed", None, 9), ("completed", 0, None)), "FAILED", 0, 9),
    ((("timeout", None, 15), ("completed", None, None)), "TIMEOUT", None, 15),
    ((("out_of_memory", None, 9), ("failed", 1, None)), "OUT_OF_MEMORY", 1, 9),
    ((("launch_failed", None, None), ("completed", 0, None)), "FAILED", 0, None),
])
def test_the_worst_node_decides_the_state(db: sessionmaker[Session],
                                          ends: tuple[tuple[str, int | None, int | None], ...],
                                          state: str, exit_code: int | None,
                                          signal: int | None) -> None:
    job_id = _running(db)
    _create(db, job_id)
    for node, (outcome, code, signum) in zip(("n1", "n2"), ends, strict=True):
        error = "cannot reach gsrun" if outcome == "launch_failed" else None
        _report(db, job_id, 0, node, outcome, exit_code=code, signal=signum, error=error)
    view = _step(db, job_id, 0)
    assert (view["state"], view["exit_code"], view["signal"]) == (state, exit_code, signal)
    if ends[0][0] == "launch_failed":
        assert view["error"] == "node n1: cannot reach gsrun"


def test_a_cancel_reaches_the_nodes_that_have_not_reported(db: sessionmaker[Session]) -> None:
    job_id = _running(db)
    _create(db, job_id)
    _claim(db, "n1"), _claim(db, "n2")
    _report(db, job_id, 0, "n1", "failed", exit_code=4)
    with db() as s, s.begin(), pytest.raises(PermissionDenied):
        steps.cancel_step(s, job_id, 0, BOB)
    with db() as s, s.begin(), pytest.raises(NotFound, match=f"{job_id}.5"):
        steps.cancel_step(s, job_id, 5, ALICE)
    with db() as s, s.begin():
        assert steps.cancel_step(s, job_id, 0, ALICE, signum=10) == ["n2"]
    with db() as s, s.begin():
        assert steps.cancel_step(s, job_id, 0, ALICE, bad_exit=True) == ["n2"]
    assert _claim(db, "n1") == []
    sent = _claim(db, "n2")
    assert [(c.kind, c.payload) for c in sent] == [
        ("step_cancel", StepCancel(0, 10)), ("step_cancel", StepCancel(0, None))]
    _report(db, job_id, 0, "n2", "cancelled", signal=15)
    view = _step(db, job_id, 0)
    # gsrun -K: FAILED with the failed task's code, as sacct shows it.
    assert (view["state"], view["exit_code"], view["signal"]) == ("FAILED", 4, None)
    with db() as s, s.begin(), pytest.raises(Conflict, match="has already ended \\(FAILED\\)"):
        steps.cancel_step(s, job_id, 0, ALICE)


def test_a_plain_cancel_ends_the_step_cancelled(db: sessionmaker[Session]) -> None:
    job_id = _running(db)
    _create(db, job_id)
    with db() as s, s.begin():
        steps.cancel_step(s, job_id, 0, ROOT)
    for node in ("n1", "n2"):
        _report(db, job_id, 0, node, "cancelled", signal=15)
    assert _step(db, job_id, 0)["state"] == "CANCELLED"


def _kills(db: sessionmaker[Session], node: str) -> list[tuple[str, int, int]]:
    return [(c.kind, c.job_id, c.run) for c in _claim(db, node)]


def test_a_job_that_ends_ends_its_steps_and_the_other_nodes_kill_them(
        db: sessionmaker[Session]) -> None:
    job_id = _running(db)
    _create(db, job_id)
    _create(db, job_id, overlap=True)
    _claim(db, "n1"), _claim(db, "n2")
    _report(db, job_id, 1, "n1", exit_code=0)
    with db() as s, s.begin():
        agents.record_run_end(s, job_id, {"node": "n1", "outcome": "completed", "exit_code": 0})
    assert [_step(db, job_id, i)["state"] for i in (0, 1)] == ["CANCELLED", "CANCELLED"]
    assert _step(db, job_id, 0)["error"] == "ended with its job"
    assert _kills(db, "n2") == [("kill", job_id, 0)]
    assert _kills(db, "n1") == []  # its agent ends them there itself
    # A node's report that comes after settles the state; a kill's alone does not.
    _report(db, job_id, 1, "n2", exit_code=0)
    assert (_step(db, job_id, 1)["state"], _step(db, job_id, 1)["error"]) == ("COMPLETED", None)
    _report(db, job_id, 0, "n1", "cancelled", signal=15)
    _report(db, job_id, 0, "n2", "cancelled", signal=15)
    assert _step(db, job_id, 0)["state"] == "CANCELLED"
    # A step command not yet claimed when the job ended is never sent.
    later = _running(db)
    _create(db, later)
    with db() as s, s.begin():
        agents.record_run_end(s, later, {"node": "n1", "outcome": "timeout", "signal": 15})
    assert _step(db, later, 0)["state"] == "TIMEOUT"
    assert _kills(db, "n2") == [("kill", later, 0)]


def _limits(db: sessionmaker[Session], node: str) -> list[tuple[int, LimitJob]]:
    return [(c.job_id, c.payload) for c in _claim(db, node) if c.kind == "limit"]


def test_a_new_time_limit_reaches_every_node_running_the_jobs_steps(
        db: sessionmaker[Session]) -> None:
    job_id = _running(db, time_limit=3600)
    _claim(db, "n1"), _claim(db, "n2")
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.start_time is not None
        began = job.start_time.timestamp()

    def update(limit: int, who: jobs.Identity = ROOT) -> set[str]:
        with db() as s, s.begin():
            return jobupdate.update_job(s, job_id, who, {"time_limit": limit})[1]

    # No steps: the batch node alone.
    assert update(5400) == {"n1"}
    assert _limits(db, "n2") == []
    [(told, limit)] = _limits(db, "n1")
    assert (told, limit.time_limit) == (job_id, 5400)
    assert limit.deadline == pytest.approx(began + 5400)
    # A step on each node: both hear the raised limit, with the steps' new deadline.
    assert _create(db, job_id, nodes=1).node_names == ("n1",)
    assert _create(db, job_id, nodes=1).node_names == ("n2",)
    _claim(db, "n1"), _claim(db, "n2")
    assert update(7200) == {"n1", "n2"}
    for node in ("n1", "n2"):
        [(told, limit)] = _limits(db, node)
        assert (told, limit.time_limit) == (job_id, 7200)
        assert limit.deadline == pytest.approx(began + 7200)
    # Its owner lowers it once the step on n2 has ended there: the batch node alone.
    _report(db, job_id, 1, "n2", exit_code=0)
    assert update(1800, ALICE) == {"n1"}
    assert _limits(db, "n2") == []
    assert [limit.deadline for _, limit in _limits(db, "n1")] == [
        pytest.approx(began + 1800)]
    # A step made after the change starts with the new deadline.
    _create(db, job_id, nodes=1, overlap=True)
    [launch] = [c.payload for c in _claim(db, "n1") if c.kind == "step"]
    assert launch.deadline == pytest.approx(began + 1800)


def test_a_single_node_job_ending_sends_no_kill(db: sessionmaker[Session]) -> None:
    job_id = _running(db, ("n2",))
    _create(db, job_id)
    _claim(db, "n2")
    with db() as s, s.begin():
        agents.record_run_end(s, job_id, {"node": "n2", "outcome": "failed", "exit_code": 1})
    assert _step(db, job_id, 0)["state"] == "CANCELLED"
    assert _kills(db, "n2") == [] and _kills(db, "n1") == []


def test_a_lost_node_fails_its_steps(db: sessionmaker[Session]) -> None:
    job_id = _running(db, ("n1", "n2"), requeue=False)
    _create(db, job_id, nodes=1)  # on n1 alone
    _create(db, job_id, overlap=True)  # on both
    _claim(db, "n1"), _claim(db, "n2")
    with db() as s, s.begin():
        s.execute(update(Node).where(Node.name == "n2").values(
            last_seen=datetime.now(UTC) - timedelta(seconds=120)))
        lost = node_failure.fail_silent_nodes(s, 60)
    assert lost.node_failed == [job_id] and lost.kill_on == {"n1"}
    assert [_step(db, job_id, i)["state"] for i in (0, 1)] == ["CANCELLED", "NODE_FAIL"]
    assert _kills(db, "n1") == [("kill", job_id, 0)]


def test_a_node_registers_its_address_bounded(db: sessionmaker[Session]) -> None:
    with db() as s, s.begin():
        agents.register_node(s, _inventory("n2", "fe80::1%eth0"))
    for bad in ("a b", "x" * 256, "", 5, "host\n"):
        with db() as s, s.begin(), pytest.raises(UsageError, match="address: expected an IP "
                                                                   "address or host name"):
            agents.register_node(s, _inventory("n2", bad))  # type: ignore[arg-type]
    with db() as s:
        assert s.scalar(select(Node.address).where(Node.name == "n2")) == "fe80::1%eth0"
    job_id = _running(db, ("n2", "n1"))
    assert _create(db, job_id).master_addr == "fe80::1%eth0"
    with db() as s, s.begin():
        agents.register_node(s, _inventory("n2"))  # no address: its name
    assert _create(db, job_id, overlap=True).master_addr == "n2"


def test_tasks_killed_by_the_jobs_cancel_end_the_step_cancelled(
        db: sessionmaker[Session]) -> None:
    job_id = _running(db)
    _create(db, job_id)
    _create(db, job_id, overlap=True)
    with db() as s, s.begin():
        jobs.cancel_job(s, job_id, ALICE)
    # gsrun passes the batch script's SIGTERM on: the tasks die of it.
    for node in ("n1", "n2"):
        _report(db, job_id, 0, node, "failed", signal=15)
    assert _step(db, job_id, 0)["state"] == "CANCELLED"
    _report(db, job_id, 1, "n1", "failed", signal=15)
    with db() as s, s.begin():
        agents.record_run_end(s, job_id, {"node": "n1", "outcome": "cancelled", "signal": 15})
    _report(db, job_id, 1, "n2", "failed", signal=9)
    assert _step(db, job_id, 1)["state"] == "CANCELLED"
    # Without a cancel, tasks that die of a signal fail the step.
    other = _running(db)
    _create(db, other)
    for node in ("n1", "n2"):
        _report(db, other, 0, node, "failed", signal=15)
    assert _step(db, other, 0)["state"] == "FAILED"


def test_a_bad_exit_step_stays_failed_when_its_job_ends_first(
        db: sessionmaker[Session]) -> None:
    job_id = _running(db)
    _create(db, job_id, kill_on_bad_exit=True)
    _report(db, job_id, 0, "n2", "failed", exit_code=3)
    with db() as s, s.begin():
        steps.cancel_step(s, job_id, 0, ALICE, bad_exit=True)
    with db() as s, s.begin():  # gsrun exits 3 and the batch script ends at once
        agents.record_run_end(s, job_id, {"node": "n1", "outcome": "completed", "exit_code": 0})
    assert _step(db, job_id, 0)["state"] == "FAILED"
    _report(db, job_id, 0, "n1", "cancelled", signal=15)
    view = _step(db, job_id, 0)
    assert (view["state"], view["exit_code"], view["signal"], view["error"]) == (
        "FAILED", 3, None, None)


def test_a_pty_step_is_one_task_on_the_first_node_unless_counts_are_given(
        db: sessionmaker[Session]) -> None:
    job_id = _running(db)
    made = _create(db, job_id, pty=True)  # without --pty: a task on each of the 2 nodes
    assert (made.node_names, made.layout, made.ntasks) == (("n1",), {"n1": (0,)}, 1)
    again = _create(db, job_id, pty=True, overlap=True, ntasks=1)
    assert (again.node_names, again.ntasks) == (("n1",), 1)
    parts = [c.payload for c in _claim(db, "n1") if c.kind == "step"]
    assert [(p.step_id, p.pty, len(p.tasks)) for p in parts] == [(0, True, 1), (1, True, 1)]
    assert _step(db, job_id, 0)["layout"] == {"n1": [0]}

