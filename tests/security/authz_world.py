"""The controller the authorisation matrix runs against, and its callers.

One API service (the controller's router over a real database), served as the
controller serves it: on a Unix socket, where the kernel names the caller
(``SO_PEERCRED``), and on TCP with each method's real verifier (``key`` and ``munge``:
two listeners), where a credential does. Requests on the socket are made by a child
process that has taken the caller's uid and gid (``setuid``); with the key method, a
credential is signed for that uid with a host's key; with munge, a real munged makes it
for the process that asks, so a child that took the caller's uid asks for it (a batch at
a time: tests/security/authz_callers.py).

The callers: ``anonymous`` (on the socket a uid with no account on this host, over TCP
no credential at all), ``user`` (a user who does not own the job acted on), ``owner``
(the job's owner), ``admin`` (a member of ``[controller] admin_group``, not root),
``agent`` (the agent of node01, whose resources the requests name) and ``other agent``
(the agent of node02). On the socket an agent is a process of root, as on a node that
runs its controller; over TCP a node credential, root's, made with that node's key, or
by that node's munged (node01's stamps 127.0.0.1, node02's, sharing the key, 127.0.0.2).
"""

from __future__ import annotations

import http.client
import json
import pwd
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from gpusched.auth.backends import Authenticator
from gpusched.auth.credential import SCHEME_KEY, SCHEME_MUNGE
from gpusched.auth.keys import derive_host_key, new_master_key
from gpusched.auth.keytoken import KeySigner, KeyVerifier
from gpusched.auth.munge import MungeVerifier
from gpusched.auth.mungeclient import munge_client
from gpusched.auth.nodeaddr import NodeAddressBook
from gpusched.client.endpoints import Endpoint
from gpusched.config import PartitionConfig
from gpusched.controller.api import Api
from gpusched.controller.events import Events
from gpusched.controller.http import (
    HttpService,
    ServerLimits,
    TcpHttpServer,
    UnixHttpServer,
)
from gpusched.core.model import Plan, Start
from gpusched.db import agents, health, jobs, steps, submit
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.jobs import Identity
from gpusched.db.models import Gpu, Job, JobStep, Node, NodeCommand
from gpusched.db.partitions import sync_partitions
from gpusched.db.schedule import apply_plan, load_snapshot
from gpusched.messages.steps import StepRequest
from tests.auth.munged import Munged
from tests.security.authz_callers import MungeCallers, as_uid
from tests.security.conftest import LocalUser, ensure_user

CALLERS = ("anonymous", "user", "owner", "admin", "agent", "other agent")
BACKENDS = ("unix", "key", "munge")  # the Unix socket; TCP with each method's credentials
ADMIN_GROUP = "gpusched-authz-admins"
NODE, OTHER_NODE = "node01", "node02"
NODE_ADDRESSES = {NODE: ("127.0.0.1",), OTHER_NODE: ("127.0.0.2",)}  # what munged stamps
GPUS = {name: [{"index": i, "uuid": f"{name}-gpu{i}"} for i in range(4)]
        for name in (NODE, OTHER_NODE)}
WITHIN = 10.0
STEP_ASK = {"argv": ["true"], "work_dir": "/tmp",
            "io": {"host": "127.0.0.1", "port": 45_000, "token": "0f" * 32}}


def _unknown_uid(start: int = 54_321) -> int:
    """A uid this host has no account for."""
    uid = start
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


def _admin_user() -> LocalUser:
    """A user whose only privilege is membership of ADMIN_GROUP."""
    admin = ensure_user("gpusched-authz-admin")
    if subprocess.run(["getent", "group", ADMIN_GROUP], capture_output=True).returncode:
        made = subprocess.run(["groupadd", "--system", ADMIN_GROUP], capture_output=True)
        if made.returncode and subprocess.run(["getent", "group", ADMIN_GROUP],
                                              capture_output=True).returncode:
            raise RuntimeError(f"cannot make group {ADMIN_GROUP}: {made.stderr!r}")
    subprocess.run(["gpasswd", "-a", admin.name, ADMIN_GROUP], check=True, capture_output=True)
    return admin


def _request_bytes(method: str, target: str, body: Any) -> bytes:
    payload = b"" if body is None else json.dumps(body).encode()
    return (f"{method} {target} HTTP/1.1\r\nHost: gpusched\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
            ).encode() + payload


