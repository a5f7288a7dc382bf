"""What a pass knows of the jobs a dependency names, read from a real database: an
array's tasks one by one (``afterok:12_3``, ``aftercorr``), those not split off yet as
PENDING, and when each began (``after:ID+MIN``); an array has begun only once all of
its tasks have."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from gpusched.core.model import JobState, Plan, Start
from gpusched.db import submit
from gpusched.db.schedule import apply_plan, load_snapshot
from tests.db.node import ALICE, node_sessions

GPUS = [{"index": 0, "uuid": "GPU-0"}, {"index": 1, "uuid": "GPU-1"}]
C, R, P = JobState.COMPLETED, JobState.RUNNING, JobState.PENDING


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    with node_sessions(db_url, GPUS) as factory:
        yield factory


def _submit(sessions: sessionmaker[Session], **body: object) -> int:
    with sessions() as s, s.begin():
        return submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", "gpus": 1,
                                     **body}, ALICE).id


def test_array_tasks_and_begin_times(sessions: sessionmaker[Session]) -> None:
    array = _submit(sessions, array="0-3")
    after = _submit(sessions, dependency=f"after:{array}+1?afterok:{array}_0")
    corr = _submit(sessions, array="0-3", dependency=f"aftercorr:{array}")
    other = _submit(sessions, array="0-99")
    _submit(sessions, dependency=f"afterok:{other}")  # the whole array: no task listed
    with sessions() as s:
        snapshot, _ = load_snapshot(s)
    assert snapshot.job_states[array] is P
    assert {snapshot.job_states[(array, t)] for t in range(4)} == {P}
    assert snapshot.job_states[other] is P and (other, 0) not in snapshot.job_states
    assert array not in snapshot.job_began
    with sessions() as s, s.begin():  # tasks 0 and 1 start
        snapshot, node_ids = load_snapshot(s)
        apply_plan(s, snapshot, Plan(starts=(Start(array, "n1", ("GPU-0",), 0),
                                             Start(array, "n1", ("GPU-1",), 1))), node_ids)
    with sessions() as s, s.begin():
        s.execute(text("UPDATE jobs SET state = 'COMPLETED', end_time = now() "
                       "WHERE array_job_id = :a AND array_task_id = 0"), {"a": array})
    with sessions() as s:
        snapshot, _ = load_snapshot(s)
    states, began = snapshot.job_states, snapshot.job_began
    assert [states[(array, t)] for t in range(4)] == [C, R, P, P]
    assert states[array] is R and array not in began  # tasks 2 and 3 have not begun
    assert (array, 1) in began and (array, 2) not in began
    by_id = {p.job_id: p for p in snapshot.pending}
    assert {after, corr} <= set(by_id)
    assert by_id[after].dependency == f"after:{array}+1?afterok:{array}_0"
    from gpusched.core.dependency import task_reason, waiting_reason

    assert waiting_reason(by_id[after], snapshot, False, began[(array, 1)]) is None  # afterok:A_0
    assert waiting_reason(by_id[corr], snapshot, False, began[(array, 1)]) is None  # task 0
    assert task_reason(by_id[corr], 1, snapshot, 0.0) is not None  # task 1 runs still
