"""Node commands against a real database: claimed once across sessions (SKIP LOCKED),
handed out again when unacknowledged, stamped with the job's run, closed with their
run; a silent node's jobs end NODE_FAIL, requeued or cancelled; a node that comes back
is told which runs to kill."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.core.model import Plan, Start
from gpusched.db import agents, commands, jobs, jobupdate, node_failure, submit
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.migrate import downgrade, upgrade
from gpusched.db.models import Allocation, Job, Node, NodeCommand
from gpusched.db.partitions import sync_partitions
from gpusched.db.schedule import apply_plan, load_snapshot
from gpusched.errors import NotFound, UsageError
from gpusched.messages import LaunchOrder, LimitJob, SignalJob
from tests.pg import ScratchPostgres

ALICE = jobs.Identity(1000, 1000)


@pytest.fixture
def db(db_url: str) -> Iterator[sessionmaker[Session]]:
    """Nodes n1 and n2 with two GPUs each (n1-0, n1-1, n2-0, n2-1)."""
    engine = make_engine(db_url, pool_size=4)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),))
        for name in ("n1", "n2"):
            agents.register_node(s, _inventory(name))
    yield factory
    engine.dispose()


def _inventory(name: str, **extra: object) -> dict[str, object]:
    return {"node": name, "uid": 0,
            "gpus": [{"index": i, "uuid": f"{name}-{i}"} for i in range(2)], **extra}


def _submit(db: sessionmaker[Session], **body: object) -> int:
    with db() as s, s.begin():
        return submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", **body},
                                 ALICE).id


def _start(db: sessionmaker[Session], *starts: Start) -> set[str]:
    with db() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        return apply_plan(s, snapshot, Plan(starts=starts), node_ids)


def _node(s: Session, name: str) -> Node:
    return s.scalars(select(Node).where(Node.name == name)).one()


def _job(db: sessionmaker[Session], job_id: int) -> Job:
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.expunge(job)
        return job


def _end(db: sessionmaker[Session], job_id: int, node: str, **report: object
         ) -> tuple[bool, bool]:
    with db() as s, s.begin():
        return agents.record_run_end(s, job_id, {"node": node, "outcome": "completed",
                                                 "exit_code": 0, **report})


def _kinds(db: sessionmaker[Session], node: str) -> list[tuple[str, int, int]]:
    """What ``node`` claims now (commands claimed before and not yet acknowledged are
    not handed out again so soon)."""
    with db() as s, s.begin():
        return [(c.kind, c.job_id, c.run) for c in commands.claim(s, _node(s, node))]


def test_two_polls_never_claim_one_command_and_unacknowledged_ones_come_back(
        db: sessionmaker[Session]) -> None:
    first, second = _submit(db, gpus=1), _submit(db, gpus=1)
    assert _start(db, Start(first, "n1", ("n1-0",)), Start(second, "n1", ("n1-1",))) == {"n1"}
    with db() as a, db() as b:
        a.begin()
        taken = commands.claim(a, _node(a, "n1"))  # not committed: its rows stay locked
        assert [(c.kind, c.job_id, c.run) for c in taken] == [
            ("launch", first, 0), ("launch", second, 0)]
        assert all(isinstance(c.payload, LaunchOrder) and c.payload.gpu_uuids for c in taken)
        with b.begin():
            assert commands.claim(b, _node(b, "n1"), reclaim_after=0) == []  # skipped
        a.commit()
        with b.begin():  # claimed a moment ago: not handed out again yet
            assert commands.claim(b, _node(b, "n1")) == []
        with b.begin():  # unacknowledged past reclaim_after: handed out again
            again = commands.claim(b, _node(b, "n1"), reclaim_after=0)
        assert [c.seq for c in again] == [c.seq for c in taken]
        with b.begin():
            assert commands.complete(b, _node(b, "n1"), taken[0].seq)
            assert not commands.complete(b, _node(b, "n1"), taken[0].seq)  # once
            assert not commands.complete(b, _node(b, "n2"), taken[1].seq)  # not n2's
    with db() as s, s.begin():  # the unacknowledged one alone
        assert [c.job_id for c in commands.claim(s, _node(s, "n1"), reclaim_after=0)] == [second]
    assert _job(db, first).launched_at is not None and _job(db, second).launched_at is None
    with db() as s, s.begin():
        assert commands.claim(s, _node(s, "n1")) == []  # claimed a moment ago
        agents.register_node(s, _inventory("n1"))  # its agent started anew
    with db() as s, s.begin():  # so what it claimed comes back at once
        assert [(c.kind, c.job_id) for c in commands.claim(s, _node(s, "n1"))] == [
            ("launch", second)]


def test_commands_carry_the_run_and_close_with_it(db: sessionmaker[Session]) -> None:
    job_id = _submit(db, gpus=1, time_limit=600)
    _start(db, Start(job_id, "n1", ("n1-0",)))
    with db() as s, s.begin():
        assert jobs.signal_job(s, job_id, ALICE, 10)[1] == {"n1"}
        jobupdate.update_job(s, job_id, ALICE, {"time_limit": 300})
    with db() as s, s.begin():
        taken = commands.claim(s, _node(s, "n1"))
    began = _job(db, job_id).start_time
    assert began is not None
    assert [(c.kind, c.run, c.payload) for c in taken[1:]] == [
        ("signal", 0, SignalJob(10)), ("limit", 0, LimitJob(300, began.timestamp() + 300))]
    with db() as s, s.begin():
        jobs.requeue_job(s, job_id, ALICE)  # stop it, then back to the queue
    assert _kinds(db, "n1") == [("cancel", job_id, 0)]
    assert _end(db, job_id, "n1", outcome="cancelled", run=0) == (True, False)
    requeued = _job(db, job_id)
    assert (requeued.state, requeued.restarts) == ("PENDING", 1)
    with db() as s:  # nothing of run 0 is left open
        assert s.scalar(select(func.count()).select_from(NodeCommand).where(
            NodeCommand.done_at.is_(None))) == 0
    _start(db, Start(job_id, "n2", ("n2-0",)))
    with db() as s, s.begin():
        jobs.signal_job(s, job_id, ALICE, 12)
    with db() as s, s.begin():  # run 1 ends before the agent took the signal
        s.execute(update(Job).where(Job.id == job_id).values(time_limit=5))
    assert _end(db, job_id, "n2", outcome="timeout", run=1) == (True, False)
    assert _kinds(db, "n2") == []  # the launch and the signal of an ended run: closed
    # A late end of run 0 changes nothing, and says so.
    assert _end(db, job_id, "n1", outcome="failed", run=0) == (False, True)
    assert _job(db, job_id).state == "TIMEOUT"


def test_a_stale_end_cannot_end_the_current_run_on_the_same_node(
        db: sessionmaker[Session]) -> None:
    job_id = _submit(db, gpus=1)
    _start(db, Start(job_id, "n1", ("n1-0",)))
    with db() as s, s.begin():
        s.execute(update(Node).where(Node.name == "n1").values(
            last_seen=datetime.now(UTC) - timedelta(minutes=5)))
    with db() as s, s.begin():
        lost = node_failure.fail_silent_nodes(s, 60)
    assert (lost.nodes, lost.requeued) == (["n1"], [job_id])
    with db() as s, s.begin():
        agents.register_node(s, _inventory("n1"))
    _start(db, Start(job_id, "n1", ("n1-1",)))  # run 1, back on the same node
    assert _end(db, job_id, "n1", outcome="failed", exit_code=1, run=0) == (False, True)
    job = _job(db, job_id)
    assert (job.state, job.restarts, job.node_id is not None) == ("RUNNING", 1, True)
    assert _end(db, job_id, "n1", run=1) == (True, False)
    assert _job(db, job_id).state == "COMPLETED"


def test_a_silent_node_loses_its_jobs_each_the_way_it_should(
        db: sessionmaker[Session]) -> None:
    again = _submit(db, gpus=1)
    never = _submit(db, requeue=False)
    cancelled = _submit(db)
    spread = _submit(db, gpus=2, nodes=2)  # its batch script runs on n2
    _start(db, Start(again, "n1", ("n1-0",)), Start(never, "n1", ()),
           Start(cancelled, "n1", ()),
           Start(spread, "n2", ("n2-0", "n1-1"), nodes=("n2", "n1")))
    with db() as s, s.begin():
        jobs.cancel_job(s, cancelled, ALICE)
    with db() as s, s.begin():
        s.execute(update(Node).where(Node.name == "n1").values(
            last_seen=datetime.now(UTC) - timedelta(seconds=61)))
        assert node_failure.fail_silent_nodes(s, 62).nodes == []  # not silent long enough
    with db() as s, s.begin():
        lost = node_failure.fail_silent_nodes(s, 60)
    assert lost.nodes == ["n1"] and lost.kill_on == {"n2"}
    assert (sorted(lost.requeued), lost.node_failed, lost.cancelled) == (
        sorted([again, spread]), [never], [cancelled])
    assert [(j.state, j.restarts, j.node_id) for j in map(lambda i: _job(db, i), (again, spread))
            ] == [("PENDING", 1, None), ("PENDING", 1, None)]
    assert _job(db, again).error_message == "requeued after NODE_FAIL: node n1 failed (NotResponding)"
    failed = _job(db, never)
    assert (failed.state, failed.end_time is not None, failed.error_message) == (
        "NODE_FAIL", True, "node n1 failed (NotResponding)")
    assert _job(db, cancelled).state == "CANCELLED"
    with db() as s:
        n1 = _node(s, "n1")
        assert (n1.state, n1.reason, n1.lost_at is not None) == ("DOWN", "NotResponding", True)
        assert s.scalar(select(func.count()).select_from(Allocation).where(
            Allocation.released_at.is_(None))) == 0
        assert _node(s, "n2").state == "UP"
    assert _kinds(db, "n2")[-1] == ("kill", spread, 0)  # its batch script on n2 must stop
    with db() as s, s.begin(), pytest.raises(NotFound, match="must register again"):
        agents.heartbeat(s, "n1")
    with db() as s, s.begin():  # later passes never count it twice
        assert node_failure.fail_silent_nodes(s, 60).nodes == []
    # The requeued job runs again, on n2 alone, as its next run.
    with db() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        assert "n1" not in {n.name for n in snapshot.nodes if n.state.value == "UP"}
    _start(db, Start(again, "n2", ("n2-1",)))
    assert _kinds(db, "n2") == [("launch", again, 1)]


def test_a_drained_node_that_goes_silent_stays_drained(db: sessionmaker[Session]) -> None:
    from gpusched.db.health import set_node_state

    with db() as s, s.begin():
        set_node_state(s, "n1", True, "bad fan")
        s.execute(update(Node).where(Node.name == "n1").values(
            last_seen=datetime.now(UTC) - timedelta(minutes=5)))
    with db() as s, s.begin():
        assert node_failure.fail_silent_nodes(s, 60).nodes == ["n1"]
    with db() as s, s.begin(), pytest.raises(NotFound):
        agents.heartbeat(s, "n1")  # lost all the same: it must register again
    with db() as s, s.begin():
        agents.register_node(s, _inventory("n1"))
    with db() as s:
        n1 = _node(s, "n1")
        assert (n1.state, n1.reason, n1.lost_at) == ("DRAIN", "bad fan", None)


def test_a_node_that_comes_back_is_told_to_kill_the_runs_it_no_longer_has(
        db: sessionmaker[Session]) -> None:
    moved, kept = _submit(db, gpus=1), _submit(db, gpus=1)
    _start(db, Start(moved, "n1", ("n1-0",)), Start(kept, "n2", ("n2-0",)))
    with db() as s, s.begin():
        s.execute(update(Node).where(Node.name == "n1").values(
            last_seen=datetime.now(UTC) - timedelta(minutes=5)))
        node_failure.fail_silent_nodes(s, 60)
    _start(db, Start(moved, "n2", ("n2-1",)))  # its run 1 runs on n2
    with db() as s, s.begin():
        n1 = agents.register_node(s, _inventory("n1"))
        # n1 still runs run 0 of `moved`, and claims `kept` (n2's) and a job never seen.
        stale = node_failure.fence_runs(s, n1, node_failure.parse_runs([
            {"job_id": moved, "run": 0}, {"job_id": kept, "run": 0},
            {"job_id": 999_999, "run": 0}]))
    assert stale == [(moved, 0), (kept, 0), (999_999, 0)]
    assert _kinds(db, "n1") == [("kill", moved, 0), ("kill", kept, 0)]
    assert _kinds(db, "n2")[:1] == [("launch", kept, 0)]  # n2's runs are untouched
    with db() as s, s.begin():
        n2 = agents.register_node(s, _inventory("n2"))
        assert node_failure.fence_runs(s, n2, [(moved, 1), (kept, 0)]) == []


@pytest.mark.parametrize("runs", [
    {"job_id": 1, "run": 0}, [{"job_id": 0, "run": 0}], [{"job_id": 1, "run": -1}],
    [{"job_id": 1, "run": True}], [{"job_id": 1}], [{"job_id": 1, "run": 0, "x": 1}],
    [[1, 0]], [{"job_id": 1, "run": 0}] * 10_001])
def test_a_bad_list_of_runs_is_refused(runs: object) -> None:
    with pytest.raises(UsageError, match="runs: expected"):
        node_failure.parse_runs(runs)


def test_migration_0014_turns_work_in_flight_into_commands_and_back(
        postgres: ScratchPostgres) -> None:
    """Jobs running across the upgrade keep working: what the agent had not yet been
    told (a launch, a cancel, a signal, a new limit) becomes commands; a downgrade
    turns open signals and limits back into flags."""
    url = postgres.empty_database()
    upgrade(url, "0013")
    engine = make_engine(url, pool_size=1)
    try:
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO partitions (name) VALUES ('gpu'); "
                "INSERT INTO nodes (id, name, state, reason) VALUES (1, 'n1', 'UP', NULL), "
                "(2, 'n2', 'DOWN', 'Not responding'); "
                "INSERT INTO job_scripts (id, script) VALUES (1, 'true'); "
                "INSERT INTO jobs (id, name, uid, gid, user_name, partition, script_id, "
                "work_dir, state, node_id, restarts, launched_at, cancel_requested_at, "
                "signal_pending, signal_seq, limit_seq, time_limit) VALUES "
                "(1, 'new', 1, 1, 'u', 'gpu', 1, '/w', 'RUNNING', 1, 2, NULL, NULL, NULL, 0, 0, NULL),"
                "(2, 'stop', 1, 1, 'u', 'gpu', 1, '/w', 'RUNNING', 1, 0, now(), now(), NULL, 0, 0, NULL),"
                "(3, 'sig', 1, 1, 'u', 'gpu', 1, '/w', 'RUNNING', 1, 0, now(), NULL, 10, 3, 2, 60),"
                "(4, 'old', 1, 1, 'u', 'gpu', 1, '/w', 'COMPLETED', 1, 0, now(), NULL, 10, 1, 0, NULL)"))
        upgrade(url, "0014")
        with engine.begin() as conn:
            made = conn.execute(text("SELECT job_id, run, kind, payload FROM node_commands "
                                     "ORDER BY job_id, kind")).all()
            assert [tuple(row) for row in made] == [
                (1, 2, "launch", {}), (2, 0, "cancel", {}), (3, 0, "limit", {"time_limit": 60}),
                (3, 0, "signal", {"signal": 10})]
            assert conn.execute(text("SELECT state, reason, lost_at IS NOT NULL FROM nodes "
                                     "ORDER BY id")).all() == [
                ("UP", None, False), ("DOWN", "NotResponding", True)]
        downgrade(url, "0013")
        with engine.begin() as conn:
            assert conn.execute(text("SELECT id, signal_pending, limit_seq FROM jobs "
                                     "ORDER BY id")).all() == [
                (1, None, 0), (2, None, 0), (3, 10, 1), (4, None, 0)]
            assert conn.execute(text("SELECT reason FROM nodes WHERE id = 2")).scalar() == \
                "Not responding"
    finally:
        engine.dispose()


def test_a_start_on_a_node_given_up_since_the_snapshot_is_skipped(
        db: sessionmaker[Session]) -> None:
    """The pass reads its snapshot in several statements: it may see a node UP and,
    a moment later, the jobs that node's failure put back in the queue."""
    single, array = _submit(db, gpus=1), _submit(db, gpus=1, array="0-1")
    with db() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
    with db() as s, s.begin():
        s.execute(update(Node).where(Node.name == "n1").values(
            last_seen=datetime.now(UTC) - timedelta(minutes=5)))
        assert node_failure.fail_silent_nodes(s, 60).nodes == ["n1"]
    plan = Plan(starts=(Start(single, "n1", ("n1-0",)),
                        Start(array, "n2", ("n2-0",), array_task_id=0),
                        Start(array, "n1", ("n1-1",), array_task_id=1)))
    with db() as s, s.begin():
        assert apply_plan(s, snapshot, plan, node_ids) == set()
    assert [_job(db, j).state for j in (single, array)] == ["PENDING", "PENDING"]
    assert _job(db, array).array_tasks == "0-1"  # neither task split off
    with db() as s:
        assert s.scalar(select(func.count()).select_from(Allocation)) == 0
        assert s.scalar(select(func.count()).select_from(NodeCommand)) == 0


