"""Job arrays against a real database: one record, tasks split off as they start."""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from gpusched.core.model import Policy
from gpusched.core.plan import plan
from gpusched.db import agents, commands, job_views, jobs
from gpusched.db.models import Allocation, Job, JobScript, Node
from gpusched.db.schedule import apply_plan, load_snapshot
from gpusched.errors import UsageError
from gpusched.messages import LaunchOrder
from tests.db.test_transitions import ALICE, _submit, sessions  # noqa: F401  (a fixture)


def _pass(sessions: sessionmaker[Session]) -> set[str]:
    with sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        return apply_plan(s, snapshot, plan(snapshot, time.time(), Policy()), node_ids)


def _rows(sessions: sessionmaker[Session], array: int) -> list[tuple[int, str, int | None, str | None]]:
    with sessions() as s:
        return [tuple(r) for r in s.execute(  # type: ignore[misc]
            select(Job.id, Job.state, Job.array_task_id, Job.array_tasks)
            .where(Job.array_job_id == array).order_by(Job.id))]


def _end(sessions: sessionmaker[Session], job_id: int, outcome: str = "completed") -> None:
    with sessions() as s, s.begin():
        assert agents.record_end(s, job_id, {"node": "n1", "outcome": outcome, "exit_code": 0,
                                             "signal": None, "end_time": time.time()})


def test_tasks_split_off_the_record_as_they_start(sessions: sessionmaker[Session]) -> None:
    array = _submit(sessions, gpus=1, array="0-2")
    with sessions() as s:
        record = job_views.get_job(s, array, ALICE)
    assert (record["array_job_id"], record["array_tasks"], record["display_id"]) == (
        array, "0-2", f"{array}_[0-2]")
    assert _pass(sessions) == {"n1"}  # two GPUs: tasks 0 and 1 start
    rows = _rows(sessions, array)
    assert [(state, task, tasks) for _, state, task, tasks in rows] == [
        ("PENDING", None, "2"), ("RUNNING", 0, None), ("RUNNING", 1, None)]
    with sessions() as s:
        task_ids = [r[0] for r in rows[1:]]
        assert sorted(s.scalars(select(Allocation.job_id))) == task_ids
        launches = [c.payload for c in commands.claim(s, s.scalars(select(Node)).one())]
        assert all(isinstance(w, LaunchOrder) for w in launches)
        assert [(w.array_job_id, w.array_task_id, w.array_spec) for w in launches  # type: ignore[union-attr]
                ] == [(array, 0, "0-2"), (array, 1, "0-2")]
        # The tasks run the record's script, stored once for the whole array.
        assert [(w.script, w.environment) for w in launches  # type: ignore[union-attr]
                ] == [("#!/bin/sh\n", {})] * 2
        assert set(s.scalars(select(Job.script_id).where(Job.array_job_id == array))) == {
            s.get(Job, array).script_id}  # type: ignore[union-attr]
        assert s.scalar(select(func.count()).select_from(JobScript)) == 1
        assert [job_views.get_job(s, i, ALICE)["display_id"] for i in task_ids] == [
            f"{array}_0", f"{array}_1"]
    _end(sessions, rows[1][0])
    _pass(sessions)  # the last task: the record itself becomes it
    assert [(i, state, task) for i, state, task, _ in _rows(sessions, array)][0] == (
        array, "RUNNING", 2)


def test_the_cap_holds_across_passes(sessions: sessionmaker[Session]) -> None:
    array = _submit(sessions, array="0-5%1")  # no GPUs: only the cap limits it
    _pass(sessions)
    _pass(sessions)
    assert [state for _, state, _, _ in _rows(sessions, array)] == ["PENDING", "RUNNING"]
    with sessions() as s:
        assert s.get(Job, array).reason == "JobArrayTaskLimit"  # type: ignore[union-attr]


def test_a_cancel_between_snapshot_and_apply_starts_no_task(
        sessions: sessionmaker[Session]) -> None:
    array = _submit(sessions, gpus=1, array="0-3")
    with sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        decided = plan(snapshot, time.time(), Policy())
    with sessions() as s, s.begin():
        jobs.cancel_job(s, array, ALICE)
    with sessions() as s, s.begin():
        assert apply_plan(s, snapshot, decided, node_ids) == set()
    assert _rows(sessions, array) == [(array, "CANCELLED", None, "0-3")]


