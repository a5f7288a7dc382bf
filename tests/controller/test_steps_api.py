"""Job steps through the controller's real API, served in this process on a real Unix
socket against a real database: the job's owner makes a step (201 StepCreated) that
each node's agent then claims as a ``step`` command over its long poll; anyone else is
refused, a bad request is one 400 that stores nothing, a step that must wait is 409
``step_busy``; cancels reach the nodes; only a node's agent reports its end there."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpusched.controller.api import Api
from gpusched.controller.events import Events
from gpusched.controller.http import UnixHttpServer
from gpusched.core.model import Plan, Start
from gpusched.db import agents, submit
from gpusched.db.models import JobStep, NodeCommand
from gpusched.db.schedule import apply_plan, load_snapshot
from gpusched.messages import NodeCommand as CommandMessage
from gpusched.messages.steps import StepCreated, StepLaunch
from tests.db.node import ALICE, node_sessions

BOB = 1001
WITHIN = 10.0
TOKEN = "0f" * 32


def _request_bytes(method: str, path: str, body: Any) -> bytes:
    payload = b"" if body is None else json.dumps(body).encode()
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode() + payload


def _answer(data: bytes) -> tuple[int, dict[str, Any]]:
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(rest or b"{}")


def _send(path: Path, method: str, target: str, body: Any) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(WITHIN)
        sock.connect(str(path))
        sock.sendall(_request_bytes(method, target, body))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


@dataclass
class Served:
    """The API on a Unix socket anyone may connect to."""

    sessions: sessionmaker[Session]
    socket_path: Path

    def root(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        """A request as this process (root: an administrator, and an agent)."""
        return _answer(_send(self.socket_path, method, path, body))

    def user(self, uid: int, method: str, path: str, body: Any = None
             ) -> tuple[int, dict[str, Any]]:
        """The same request from a child process running as ``uid``."""
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(read_end)
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                os.write(write_end, _send(self.socket_path, method, path, body))
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        data = b""
        while chunk := os.read(read_end, 65536):
            data += chunk
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, data
        return _answer(data)

    def stored(self) -> tuple[int, int]:
        """(steps, step commands) in the database."""
        with self.sessions() as s:
            return (s.scalar(select(func.count()).select_from(JobStep)) or 0,
                    s.scalar(select(func.count()).select_from(NodeCommand).where(
                        NodeCommand.kind.in_(("step", "step_cancel")))) or 0)


@pytest.fixture
def served(db_url: str) -> Iterator[Served]:
    gpus = [{"index": i, "uuid": f"n1-{i}"} for i in range(2)]
    with node_sessions(db_url, gpus) as sessions:
        with sessions() as s, s.begin():
            agents.register_node(s, {"node": "n2", "uid": 0, "address": "192.0.2.2",
                                     "gpus": [{"index": i, "uuid": f"n2-{i}"}
                                              for i in range(2)]})
        router = Api(sessions, Events(), lambda: True).router()
        folder = Path(tempfile.mkdtemp(prefix="gpusched-steps-"))
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


def _job(served: Served) -> int:
    """ALICE's job running on both GPUs of n2 and n1 (its batch script on n2)."""
    with served.sessions() as s, s.begin():
        job_id = submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", "gpus": 4,
                                       "nodes": 2}, ALICE).id
    with served.sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        apply_plan(s, snapshot, Plan(starts=(Start(
            job_id, "n2", ("n2-0", "n2-1", "n1-0", "n1-1"), nodes=("n2", "n1")),)), node_ids)
    return job_id


def _ask(**fields: Any) -> dict[str, Any]:
    return {"argv": ["python3", "train.py"], "work_dir": "/home/alice",
            "io": {"host": "127.0.0.1", "port": 45_000, "token": TOKEN}, **fields}


def test_the_owner_makes_a_step_and_each_node_claims_its_part(served: Served) -> None:
    job_id = _job(served)
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/steps",
                                 _ask(ntasks=4, gpus_per_task=1, label=None))
    assert status == 400 and answer["error"]["message"] == "unknown field 'label' in the " \
                                                           "step request"
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/steps",
                                 _ask(ntasks=4, gpus_per_task=1, name="train"))
    assert status == 201, answer
    made = StepCreated.parse(answer)
    assert (made.step_id, made.node_names, made.layout, made.master_addr) == (
        0, ("n2", "n1"), {"n2": (0, 1), "n1": (2, 3)}, "192.0.2.2")
    # n1's agent finds its part on its long poll, as the agent parses it.
    status, work = served.root("GET", "/agent/v1/work?node=n1&wait=0")
    assert status == 200
    sent = [CommandMessage.parse(c) for c in work["commands"]]
    assert [(c.kind, c.job_id) for c in sent] == [("step", job_id)]
    launch = sent[0].payload
    assert isinstance(launch, StepLaunch)
    assert ([(t.task_id, t.local_id, t.gpu_uuids) for t in launch.tasks], launch.node_index,
            launch.name, launch.io.token) == (
        [(2, 0, ("n1-0",)), (3, 1, ("n1-1",))], 1, "train", TOKEN)
    status, listed = served.user(BOB, "GET", f"/v1/jobs/{job_id}/steps")
    assert status == 200 and [(s["step_id"], s["state"], s["name"], s["error"])
                              for s in listed["steps"]] == [(0, "RUNNING", "train", None)]
    status, one = served.root("GET", f"/v1/jobs/{job_id}/steps/0")
    assert status == 200 and one["layout"] == {"n2": [0, 1], "n1": [2, 3]}
    # The step holds every GPU: another must wait, and says so with its own code.
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/steps", _ask())
    assert (status, answer["error"]["code"]) == (409, "step_busy")
    assert served.stored() == (1, 2)


