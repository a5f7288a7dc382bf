"""``POST /agent/v1/commands/done``: an agent acknowledges the commands of a work answer
in one request, through the controller's real API on a real Unix socket against a real
database; each is done once, only its own node's count, and a bad list is one 400
that changes nothing."""

from __future__ import annotations

import tempfile
import threading
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
from gpusched.core.bounds import MAX_ACKS_IN_POLL, MAX_COMMANDS_ACKED
from gpusched.db import agents
from gpusched.db.models import Job, NodeCommand
from gpusched.errors import GpuschedError
from tests.db.node import node_sessions, start_on

WITHIN = 10.0
GPUS = [{"index": i, "uuid": f"GPU-{i}"} for i in range(2)]


@pytest.fixture
def served(db_url: str) -> Iterator[tuple[sessionmaker[Session], ApiClient]]:
    with node_sessions(db_url, GPUS) as sessions:
        with sessions() as s, s.begin():
            agents.register_node(s, {"node": "n2", "uid": 0, "gpus": []})
        folder = Path(tempfile.mkdtemp(prefix="gpusched-acks-"))
        server = UnixHttpServer(folder / "api.sock", Api(sessions, Events(), lambda: True).router())
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                  daemon=True)
        thread.start()
        try:
            with ApiClient(server.path, timeout=WITHIN) as client:
                yield sessions, client
        finally:
            server.shutdown()
            server.server_close()
            thread.join(WITHIN)
            folder.rmdir()


def _launched(sessions: sessionmaker[Session]) -> dict[int, bool]:
    with sessions() as s:
        return {job_id: at is not None for job_id, at in s.execute(select(Job.id, Job.launched_at))}


def _open(sessions: sessionmaker[Session]) -> int:
    with sessions() as s:
        return len(s.scalars(select(NodeCommand.id).where(NodeCommand.done_at.is_(None))).all())


def _claim(client: ApiClient) -> list[int]:
    answer = client.request("GET", "/agent/v1/work?node=n1")
    return [command["seq"] for command in answer["commands"]]


def test_a_work_answer_is_acknowledged_in_one_request(
        served: tuple[sessionmaker[Session], ApiClient]) -> None:
    sessions, client = served
    jobs = [start_on(sessions, (f"GPU-{i}",)) for i in range(2)]
    seqs = _claim(client)
    assert len(seqs) == 2 and _open(sessions) == 2
    answer = client.request("POST", "/agent/v1/commands/done", {"node": "n1", "seqs": seqs})
    assert answer == {"ok": True, "changed": seqs}
    assert _launched(sessions) == dict.fromkeys(jobs, True)
    assert _open(sessions) == 0
    again = client.request("POST", "/agent/v1/commands/done", {"node": "n1", "seqs": seqs})
    assert again["changed"] == []  # done once; a repeated acknowledgement changes nothing


def test_another_nodes_commands_are_not_done_by_it(
        served: tuple[sessionmaker[Session], ApiClient]) -> None:
    sessions, client = served
    job = start_on(sessions, ("GPU-0",))
    seqs = _claim(client)
    answer = client.request("POST", "/agent/v1/commands/done", {"node": "n2", "seqs": seqs})
    assert answer["changed"] == [] and _launched(sessions) == {job: False}


@pytest.mark.parametrize("seqs", [
    [], "1", None, [True], [0], [-3], [1.5], ["1"], [2**63],
    list(range(1, MAX_COMMANDS_ACKED + 2)),
])
def test_a_bad_list_is_refused_and_changes_nothing(
        served: tuple[sessionmaker[Session], ApiClient], seqs: Any) -> None:
    sessions, client = served
    job = start_on(sessions, ("GPU-0",))
    claimed = _claim(client)
    if seqs == [1.5]:  # with a good one before it: that one is not done either
        seqs = [claimed[0], 1.5]
    with pytest.raises(GpuschedError) as refused:
        client.request("POST", "/agent/v1/commands/done", {"node": "n1", "seqs": seqs})
    assert refused.value.http_status == 400 and "seqs:" in refused.value.message
    assert _launched(sessions) == {job: False} and _open(sessions) == 1


# -- acknowledged by the next poll (GET /agent/v1/work?done=) --------------------------
def _poll(client: ApiClient, done: list[int] | str, node: str = "n1") -> list[int]:
    text = done if isinstance(done, str) else ",".join(map(str, done))
    answer = client.request("GET", f"/agent/v1/work?node={node}&done={text}")
    return [command["seq"] for command in answer["commands"]]


def test_the_next_poll_acknowledges_and_then_claims(
        served: tuple[sessionmaker[Session], ApiClient]) -> None:
    sessions, client = served
    first = start_on(sessions, ("GPU-0",))
    seqs = _claim(client)
    assert len(seqs) == 1 and _launched(sessions) == {first: False}
    second = start_on(sessions, ("GPU-1",))
    claimed = _poll(client, seqs)  # done before claimed: the acknowledged is not handed out
    assert len(claimed) == 1 and claimed != seqs
    assert _launched(sessions) == {first: True, second: False}
    assert _open(sessions) == 1
    assert _poll(client, seqs) == []  # a repeated acknowledgement changes nothing
    assert _poll(client, claimed) == [] and _open(sessions) == 0
    assert _launched(sessions) == {first: True, second: True}


def test_a_poll_does_not_acknowledge_another_nodes_commands(
        served: tuple[sessionmaker[Session], ApiClient]) -> None:
    sessions, client = served
    job = start_on(sessions, ("GPU-0",))
    seqs = _claim(client)
    assert _poll(client, seqs, node="n2") == []
    assert _launched(sessions) == {job: False} and _open(sessions) == 1


def test_the_register_answer_says_polls_take_acknowledgements(
        served: tuple[sessionmaker[Session], ApiClient]) -> None:
    _, client = served
    answer = client.request("POST", "/agent/v1/register", {"node": "n3", "uid": 0, "gpus": []})
    assert answer["acks_in_poll"] is True


@pytest.mark.parametrize("done", [
    ",", "1,", "x", "-3", "0", "1.5", "%2B1", "%201", "%D9%A1", str(2**63), "9" * 40,
    ",".join(map(str, range(1, MAX_ACKS_IN_POLL + 2))),
])
def test_a_bad_done_is_refused_and_changes_nothing(
        served: tuple[sessionmaker[Session], ApiClient], done: str) -> None:
    sessions, client = served
    job = start_on(sessions, ("GPU-0",))
    seqs = _claim(client)
    with pytest.raises(GpuschedError) as refused:
        _poll(client, f"{seqs[0]},{done}" if done in ("x", "0") else done)
    assert refused.value.http_status == 400 and "done:" in refused.value.message
    assert _launched(sessions) == {job: False} and _open(sessions) == 1