def test_cancelling_the_array_ends_every_task(sessions: sessionmaker[Session]) -> None:
    array = _submit(sessions, gpus=1, array="0-3")
    _pass(sessions)
    with sessions() as s, s.begin():
        job, nodes = jobs.cancel_job(s, array, ALICE)
    assert nodes == {"n1"} and job.state == "CANCELLED"
    with sessions() as s:
        asked = s.scalar(select(func.count()).where(Job.array_job_id == array,
                                                      Job.cancel_requested_at.is_not(None)))
    assert asked == 2


def test_afterok_on_an_array_waits_for_every_task(sessions: sessionmaker[Session]) -> None:
    array = _submit(sessions, gpus=1, array="0-1")
    after = _submit(sessions, dependency=f"afterok:{array}")
    _pass(sessions)
    task_ids = [i for i, state, _, _ in _rows(sessions, array) if state == "RUNNING"]
    _end(sessions, task_ids[0])
    _pass(sessions)
    with sessions() as s:
        assert s.get(Job, after).reason == "Dependency"  # type: ignore[union-attr]
    _end(sessions, task_ids[1], "failed")
    _pass(sessions)
    with sessions() as s:
        assert s.get(Job, after).reason == "DependencyNeverSatisfied"  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", ["5-1", "0-9%0", "x", 7])
def test_a_bad_array_stores_nothing(sessions: sessionmaker[Session], bad: object) -> None:
    with pytest.raises(UsageError, match="array"):
        _submit(sessions, array=bad)
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 0


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata"])
def test_the_database_writes_job_tables_exactly_as_python_does(
        sessions: sessionmaker[Session], zone: str) -> None:
    """``GET /v1/jobs?fields=`` is written by PostgreSQL when it can be: for every such
    field, over pending, running, array and ended jobs, times with and without
    microseconds, in any session time zone, it must equal the Python-built table."""
    array = _submit(sessions, gpus=1, array="0-4%3")
    plain = _submit(sessions, name="quote\"and\\back slash é ☃", gpus=0, nodes=1)
    _pass(sessions)
    ended = _submit(sessions, gpus=0)
    _pass(sessions)
    with sessions() as s, s.begin():
        s.execute(text("UPDATE jobs SET state = 'COMPLETED', end_time = date_trunc('second', "
                       "now()) + interval '2 seconds', exit_code = 0, error_message = :message "
                       "WHERE id = :id"),
                  {"id": ended, "message": "line one\nline\ttwo \x01\x1f \\ \" \u2028 \U0001f600"})
    fields = ",".join(sorted(job_views.SQL_FIELDS))
    queries = [{}, {"all": "1"}, {"state": "RUNNING"}, {"ids": str(array)},
               {"user": "nobody"}, {"ids": f"{plain},{ended}", "all": "1"}]
    with sessions() as s:
        s.execute(text(f"SET TIME ZONE '{zone}'"))
        for query in queries:
            built = job_views.job_table_json(s, {**query, "fields": fields})
            assert built is not None
            python = json.loads(json.dumps(job_views.list_jobs(s, {**query, "fields": fields})))
            assert json.loads(built) == python, query
        everything = json.loads(job_views.job_table_json(s, {"all": "1", "fields": fields}) or b"")
    rows = [dict(zip(everything["fields"], row)) for row in everything["rows"]]
    assert len(rows) == 5 and {r["state"] for r in rows} == {"PENDING", "RUNNING", "COMPLETED"}
    assert {r["display_id"] for r in rows if r["array_job_id"]} == {
        f"{array}_0", f"{array}_1", f"{array}_[2-4%3]"}
    assert any(r["end_time"] and "." not in r["end_time"] for r in rows)  # whole seconds
    assert any(r["start_time"] and "." in r["start_time"] for r in rows)
    assert any(r["node"] == "n1" for r in rows)
    assert any(r["error_message"] and "\U0001f600" in r["error_message"] for r in rows)
    assert job_views.job_table_json(s, {"fields": "job_id,gpu_uuids"}) is None