@pytest.mark.parametrize(("body", "message"), [
    ({"argv": []}, "argv: expected the command to run, got nothing"),
    ({"work_dir": "rel"}, "work_dir: expected an absolute directory path, got 'rel'"),
    ({"io": {"host": "127.0.0.1", "port": 45_000, "token": "XY"}},
     "io.token: expected 64 lowercase hexadecimal digits"),
    ({"ntasks": 0}, "ntasks: expected a task count"),
    ({"nodes": 3}, "--nodes 3: the job has 2 nodes"),
    ({"environment": {"MASTER_PORT": "x"}},
     "MASTER_PORT in the environment: expected a TCP port, got 'x'"),
    ({"pty": True, "ntasks": 2}, "pty: a step with a pseudo-terminal runs one task (got 2)"),
    ({"pty": True, "input": "in.txt"}, "pty: the terminal is the task's input and output"),
])
def test_a_bad_request_is_one_400_that_stores_nothing(served: Served, body: dict[str, Any],
                                                     message: str) -> None:
    job_id = _job(served)
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/steps",
                                 _ask(**body))
    assert status == 400 and answer["error"]["code"] == "invalid"
    assert answer["error"]["message"].startswith(message), answer
    assert "\n" not in answer["error"]["message"]
    assert served.stored() == (0, 0)


def test_only_the_owner_or_an_admin_makes_or_cancels_steps(served: Served) -> None:
    job_id = _job(served)
    status, answer = served.user(BOB, "POST", f"/v1/jobs/{job_id}/steps", _ask())
    assert (status, answer["error"]["code"]) == (403, "forbidden")
    assert served.stored() == (0, 0)
    assert served.root("POST", "/v1/jobs/999/steps", _ask())[0] == 404
    assert served.root("POST", f"/v1/jobs/{job_id}/steps", _ask())[0] == 201
    status, answer = served.user(BOB, "POST", f"/v1/jobs/{job_id}/steps/0/cancel", {})
    assert status == 403
    for bad in ("x", "99999999999", "-1"):
        status, answer = served.root("POST", f"/v1/jobs/{job_id}/steps/{bad}/cancel", {})
        assert (status, answer["error"]["code"]) == (404, "not_found"), bad
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/steps/0/cancel",
                                 {"bad_exit": True, "signal": 10})
    assert status == 400 and "not both" in answer["error"]["message"]
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/steps/0/cancel",
                                 {"signal": 99})
    assert status == 400 and answer["error"]["message"].startswith("signal:")
    assert served.stored() == (1, 2)
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/steps/0/cancel",
                                 {"signal": 10})
    assert status == 200 and answer["state"] == "RUNNING"
    status, answer = served.user(ALICE.uid, "POST", f"/v1/jobs/{job_id}/steps/0/cancel",
                                 {"bad_exit": True})
    assert status == 200 and answer["state"] == "RUNNING"  # until its nodes report
    assert served.stored() == (1, 6)
    _, work = served.root("GET", "/agent/v1/work?node=n2&wait=0")
    kinds = [(c["kind"], c["payload"].get("signal")) for c in work["commands"]
             if c["kind"] != "launch"]
    assert kinds == [("step", None), ("step_cancel", 10), ("step_cancel", None)]


def test_only_a_nodes_agent_reports_its_part_of_a_step(served: Served) -> None:
    job_id = _job(served)
    served.root("POST", f"/v1/jobs/{job_id}/steps", _ask())
    ended = f"/agent/v1/jobs/{job_id}/steps/0/ended"
    report = {"node": "n1", "outcome": "failed", "exit_code": 2, "max_rss_bytes": 1 << 20,
              "cpu_usec": 1000, "tasks": [[1, 2, None]]}
    status, answer = served.user(ALICE.uid, "POST", ended, report)
    assert (status, answer["error"]["code"]) == (403, "forbidden")
    status, answer = served.root("POST", ended, {**report, "tasks": [[1, 2]]})
    assert status == 400 and "tasks" in answer["error"]["message"]
    assert served.root("POST", ended, report) == (200, {"ok": True, "changed": True,
                                                        "stale": False})
    assert served.root("POST", ended, report) == (200, {"ok": True, "changed": False,
                                                        "stale": True})
    assert served.root("POST", f"/agent/v1/jobs/{job_id}/steps/3/ended", report)[1][
        "stale"] is True
    served.root("POST", ended, {"node": "n2", "outcome": "completed", "exit_code": 0,
                                "cpu_usec": 500})
    _, one = served.root("GET", f"/v1/jobs/{job_id}/steps/0")
    assert (one["state"], one["exit_code"], one["max_rss_bytes"], one["cpu_usec"]) == (
        "FAILED", 2, 1 << 20, 1500)
