"""Callers of a live controller's Unix socket, each a real process of its own uid (the
controller learns who calls from SO_PEERCRED), and what the database holds between
their requests."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from tests.security.conftest import LocalUser, ensure_user

FUZZ_ADMIN_GROUP = "gpusched-fuzz-admins"
TIMEOUT = 30.0
_LENGTH = struct.Struct("!I")


def admin_user() -> LocalUser:
    """A user whose only privilege is membership of FUZZ_ADMIN_GROUP."""
    admin = ensure_user("gpusched-fuzz-admin")
    if subprocess.run(["getent", "group", FUZZ_ADMIN_GROUP], capture_output=True).returncode:
        subprocess.run(["groupadd", "--system", FUZZ_ADMIN_GROUP], check=True,
                       capture_output=True)
    subprocess.run(["gpasswd", "-a", admin.name, FUZZ_ADMIN_GROUP], check=True,
                   capture_output=True)
    return admin


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _read_exactly(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError("the caller process is gone")
        data += chunk
    return data


def _send(fd: int, data: bytes) -> None:
    os.write(fd, _LENGTH.pack(len(data)))
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _receive(fd: int) -> bytes:
    (size,) = _LENGTH.unpack(_read_exactly(fd, _LENGTH.size))
    return _read_exactly(fd, size)


def exchange(path: Path, request: bytes) -> bytes:
    """One request on a new connection (``Connection: close``); the whole answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT)
        sock.connect(str(path))
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def request_bytes(method: str, target: str, body: bytes | None) -> bytes:
    payload = body or b""
    head = (f"{method} {target} HTTP/1.1\r\nHost: gpusched\r\nConnection: close\r\n"
            f"Content-Length: {len(payload)}\r\n")
    if body is not None:
        head += "Content-Type: application/json\r\n"
    return (head + "\r\n").encode() + payload


class SocketCaller:
    """A forked child that took ``uid`` and ``gid`` (and no other group) and sends each
    request it is handed to the controller's socket, as that user."""

    def __init__(self, kind: str, path: Path, uid: int, gid: int) -> None:
        self.kind, self.uid = kind, uid
        to_child, self._to_child = os.pipe()
        self._from_child, from_child = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: drop privileges, serve requests until EOF
            code = 0
            try:
                for fd in [int(n) for n in os.listdir("/proc/self/fd")]:
                    if fd > 2 and fd not in (to_child, from_child):
                        try:  # the parent's other pipes, sockets and database links
                            os.close(fd)
                        except OSError:
                            pass
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                while True:
                    try:
                        request = _receive(to_child)
                    except EOFError:
                        break
                    try:
                        answer = exchange(path, request)
                    except OSError as exc:
                        answer = f"ERROR {exc}".encode()
                    _send(from_child, answer)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(to_child)
        os.close(from_child)

    def call(self, method: str, target: str, body: bytes | None = None) -> Answer:
        """The controller's answer to one request of this user."""
        _send(self._to_child, request_bytes(method, target, body))
        raw = _receive(self._from_child)
        if raw.startswith(b"ERROR "):
            raise OSError(raw.decode(errors="replace"))
        head, _, payload = raw.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        return Answer(status, payload)

    def call_json(self, method: str, target: str, body: Any = None) -> Any:
        answer = self.call(method, target, None if body is None else json.dumps(body).encode())
        assert answer.status < 300, (method, target, answer)
        return answer.json()

    def close(self) -> None:
        os.close(self._to_child)
        os.close(self._from_child)
        os.waitpid(self.pid, 0)


# Columns that change without any request: the scheduler's reason and estimate, the
# agent's heartbeat and GPU samples.
VOLATILE = {
    "jobs": ("reason", "expected_start", "start_kind"),
    "nodes": ("last_seen",),
    "gpus": ("util", "mem_used_mb", "temperature", "power_mw", "sampled_at"),
}
TABLES = ("jobs", "job_scripts", "partitions", "nodes", "gpus", "job_steps", "allocations",
          "accounts", "account_users", "qos")


def snapshot(url: str) -> dict[str, str]:
    """Each table's rows (less the volatile columns), as one digest per table."""
    parts = []
    for table in TABLES:
        drop = "".join(f" - '{c}'" for c in VOLATILE.get(table, ()))
        parts.append(f"(SELECT md5(coalesce(string_agg(r, ',' ORDER BY r), '')) FROM "
                     f"(SELECT (to_jsonb(t){drop})::text AS r FROM {table} t) s)")
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
        row = conn.execute("SELECT " + ", ".join(parts)).fetchone()
    assert row is not None
    return dict(zip(TABLES, row, strict=True))
