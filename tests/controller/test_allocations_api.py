"""Allocations (jobs without a batch script: galloc, gsrun outside a job) through the
controller's real API on a real Unix socket and a real database: a started allocation
launches nothing; only its owner (or an admin) keeps it alive and completes it; a
completion frees its GPUs and ends its steps with a kill to each of its nodes; bad
bodies are one 400 that changes nothing; the leader's check ends a silent client's
allocation CANCELLED ("client lost") and one past its time limit TIMEOUT."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update

from gpusched.controller.api import Api
from gpusched.controller.events import Events
from gpusched.controller.http import UnixHttpServer
from gpusched.core.model import Plan, Start
from gpusched.db import agents, allocations, submit
from gpusched.db.models import (
    Allocation,
    Gpu,
    Job,
    JobScript,
    JobStep,
    Node,
    NodeCommand,
)
from gpusched.db.schedule import apply_plan, load_snapshot
from gpusched.messages.jobs import ALLOCATION_SCRIPT
from tests.controller.test_steps_api import TOKEN, WITHIN, Served
from tests.db.node import ALICE, node_sessions

BOB = 1001
GRACE = 30.0


@pytest.fixture
def served(db_url: str) -> Iterator[Served]:
    """Nodes n1 and n2 with three GPUs each; the API with an allocation grace of 30 s."""
    gpus = [{"index": i, "uuid": f"n1-{i}"} for i in range(3)]
    with node_sessions(db_url, gpus) as sessions:
        with sessions() as s, s.begin():
            agents.register_node(s, {"node": "n2", "uid": 0, "gpus": [
                {"index": i, "uuid": f"n2-{i}"} for i in range(3)]})
        router = Api(sessions, Events(), lambda: True, allocation_grace=GRACE).router()
        folder = Path(tempfile.mkdtemp(prefix="gpusched-alloc-"))
        folder.chmod(0o755)  # an unprivileged caller reaches the socket
        server = UnixHttpServer(folder / "api.sock", router, 0o666)
        thread = threading.Thread(target=server.serve_forever,
                                  kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            yield Served(sessions, folder / "api.sock")
        finally:
            server.shutdown()
            server.server_close()
            thread.join(WITHIN)
            folder.rmdir()


def _submit(served: Served, **body: Any) -> int:
    status, answer = served.user(ALICE.uid, "POST", "/v1/jobs", {
        "interactive": True, "work_dir": "/tmp", "gpus": 2, "nodes": 2, **body})
    assert status == 201, answer
    return int(answer["job_id"])


def _start(served: Served, job_id: int) -> None:
    """Start it on one GPU of each node, as a pass would."""
    with served.sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        apply_plan(s, snapshot, Plan(starts=(Start(job_id, "n1", ("n1-0", "n2-0"),
                                                   nodes=("n1", "n2")),)), node_ids)


def _job(served: Served, job_id: int) -> Job:
    with served.sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None
        s.expunge(job)
        return job


def _commands(served: Served, job_id: int) -> list[tuple[str, str]]:
    """(kind, node) of the job's node commands, in the order made."""
    with served.sessions() as s:
        return [(kind, node) for kind, node in s.execute(
            select(NodeCommand.kind, Node.name).join(Node, Node.id == NodeCommand.node_id)
            .where(NodeCommand.job_id == job_id).order_by(NodeCommand.id))]


def _held_gpus(served: Served, job_id: int) -> int:
    with served.sessions() as s:
        return s.scalar(select(func.count()).select_from(Allocation).where(
            Allocation.job_id == job_id, Allocation.released_at.is_(None))) or 0


def _step(served: Served, job_id: int) -> None:
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/steps", {
        "argv": ["hostname"], "work_dir": "/tmp",
        "io": {"host": "127.0.0.1", "port": 45_000, "token": TOKEN}})
    assert status == 201, answer


def test_an_allocation_starts_without_a_launch_and_its_steps_run_on_its_nodes(
        served: Served) -> None:
    job_id = _submit(served)
    job = _job(served, job_id)
    assert (job.interactive, job.requeue, job.client_seen is not None) == (True, False, True)
    with served.sessions() as s:
        assert s.scalar(select(JobScript.script).join(Job, Job.script_id == JobScript.id)
                        .where(Job.id == job_id)) == ALLOCATION_SCRIPT
    _start(served, job_id)
    job = _job(served, job_id)
    assert job.state == "RUNNING" and job.client_seen is not None
    assert job.start_time is not None and job.client_seen >= job.start_time
    assert _commands(served, job_id) == []  # nothing runs until a step does
    _step(served, job_id)
    assert _commands(served, job_id) == [("step", "n1"), ("step", "n2")]


