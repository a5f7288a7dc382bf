"""A job's end as agents report it (for a run, ``run`` given) against a real database:
recorded in one statement when the run ends plainly, it writes exactly what the same
end worked out from the job's whole row writes (the job, its GPUs, its commands, its
steps, the node's drain), whatever the end and whatever the job was doing."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.core.model import Plan, Preemption, Start
from gpusched.db import agents, jobs, steps, submit
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.models import Job
from gpusched.db.partitions import sync_partitions
from gpusched.db.schedule import apply_plan, load_snapshot
from gpusched.errors import NotFound
from gpusched.messages.steps import StepIO, StepRequest

ALICE = jobs.Identity(1000, 1000)
WHEN = time.time() - 5.0
Prep = Callable[[sessionmaker[Session], int], None]


@pytest.fixture
def db(db_url: str) -> Iterator[sessionmaker[Session]]:
    """Nodes n1 and n2 with two GPUs and 8 CPUs each."""
    engine = make_engine(db_url, pool_size=4)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),))
        for name in ("n1", "n2"):
            agents.register_node(s, {"node": name, "uid": 0, "cpus": 8, "gpus": [
                {"index": i, "uuid": f"{name}-{i}"} for i in range(2)]})
    yield factory
    engine.dispose()


def _sql(statement: str, **params: Any) -> Prep:
    def run(db: sessionmaker[Session], job_id: int) -> None:
        with db() as s, s.begin():
            s.execute(text(statement), {"job": job_id, **params})
    return run


def _steps(*requests: dict[str, Any]) -> Prep:
    def run(db: sessionmaker[Session], job_id: int) -> None:
        for fields in requests:
            with db() as s, s.begin():
                steps.create_step(s, job_id, StepRequest(
                    argv=("/bin/true",), work_dir="/tmp",
                    io=StepIO("127.0.0.1", 40_000, "ab" * 32), **fields), ALICE)
    return run


def _cancelled(db: sessionmaker[Session], job_id: int) -> None:
    with db() as s, s.begin():
        jobs.cancel_job(s, job_id, ALICE)


def _ended_before(db: sessionmaker[Session], job_id: int) -> None:
    with db() as s, s.begin():
        assert agents.record_run_end(s, job_id, {"node": "n1", "run": 0,
                                                 "outcome": "completed", "exit_code": 0})


def _bad_exit(db: sessionmaker[Session], job_id: int) -> None:
    with db() as s, s.begin():
        steps.cancel_step(s, job_id, 0, ALICE, bad_exit=True)


# The job's run started 61 s before the end reported (WHEN), with a limit of ``limit`` s.
PAST = ("UPDATE jobs SET start_time = to_timestamp(:when) - interval '61 seconds',"
        " time_limit = :limit WHERE id = :job")
SUSPENDED = "UPDATE jobs SET suspended_seconds = :seconds WHERE id = :job"
PREEMPTED = ("UPDATE jobs SET preempted_at = now(), cancel_requested_at = now(),"
             " preempt_mode = :mode, preempted_by = 7 WHERE id = :job")

# (name, job's nodes, interactive, what happens to it first, the report, plain)
CASES: list[tuple[str, tuple[str, ...], bool, tuple[Prep, ...], dict[str, Any], bool]] = [
    ("completed", ("n1",), False, (), {"outcome": "completed", "exit_code": 0}, True),
    ("failed", ("n1",), False, (), {"outcome": "failed", "exit_code": 3, "error": "boom"},
     True),
    ("launch_failed", ("n1",), False, (), {"outcome": "launch_failed", "error": "no user"},
     True),
    ("timeout", ("n1",), False, (), {"outcome": "timeout", "signal": 15}, True),
    ("measured", ("n1",), False, (), {"outcome": "out_of_memory", "signal": 9,
                                      "max_rss_bytes": 1 << 40, "cpu_usec": 456}, True),
    ("cpu only", ("n1",), False, (_sql("UPDATE jobs SET max_rss_bytes = 99 WHERE id = :job"),),
     {"outcome": "completed", "exit_code": 0, "cpu_usec": 7}, True),
    ("no end time", ("n1",), False, (), {"outcome": "completed", "exit_code": 0,
                                         "end_time": None}, True),
    ("epilog failed", ("n1",), False, (), {"outcome": "completed", "exit_code": 0,
                                           "epilog_error": "disk full\nmore"}, True),
    ("failed past its limit", ("n1",), False, (_sql(PAST, when=WHEN, limit=60),),
     {"outcome": "failed", "exit_code": 1}, True),
    ("failed within its limit", ("n1",), False, (_sql(PAST, when=WHEN, limit=62),),
     {"outcome": "failed", "exit_code": 1}, True),
    ("failed past its limit, suspended", ("n1",), False,
     (_sql(PAST, when=WHEN, limit=60), _sql(SUSPENDED, seconds=5)),
     {"outcome": "failed", "exit_code": 1}, True),
    ("being cancelled", ("n1",), False, (_cancelled,), {"outcome": "cancelled", "signal": 15},
     True),
    ("steps", ("n1", "n2"), False, (_steps({}, {"overlap": True}),),
     {"outcome": "completed", "exit_code": 0}, True),
    ("steps timeout", ("n1", "n2"), False, (_steps({"nodes": 1}),),
     {"outcome": "timeout", "signal": 15}, True),
    ("bad exit step", ("n1", "n2"), False, (_steps({"kill_on_bad_exit": True}), _bad_exit),
     {"outcome": "completed", "exit_code": 0}, True),
    ("allocation", ("n1", "n2"), True, (), {"outcome": "cancelled"}, True),
    ("gpu failed", ("n1",), False, (_sql("UPDATE jobs SET gpu_failure = 'GPU n1-0 failed'"
                                         " WHERE id = :job"),),
     {"outcome": "failed", "signal": 9}, False),
    ("gpu failed, no requeue", ("n1",), False, (_sql(
        "UPDATE jobs SET gpu_failure = 'GPU n1-0 failed', requeue = false WHERE id = :job"),),
     {"outcome": "failed", "signal": 9}, False),
    ("preempted", ("n1",), False, (_sql(PREEMPTED, mode="cancel"),),
     {"outcome": "cancelled", "signal": 15}, False),
    ("preempted to requeue", ("n1",), False, (_sql(PREEMPTED, mode="requeue"),),
     {"outcome": "cancelled", "signal": 15}, False),
    ("preempted allocation", ("n1",), True, (_sql(PREEMPTED, mode="requeue"),),
     {"outcome": "cancelled"}, False),
    ("prolog failed", ("n1",), False, (), {"outcome": "prolog_failed", "error": "no mount"},
     False),
    ("prolog failed, cancelled", ("n1",), False, (_cancelled,),
     {"outcome": "prolog_failed"}, False),
    ("not started", ("n1",), False, (), {"outcome": "not_started",
                                         "error": "job supervisor lost before it started"},
     False),
    ("not started, cancelled", ("n1",), False, (_cancelled,), {"outcome": "not_started"},
     False),
    ("ended before", ("n1",), False, (_ended_before,), {"outcome": "failed", "exit_code": 1},
     False),
    ("another run", ("n1",), False, (), {"outcome": "completed", "run": 1}, False),
    ("another node", ("n1",), False, (), {"outcome": "completed", "node": "n2",
                                          "epilog_error": "gone"}, False),
]


def _start(db: sessionmaker[Session], nodes: tuple[str, ...], index: int,
           interactive: bool) -> int:
    body: dict[str, Any] = {"work_dir": "/tmp", "gpus": len(nodes), "nodes": len(nodes)}
    if interactive:
        body["interactive"] = True
    else:
        body["script"] = "#!/bin/sh\n"
    with db() as s, s.begin():
        job_id = submit.submit_job(s, body, ALICE).id
    with db() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        apply_plan(s, snapshot, Plan(starts=(Start(
            job_id, nodes[0], tuple(f"{n}-{index}" for n in nodes), nodes=nodes),)), node_ids)
    return job_id


def _view(db: sessionmaker[Session], job_id: int, given_end: bool) -> dict[str, Any]:
    """All an end writes, with times and GPU numbers left out."""
    with db() as s:
        job = s.execute(text(
            "SELECT state, reason, exit_code, signal, error_message,"
            " node_id, node_names, restarts, max_rss_bytes, cpu_usec, start_time IS NULL,"
            " launched_at IS NULL, cancel_requested_at IS NULL, gpu_failure,"
            " preempted_at IS NULL, preempt_mode, start_kind, end_time IS NULL,"
            " abs(extract(epoch FROM end_time) - :when) < 0.001 FROM jobs WHERE id = :job"),
            {"job": job_id, "when": WHEN}).one()
        held = s.execute(text("SELECT count(*), count(released_at) FROM allocations"
                              " WHERE job_id = :job"), {"job": job_id}).one()
        made = s.execute(text(
            "SELECT c.kind, c.run, n.name, c.done_at IS NULL FROM node_commands c"
            " JOIN nodes n ON n.id = c.node_id WHERE c.job_id = :job"
            " ORDER BY c.kind, n.name, c.id"), {"job": job_id}).all()
        ended = s.execute(text(
            "SELECT step_id, state, error, end_time IS NULL, exit_code FROM job_steps"
            " WHERE job_id = :job ORDER BY step_id"), {"job": job_id}).all()
        nodes = s.execute(text("SELECT name, state, reason, drained_by FROM nodes"
                               " ORDER BY name")).all()
    return {"job": tuple(job)[:-1] + ((job[-1] if given_end else None),),
            "allocations": tuple(held), "commands": made, "steps": ended, "nodes": nodes}


def _end(db: sessionmaker[Session], job_id: int, report: dict[str, Any],
         whole_row: bool) -> tuple[tuple[bool, bool], bool]:
    """End ``job_id`` as ``report`` says: the result, and whether the job's row was read
    to work the end out."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    with db() as s, s.begin():
        # A session holding the job: the end is worked out from its row.
        held = s.get(Job, job_id) if whole_row else None
        engine = s.get_bind()
        event.listen(engine, "before_cursor_execute", record)
        try:
            result = agents.record_run_end(s, job_id, report)
        finally:
            event.remove(engine, "before_cursor_execute", record)
        assert held is None or held.id == job_id
    return result, any(statement.startswith("SELECT jobs.") for statement in seen)