def _unix_exchange(path: Path, method: str, target: str, body: Any) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(WITHIN)
        sock.connect(str(path))
        sock.sendall(_request_bytes(method, target, body))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _parse(data: bytes) -> tuple[int, dict[str, Any]]:
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(rest or b"{}")


@dataclass
class World:
    """The served API, its database, and who may call it."""

    sessions: sessionmaker[Session]
    socket_path: Path
    ports: dict[str, int]  # the TCP listener of each method: "key", "munge"
    users: dict[str, tuple[int, int]]  # caller -> (uid, gid) of the human callers
    signers: dict[str, KeySigner]  # "login1", NODE, OTHER_NODE
    munge: MungeCallers

    def identity(self, caller: str) -> Identity:
        uid, gid = self.users[caller]
        return Identity(uid, gid)

    def call(self, backend: str, caller: str, method: str, target: str,
             body: Any = None) -> tuple[int, dict[str, Any]]:
        """``method target`` with ``body``, as ``caller`` over ``backend``."""
        if backend == "unix":
            if caller in ("agent", "other agent"):  # root, this process
                return _parse(_unix_exchange(self.socket_path, method, target, body))
            uid, gid = self.users[caller]
            return _parse(as_uid(uid, gid, lambda: _unix_exchange(
                self.socket_path, method, target, body)))
        headers = {"Content-Type": "application/json"}
        credential = self.credential(backend, caller)
        if credential is not None:
            headers["Authorization"] = credential
        conn = http.client.HTTPConnection("127.0.0.1", self.ports[backend], timeout=WITHIN)
        try:
            conn.request(method, target, None if body is None else json.dumps(body), headers)
            answer = conn.getresponse()
            return answer.status, json.loads(answer.read() or b"{}")
        finally:
            conn.close()

    def credential(self, method: str, caller: str) -> str | None:
        """A fresh ``Authorization`` value of ``caller``'s for TCP with ``method``; none
        for the anonymous caller."""
        if caller == "anonymous":
            return None
        if method == "munge":
            return self.munge.header(caller)
        if caller in ("agent", "other agent"):
            node = NODE if caller == "agent" else OTHER_NODE
            return f"{SCHEME_KEY} " + self.signers[node].sign(0, 0, node=node)
        uid, gid = self.users[caller]
        return f"{SCHEME_KEY} " + self.signers["login1"].sign(uid, gid)

    # What a request acts on: made fresh for each cell, owned by ``owner``.

    def job(self, *, hold: bool = False, by_admin: bool = False,
            interactive: bool = False, submit_key: str | None = None) -> int:
        """A pending job of the owner, one hour long; held by them if ``hold``, by an
        administrator (root) if ``by_admin`` too."""
        body: dict[str, Any] = {"work_dir": "/tmp", "time_limit": 3600, "hold": hold,
                                "submit_key": submit_key}
        if interactive:
            body["interactive"] = True
        else:
            body["script"] = "#!/bin/sh\ntrue\n"
        with self.sessions() as s, s.begin():
            job_id = submit.submit_job(s, body, self.identity("owner")).id
        if by_admin:
            with self.sessions() as s, s.begin():
                jobs.set_hold(s, job_id, Identity(0, 0), True)
        return job_id

    def running(self, *, interactive: bool = False) -> int:
        """A job of the owner running on node01, as a scheduling pass starts it and its
        node's agent confirms the launch."""
        job_id = self.job(interactive=interactive)
        with self.sessions() as s, s.begin():
            # An earlier cell may have drained the node, its resume cell run elsewhere
            # (cells are spread over workers): back in service, as an admin resumes it.
            if s.scalar(select(Node.state).where(Node.name == NODE)) == "DRAIN":
                health.set_node_state(s, NODE, False)
        with self.sessions() as s, s.begin():
            snapshot, node_ids = load_snapshot(s)
            apply_plan(s, snapshot, Plan(starts=(Start(job_id, NODE, ()),)), node_ids)
            s.execute(update(Job).where(Job.id == job_id).values(launched_at=func.now()))
        return job_id

    def stepping(self) -> tuple[int, int]:
        """A running job of the owner with its step 0 running."""
        job_id = self.running()
        with self.sessions() as s, s.begin():
            created, _ = steps.create_step(s, job_id, StepRequest.parse(STEP_ASK),
                                           self.identity("owner"))
        return job_id, created.step_id

    def commands(self, job_id: int) -> tuple[Any, ...]:
        """The job's commands: to which node, claimed when, done when."""
        with self.sessions() as s:
            return tuple(s.execute(select(
                NodeCommand.id, NodeCommand.node_id, NodeCommand.claimed_at,
                NodeCommand.done_at).where(NodeCommand.job_id == job_id)
                .order_by(NodeCommand.id)).all())

    def stored(self, job_id: int | None) -> tuple[Any, ...]:
        """What a refused request must leave as it was: counts of jobs, steps and
        commands, the job's mutable fields and its steps', nodes' and GPUs' states."""
        with self.sessions() as s:
            counts = tuple(s.scalar(select(func.count()).select_from(t)) for t in
                           (Job, JobStep, NodeCommand))
            job = s.get(Job, job_id) if job_id is not None else None
            fields = None if job is None else (
                job.state, job.hold, job.time_limit, job.cancel_requested_at, job.restarts,
                job.admin_priority, job.end_time, job.client_seen, job.name, job.nodes,
                job.suspended_at, job.top_rank)
            step_states = tuple(s.execute(select(JobStep.step_id, JobStep.state).where(
                JobStep.job_id == job_id).order_by(JobStep.step_id)).all())
            nodes = tuple(s.execute(select(Node.name, Node.state, Node.reason)
                                    .order_by(Node.name)).all())
            gpus = tuple(s.execute(select(Gpu.uuid, Gpu.healthy).order_by(Gpu.uuid)).all())
        return counts, fields, step_states, nodes, gpus