def test_only_the_owner_or_an_admin_keeps_an_allocation_alive(served: Served) -> None:
    job_id = _submit(served)
    with served.sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id == job_id).values(
            client_seen=datetime.now(UTC) - timedelta(hours=1)))
    status, answer = served.user(BOB, "POST", f"/v1/jobs/{job_id}/heartbeat")
    assert (status, answer["error"]["code"]) == (403, "forbidden")
    before = _job(served, job_id).client_seen
    assert before is not None
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/heartbeat")
    assert status == 200 and answer == {"job_id": job_id, "state": "PENDING", "name": "job",
                                        "partition": "gpu", "node_names": [],
                                        "allocation_grace": GRACE}
    seen = _job(served, job_id).client_seen
    assert seen is not None and seen - before > timedelta(minutes=59)
    _start(served, job_id)
    status, answer = served.root("POST", f"/v1/jobs/{job_id}/heartbeat")
    assert (status, answer["state"], answer["node_names"]) == (200, "RUNNING", ["n1", "n2"])
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/heartbeat",
                                 {"alive": True})
    assert status == 400 and answer["error"]["message"] == \
        "unknown field 'alive' in the heartbeat"


def test_a_batch_job_is_not_an_allocation(served: Served) -> None:
    with served.sessions() as s, s.begin():
        job_id = submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp"}, ALICE).id
    for route, body in (("heartbeat", None), ("complete", {"exit_code": 0})):
        status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/{route}", body)
        assert (status, answer["error"]["code"]) == (409, "conflict"), answer
        assert "is a batch job, not an allocation" in answer["error"]["message"]
    assert _job(served, job_id).state == "PENDING"


def test_completing_frees_the_gpus_ends_the_steps_and_kills_on_every_node(
        served: Served) -> None:
    job_id = _submit(served)
    _start(served, job_id)
    _step(served, job_id)
    status, answer = served.user(BOB, "POST", f"/v1/jobs/{job_id}/complete", {"exit_code": 3})
    assert (status, answer["error"]["code"]) == (403, "forbidden")
    assert _held_gpus(served, job_id) == 2
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/complete",
                                 {"exit_code": 3})
    assert status == 200 and (answer["state"], answer["exit_code"]) == ("FAILED", 3), answer
    assert _held_gpus(served, job_id) == 0
    with served.sessions() as s:
        assert s.execute(select(JobStep.state, JobStep.error).where(
            JobStep.job_id == job_id)).one() == ("CANCELLED", "ended with its job")
    assert _commands(served, job_id)[2:] == [("kill", "n1"), ("kill", "n2")]
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/complete",
                                 {"exit_code": 0})
    assert status == 409 and answer["error"]["message"] == \
        f"job {job_id} has already ended (FAILED)"
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/heartbeat")
    assert status == 409 and answer["error"]["message"] == \
        f"job {job_id} has ended (FAILED)"


def test_exit_status_zero_completes(served: Served) -> None:
    job_id = _submit(served)
    _start(served, job_id)
    status, answer = served.root("POST", f"/v1/jobs/{job_id}/complete", {"exit_code": 0})
    assert status == 200 and (answer["state"], answer["exit_code"]) == ("COMPLETED", 0)


@pytest.mark.parametrize(("body", "message"), [
    ({}, "exit_code: expected an exit status, got nothing"),
    ({"exit_code": 256}, "exit_code: expected an exit status"),
    ({"exit_code": -1}, "exit_code: expected an exit status"),
    ({"exit_code": True}, "exit_code: expected an exit status"),
    ({"exit_code": "0"}, "exit_code: expected an exit status"),
    ({"exit_code": 0, "signal": 9}, "unknown field 'signal' in the completion"),
])
def test_a_bad_completion_is_one_400_that_changes_nothing(
        served: Served, body: dict[str, Any], message: str) -> None:
    job_id = _submit(served)
    _start(served, job_id)
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/complete", body)
    assert status == 400 and answer["error"]["message"].startswith(message), answer
    assert "\n" not in answer["error"]["message"]
    assert _job(served, job_id).state == "RUNNING" and _held_gpus(served, job_id) == 2


def test_a_pending_allocation_is_cancelled_not_completed(served: Served) -> None:
    job_id = _submit(served)
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/complete",
                                 {"exit_code": 0})
    assert status == 409 and "is PENDING" in answer["error"]["message"]
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/cancel")
    assert status == 200 and answer["state"] == "CANCELLED"


