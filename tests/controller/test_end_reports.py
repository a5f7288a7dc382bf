"""``POST /agent/v1/jobs/ended``: an agent reports the ends of several runs in one
request, through the controller's real API on a real Unix socket against a real
database; each is recorded once, a report for a run not that node's is stale, and a
bad list is one 400 that records nothing."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpusched.client import ApiClient
from gpusched.controller.api import Api
from gpusched.controller.events import Events
from gpusched.controller.http import UnixHttpServer
from gpusched.core.bounds import MAX_ENDS_REPORTED
from gpusched.db import agents
from gpusched.db.models import Job
from gpusched.errors import GpuschedError
from tests.db.node import node_sessions, start_on

WITHIN = 10.0
GPUS = [{"index": i, "uuid": f"GPU-{i}"} for i in range(2)]


@pytest.fixture
def served(db_url: str) -> Iterator[tuple[sessionmaker[Session], ApiClient, Events]]:
    with node_sessions(db_url, GPUS) as sessions:
        with sessions() as s, s.begin():
            agents.register_node(s, {"node": "n2", "uid": 0, "gpus": []})
        folder = Path(tempfile.mkdtemp(prefix="gpusched-ends-"))
        events = Events()
        server = UnixHttpServer(folder / "api.sock", Api(sessions, events, lambda: True).router())
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                  daemon=True)
        thread.start()
        try:
            with ApiClient(server.path, timeout=WITHIN) as client:
                yield sessions, client, events
        finally:
            server.shutdown()
            server.server_close()
            thread.join(WITHIN)
            folder.rmdir()


def _end(job_id: int, node: str = "n1", **fields: Any) -> dict[str, Any]:
    return {"job_id": job_id, "node": node, "run": 0, "outcome": "completed",
            "exit_code": 0, "signal": None, "end_time": time.time(), "error": None, **fields}


def _states(sessions: sessionmaker[Session]) -> dict[int, str]:
    with sessions() as s:
        return dict(s.execute(select(Job.id, Job.state)).all())


def test_several_ends_are_recorded_in_one_request_once(
        served: tuple[sessionmaker[Session], ApiClient, Events]) -> None:
    sessions, client, events = served
    jobs = [start_on(sessions, (f"GPU-{i}",)) for i in range(2)]
    events.scheduler.clear()
    answer = client.request("POST", "/agent/v1/jobs/ended", {
        "node": "n1", "ends": [_end(jobs[1], exit_code=3, outcome="failed"), _end(jobs[0])]})
    assert answer["ended"] == [{"job_id": jobs[1], "changed": True, "stale": False},
                               {"job_id": jobs[0], "changed": True, "stale": False}]
    assert _states(sessions) == {jobs[0]: "COMPLETED", jobs[1]: "FAILED"}
    assert events.scheduler.is_set()  # the freed GPUs are scheduled at once
    again = client.request("POST", "/agent/v1/jobs/ended",
                           {"node": "n1", "ends": [_end(jobs[0])]})
    assert again["ended"] == [{"job_id": jobs[0], "changed": False, "stale": False}]


def test_a_run_not_on_that_node_is_stale(
        served: tuple[sessionmaker[Session], ApiClient, Events]) -> None:
    sessions, client, _ = served
    job = start_on(sessions, ("GPU-0",))
    answer = client.request("POST", "/agent/v1/jobs/ended",
                            {"node": "n2", "ends": [_end(job, node="n2")]})
    assert answer["ended"] == [{"job_id": job, "changed": False, "stale": True}]
    assert _states(sessions) == {job: "RUNNING"}


@pytest.mark.parametrize(("ends", "needle"), [
    ([], "ends: expected 1 to"),
    ("x", "ends: expected 1 to"),
    ([_end(1)] * (MAX_ENDS_REPORTED + 1), "ends: expected 1 to"),
    (["x"], "ends: expected objects"),
    ([{**_end(1), "job_id": True}], "job_id: expected a job id"),
    ([{**_end(1), "job_id": 0}], "job_id: expected a job id"),
    ([_end(1, node="n2")], "the report is for n2"),
    ([_end(1), _end(1, outcome="exploded")], "outcome"),
])
def test_a_bad_list_is_refused_and_records_nothing(
        served: tuple[sessionmaker[Session], ApiClient, Events], ends: Any, needle: str
) -> None:
    sessions, client, _ = served
    job = start_on(sessions, ("GPU-0",))
    assert job == 1
    with pytest.raises(GpuschedError) as refused:
        client.request("POST", "/agent/v1/jobs/ended", {"node": "n1", "ends": ends})
    assert refused.value.http_status == 400 and needle in refused.value.message, \
        refused.value.message
    assert _states(sessions) == {job: "RUNNING"}