@contextmanager
def serving(db_url: str, owner: LocalUser, user: LocalUser) -> Iterator[World]:
    """The API of a controller with two registered nodes, on a Unix socket anyone may
    reach and on TCP (127.0.0.1) twice: with the key method (the Unix socket shares its
    service) and with munge (a munged of this host, which is also the users' login host
    and node01; node02's munged shares its key and stamps 127.0.0.2)."""
    admin = _admin_user()
    anonymous = _unknown_uid()
    master = new_master_key()
    signers = {host: KeySigner(derive_host_key(master, host))
               for host in ("login1", NODE, OTHER_NODE)}
    users = {"anonymous": (anonymous, anonymous), "user": (user.uid, user.gid),
             "owner": (owner.uid, owner.gid), "admin": (admin.uid, admin.gid)}
    with ExitStack() as stack:
        here = Munged(origin=NODE_ADDRESSES[NODE][0])
        stack.callback(here.stop)
        there = Munged(key=here.key, origin=NODE_ADDRESSES[OTHER_NODE][0])
        stack.callback(there.stop)
        engine = make_engine(db_url, pool_size=4)
        stack.callback(engine.dispose)
        sessions = make_sessionmaker(engine)
        with sessions() as s, s.begin():
            sync_partitions(s, (PartitionConfig("gpu", default=True),))
            for name, gpus in GPUS.items():
                agents.register_node(s, {"node": name, "uid": 0, "gpus": gpus})
        router = Api(sessions, Events(), lambda: True, admin_group=ADMIN_GROUP).router()
        service = HttpService(router, ServerLimits(), Authenticator(KeyVerifier(master)),
                              SCHEME_KEY)
        munge_service = HttpService(router, ServerLimits(), Authenticator(MungeVerifier(
            munge_client(here.socket), node_addresses=NodeAddressBook(NODE_ADDRESSES))),
            SCHEME_MUNGE)
        folder = Path(tempfile.mkdtemp(prefix="gpusched-authz-"))
        stack.callback(folder.rmdir)
        stack.callback((folder / "api.sock").unlink, missing_ok=True)
        folder.chmod(0o755)  # every caller reaches the socket, as with socket_mode 0666
        unix = UnixHttpServer(folder / "api.sock", router, 0o666, service=service)
        tcp = {"key": TcpHttpServer(Endpoint("127.0.0.1", 0), service),
               "munge": TcpHttpServer(Endpoint("127.0.0.1", 0), munge_service)}
        for server in (unix, *tcp.values()):
            thread = threading.Thread(target=server.serve_forever,
                                      kwargs={"poll_interval": 0.05}, daemon=True)
            thread.start()
            stack.callback(thread.join, WITHIN)
            stack.callback(server.server_close)
            stack.callback(server.shutdown)
        munge = MungeCallers(users, munge_client(here.socket),
                             {"agent": (NODE, munge_client(here.socket)),
                              "other agent": (OTHER_NODE, munge_client(there.socket))})
        yield World(sessions, folder / "api.sock",
                    {name: int(server.server_address[1]) for name, server in tcp.items()},
                    users, signers, munge)