def test_a_launch_ack_and_the_jobs_end_racing_never_deadlock(db: sessionmaker[Session]) -> None:
    """A short job's "done" for its launch and its end report arrive together, on two
    connections: both take the job's row before its commands, so neither waits on the
    other in a cycle (PostgreSQL would abort one with a deadlock, the agent a 500)."""
    import threading

    ids = [_submit(db, gpus=0) for _ in range(40)]
    _start(db, *(Start(job_id, "n1", ()) for job_id in ids))
    with db() as s, s.begin():
        launches = {c.job_id: c.seq for c in commands.claim(s, _node(s, "n1"),
                                                           limit=len(ids))}
    assert set(launches) == set(ids)
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def ack(job_id: int) -> None:
        with db() as s, s.begin():
            barrier.wait()
            commands.complete(s, _node(s, "n1"), launches[job_id])

    def end(job_id: int) -> None:
        with db() as s, s.begin():
            barrier.wait()
            agents.record_run_end(s, job_id, {"node": "n1", "outcome": "completed",
                                              "exit_code": 0})

    for job_id in ids:
        threads = [threading.Thread(target=lambda f=f: _run(f, job_id, errors))
                   for f in (ack, end)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert errors == []
    assert all(_job(db, job_id).state == "COMPLETED" for job_id in ids)


def _run(action: object, job_id: int, errors: list[BaseException]) -> None:
    try:
        action(job_id)  # type: ignore[operator]
    except BaseException as exc:  # collected for the assertion in the test
        errors.append(exc)