@pytest.mark.parametrize(("nodes", "interactive", "prep", "fields", "plain"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_an_end_writes_what_the_whole_row_would(
        db: sessionmaker[Session], nodes: tuple[str, ...], interactive: bool,
        prep: tuple[Prep, ...], fields: dict[str, Any], plain: bool) -> None:
    report = {"node": "n1", "run": 0, "end_time": WHEN, **fields}
    views, results = [], []
    for index, whole_row in enumerate((False, True)):
        job_id = _start(db, nodes, index, interactive)
        for step in prep:
            step(db, job_id)
        result, read_row = _end(db, job_id, report, whole_row)
        results.append(result)
        assert read_row == (not plain and not whole_row)
        views.append(_view(db, job_id, report["end_time"] is not None))
        with db() as s, s.begin():  # the next job starts on nodes as they were
            s.execute(text("UPDATE nodes SET state = 'UP', reason = NULL, drained_by = NULL"))
    assert results[0] == results[1]
    assert views[0] == views[1]
    if plain:
        assert results[0] == (True, False)


def test_an_unknown_node_or_job(db: sessionmaker[Session]) -> None:
    job_id = _start(db, ("n1",), 0, False)
    for whole_row in (False, True):
        with pytest.raises(NotFound, match="unknown node 'n9': the agent must register"):
            _end(db, job_id, {"node": "n9", "run": 0, "outcome": "completed"}, whole_row)
    assert _end(db, job_id + 1, {"node": "n1", "run": 0, "outcome": "completed"},
                False) == ((False, True), True)
    with db() as s:
        assert s.scalar(text("SELECT state FROM jobs WHERE id = :job"),
                        {"job": job_id}) == "RUNNING"


@pytest.mark.parametrize(("requeue", "partition_requeue", "mode", "state", "restarts"), [
    (None, True, "requeue", "PENDING", 1),
    (True, False, "requeue", "PENDING", 1),
    (False, True, "cancel", "CANCELLED", 0),  # --no-requeue: cancelled, never run twice
    (None, False, "cancel", "CANCELLED", 0),  # its partition's default: the same
])
def test_a_preemption_to_requeue_cancels_a_job_that_may_not_be_requeued(
        db: sessionmaker[Session], requeue: bool | None, partition_requeue: bool,
        mode: str, state: str, restarts: int) -> None:
    with db() as s, s.begin():
        s.execute(text("UPDATE partitions SET requeue = :r"), {"r": partition_requeue})
        job_id = submit.submit_job(s, {"work_dir": "/tmp", "gpus": 1, "script": "#!/bin/sh\n",
                                       "requeue": requeue}, ALICE).id
    with db() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        apply_plan(s, snapshot, Plan(starts=(Start(job_id, "n1", ("n1-0",)),)), node_ids)
    with db() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        apply_plan(s, snapshot, Plan(preemptions=(Preemption(job_id, 7, "requeue"),)),
                   node_ids)
    with db() as s:
        assert s.execute(text("SELECT preempt_mode FROM jobs WHERE id = :job"),
                         {"job": job_id}).scalar_one() == mode
    _end(db, job_id, {"node": "n1", "run": 0, "end_time": WHEN, "outcome": "cancelled",
                      "exit_code": None, "signal": 15}, False)
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None and (job.state, job.restarts) == (state, restarts)


@pytest.mark.parametrize(("limit", "suspended", "fields", "cancelled", "state"), [
    (60, 0, {"outcome": "failed", "exit_code": 1}, False, "TIMEOUT"),
    (61, 0, {"outcome": "failed", "signal": 15}, False, "TIMEOUT"),  # at the limit itself
    (62, 0, {"outcome": "failed", "exit_code": 1}, False, "FAILED"),
    (60, 5, {"outcome": "failed", "exit_code": 1}, False, "FAILED"),  # suspended 5 s of it
    (None, 0, {"outcome": "failed", "exit_code": 1}, False, "FAILED"),
    (60, 0, {"outcome": "completed", "exit_code": 0}, False, "COMPLETED"),
    (60, 0, {"outcome": "launch_failed", "error": "no user"}, False, "FAILED"),
    (60, 0, {"outcome": "failed", "exit_code": 1}, True, "CANCELLED"),
])
def test_a_run_that_fails_past_its_time_limit_ends_timeout(
        db: sessionmaker[Session], limit: int | None, suspended: int, fields: dict[str, Any],
        cancelled: bool, state: str) -> None:
    # A limit lowered below what a job has run reaches its nodes at moments apart: a
    # task killed on another node can make the batch script fail before its own node's
    # timeout does. Failing at or past the limit is the limit's doing, as Slurm has it.
    for index, whole_row in enumerate((False, True)):
        job_id = _start(db, ("n1",), index, False)
        _sql(PAST, when=WHEN, limit=limit)(db, job_id)
        _sql(SUSPENDED, seconds=suspended)(db, job_id)
        if cancelled:
            _cancelled(db, job_id)
        _end(db, job_id, {"node": "n1", "run": 0, "end_time": WHEN, **fields}, whole_row)
        with db() as s:
            assert s.get(Job, job_id).state == state  # type: ignore[union-attr]