def test_gcancel_ends_a_running_allocation_and_its_steps_at_once(served: Served) -> None:
    job_id = _submit(served)
    _start(served, job_id)
    _step(served, job_id)
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/cancel")
    assert status == 200 and answer["state"] == "CANCELLED", answer
    assert _held_gpus(served, job_id) == 0
    # No cancel to a batch run that does not exist: the kills end its steps.
    assert _commands(served, job_id)[2:] == [("kill", "n1"), ("kill", "n2")]
    with served.sessions() as s:
        assert s.scalar(select(JobStep.state).where(JobStep.job_id == job_id)) == "CANCELLED"
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/requeue")
    assert status == 409


def test_an_allocation_is_never_requeued(served: Served) -> None:
    job_id = _submit(served)
    _start(served, job_id)
    status, answer = served.root("POST", f"/v1/jobs/{job_id}/requeue")
    assert status == 409 and "only batch jobs are requeued" in answer["error"]["message"]
    assert _job(served, job_id).state == "RUNNING"


def test_the_check_ends_silent_clients_and_allocations_past_their_time_limit(
        served: Served) -> None:
    silent, timed, fine, queued = (_submit(served, time_limit=600) for _ in range(4))
    for job_id in (silent, timed, fine):
        _start_alone(served, job_id)
    now = datetime.now(UTC)
    with served.sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id.in_((silent, queued))).values(
            client_seen=now - timedelta(seconds=6)))
        s.execute(update(Job).where(Job.id == timed).values(
            start_time=now - timedelta(seconds=601)))
        checked = allocations.check_allocations(s, 5.0, now, silent_too=False)
    assert checked.ended == {"TIMEOUT": [timed]}  # a new leader judges no silence yet
    with served.sessions() as s, s.begin():
        checked = allocations.check_allocations(s, 5.0, now)
    assert checked.ended == {"CANCELLED": [silent, queued]}
    assert checked.kill_on == {"n1", "n2"}
    states = {j: (_job(served, j).state, _job(served, j).error_message)
              for j in (silent, timed, fine, queued)}
    lost = "client lost: no word from its galloc or gsrun for 5 s"
    assert states == {silent: ("CANCELLED", lost), timed: ("TIMEOUT", None),
                      fine: ("RUNNING", None), queued: ("CANCELLED", lost)}
    assert [_held_gpus(served, j) for j in (silent, timed, fine)] == [0, 0, 2]
    with served.sessions() as s, s.begin():
        assert allocations.check_allocations(s, 5.0, now).ended == {}


def _start_alone(served: Served, job_id: int) -> None:
    """Start it on the first GPUs of n1 and n2 still free."""
    with served.sessions() as s, s.begin():
        held = set(s.scalars(select(Allocation.gpu_id).where(Allocation.released_at.is_(None))))
        free = [u for u, gpu_id in s.execute(select(Gpu.uuid, Gpu.id).order_by(Gpu.uuid))
                if gpu_id not in held]
        snapshot, node_ids = load_snapshot(s)
        pick = (next(u for u in free if u.startswith("n1")),
                next(u for u in free if u.startswith("n2")))
        apply_plan(s, snapshot, Plan(starts=(Start(job_id, "n1", pick, nodes=("n1", "n2")),)),
                   node_ids)


def test_a_preempted_allocation_ends_cancelled_never_requeued(served: Served) -> None:
    by_check, also = _submit(served), _submit(served)
    for job_id in (by_check, also):
        _start_alone(served, job_id)
    now = datetime.now(UTC)
    with served.sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id.in_((by_check, also))).values(
            cancel_requested_at=now, preempted_at=now, preempt_mode="requeue",
            preempted_by=7))
        assert allocations.check_allocations(s, 5.0, now, silent_too=False).ended == {
            "CANCELLED": [by_check, also]}
    assert (_job(served, by_check).state, _job(served, by_check).error_message) == (
        "CANCELLED", "preempted by job 7")
    # The preemption's cancel to an allocation's first node comes back from its agent as
    # a run it never had, cancelled: the allocation ends, not requeued, and both of its
    # nodes are told to kill its steps.
    again = _submit(served)
    _start_alone(served, again)
    with served.sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id == again).values(
            cancel_requested_at=now, preempted_at=now, preempt_mode="requeue",
            preempted_by=7))
        changed, stale = agents.record_run_end(s, again, {
            "node": "n1", "outcome": "cancelled", "run": 0})
    assert (changed, stale) == (True, False)
    assert (_job(served, again).state, _job(served, again).restarts) == ("CANCELLED", 0)
    assert _commands(served, again) == [("kill", "n1"), ("kill", "n2")]
