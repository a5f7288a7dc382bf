"""``GET /v1/jobs`` (JOB objects, no ``fields``) is written by PostgreSQL as one JSON
text: it must be the text the Python-built listing encodes to, floats and all."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from gpusched.core.model import Policy
from gpusched.core.plan import plan
from gpusched.db import job_views
from gpusched.db.schedule import apply_plan, load_snapshot
from tests.db import test_transitions
from tests.db.test_transitions import _submit

# The fixture of tests/db/test_transitions.py: partitions, and node n1 with 2 GPUs.
sessions = test_transitions.sessions


def _pass(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        apply_plan(s, snapshot, plan(snapshot, time.time(), Policy()), node_ids)


def _python_text(s: Session, query: dict[str, str]) -> bytes:
    """What the controller sends for the Python-built listing (controller/http.py)."""
    return json.dumps(job_views.list_jobs(s, query), separators=(",", ":")).encode()


def _exact(data: bytes) -> Any:
    """The JSON value with every number kept as written (5 and 5.0 differ)."""
    return json.loads(data, parse_float=lambda t: ("float", t), parse_int=lambda t: ("int", t))


def _set(sessions: sessionmaker[Session], job_id: int, **values: object) -> None:
    with sessions() as s, s.begin():
        sets = ", ".join(f"{name} = :{name}" for name in values)
        s.execute(text(f"UPDATE jobs SET {sets} WHERE id = :id"), {**values, "id": job_id})


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata"])
def test_the_database_writes_the_job_listing_exactly_as_python_does(
        sessions: sessionmaker[Session], zone: str) -> None:
    """Pending, running (with GPUs), array and ended jobs; whole and fractional floats,
    a warning signal, times with and without microseconds: the same bytes."""
    array = _submit(sessions, gpus=1, array="0-4%3")
    _pass(sessions)  # two array tasks take both GPUs
    warned = _submit(sessions, gpus=0, warn_signal={"signal": 10, "seconds": 90, "batch_only": False})
    ended = _submit(sessions, gpus=0)
    _pass(sessions)
    _set(sessions, ended, state="COMPLETED", exit_code=0, error_message="tab\there \"q\" \\")
    with sessions() as s, s.begin():
        s.execute(text("UPDATE jobs SET end_time = date_trunc('second', now()) "
                       "+ interval '2 seconds' WHERE id = :id"), {"id": ended})
    running = [row for row in _rows(sessions) if row["state"] == "RUNNING" and row["gpu_uuids"]]
    assert len(running) == 2
    _set(sessions, running[0]["job_id"], util_samples=4, util_sum=210.0, mem_sum_mb=4096.0,
         admin_priority=2.0)
    _set(sessions, running[1]["job_id"], util_samples=3, util_sum=100.0, mem_sum_mb=0.5,
         admin_priority=1e-5)
    _set(sessions, warned, admin_priority=-0.0)
    queries = [{}, {"all": "1"}, {"state": "RUNNING"}, {"ids": str(array)}, {"user": "nobody"}]
    with sessions() as s:
        s.execute(text(f"SET TIME ZONE '{zone}'"))
        for query in queries:
            built = job_views.job_list_json(s, query)
            assert built == _python_text(s, query), query
        everything = json.loads(job_views.job_list_json(s, {"all": "1"}) or b"")["jobs"]
    floats = {(j["gpu_util_avg"], j["gpu_mem_avg_mb"], j["admin_priority"]) for j in everything}
    assert {(52.5, 1024.0, 2.0), (100 / 3, 0.5 / 3, 1e-5), (None, None, -0.0)} <= floats
    assert any(j["warn_signal"] == {"signal": 10, "seconds": 90, "batch_only": False}
               for j in everything)
    assert any(j["display_id"] == f"{array}_[2-4%3]" for j in everything)
    assert all(j["gpu_uuids"] == [j["gpu_uuids"][0]] and j["node"] == "n1"
               for j in everything if j["state"] == "RUNNING" and j["gpus"])


def _rows(sessions: sessionmaker[Session]) -> list[dict[str, Any]]:
    with sessions() as s:
        return list(job_views.list_jobs(s, {"all": "1"})["jobs"])


def test_names_beyond_ascii_give_the_same_json(sessions: sessionmaker[Session]) -> None:
    """PostgreSQL writes such characters as they are, Python's json escapes them: the
    texts differ, their JSON does not."""
    job = _submit(sessions, name="quote\"and\\back slash é ☃", gpus=0)
    _set(sessions, job, error_message="\u2028 \x7f \x01 \U0001f600")
    with sessions() as s:
        built = job_views.job_list_json(s, {})
        assert built is not None and built != _python_text(s, {})
        assert _exact(built) == _exact(_python_text(s, {}))


@pytest.mark.parametrize("priority", [1e15, 3e20, float("nan"), float("inf")])
def test_a_float_python_writes_otherwise_leaves_the_listing_to_python(
        sessions: sessionmaker[Session], priority: float) -> None:
    job = _submit(sessions, gpus=0)
    _set(sessions, job, admin_priority=priority)
    with sessions() as s:
        assert job_views.job_list_json(s, {}) is None
        _set(sessions, job, admin_priority=9.5e14)
        assert job_views.job_list_json(s, {}) == _python_text(s, {})


def test_an_empty_listing(sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        assert job_views.job_list_json(s, {}) == b'{"jobs":[]}' == _python_text(s, {})
