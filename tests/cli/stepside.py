"""A stand-in for the controller and the nodes of a step, made of real sockets, for
driving gsrun: the controller answers on a Unix socket as the real one does (HTTP/1.1,
JSON), and each node connects to gsrun's I/O socket and speaks stepio frames."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpusched.messages import stepio


class FakeNode:
    """One node's connection to gsrun's I/O socket."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.decoder = stepio.Decoder(stepio.TO_NODE)
        self.received: list[stepio.Frame] = []

    def hello(self, token: str, job: int, step: int, index: int, tasks: list[int]) -> None:
        self.sock.sendall(stepio.hello(token, job, step, index, tasks))

    def send(self, kind: int, task: int, payload: bytes = b"") -> None:
        self.sock.sendall(stepio.encode(kind, task, payload))

    def exit(self, task: int, code: int | None, sig: int | None = None) -> None:
        self.sock.sendall(stepio.exit_frame(task, code, sig))

    def wait_for(self, check: Callable[[list[stepio.Frame]], bool],
                 timeout: float = 10.0) -> list[stepio.Frame]:
        """Read frames until ``check(all received)`` holds; fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not check(self.received):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"frames seen: {self.received!r}")
            self.sock.settimeout(left)
            data = self.sock.recv(65536)
            if not data:
                raise AssertionError(f"gsrun closed; frames seen: {self.received!r}")
            self.received += self.decoder.feed(data)
        return self.received

    def closed_by_peer(self, timeout: float = 10.0) -> bool:
        """True once gsrun closed this connection (frames read on the way are kept)."""
        self.sock.settimeout(timeout)
        try:
            while data := self.sock.recv(65536):
                self.received += self.decoder.feed(data)
        except (ConnectionResetError, stepio.FrameError):
            return True
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Close as a node's relay does once its tasks ended: what gsrun sent meanwhile
        (a WINDOW frame to the first node) is read first, or the close would reset the
        connection and the frames still on their way to gsrun could be dropped."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
            self.closed_by_peer(timeout=5.0)
        except OSError:
            pass
        self.sock.close()


class FakeController:
    """Answers gsrun's requests on a Unix socket. ``on_create(body)`` gives the answer
    to each ``POST /v1/jobs/{job}/steps`` as (status, JSON body); ``steps`` are what
    ``GET /v1/jobs/{job}/steps/{step}`` shows. Every request is kept in ``requests``."""

    def __init__(self, path: Path,
                 on_create: Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]) -> None:
        self.path = path
        self.on_create = on_create
        self.steps: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, Any]] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(16)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.listener.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                raw, buffer = buffer[:length], buffer[length:]
                body = json.loads(raw) if raw else None
                self.requests.append((method, path, body))
                status, answer = self._answer(method, path, body)
                data = json.dumps(answer).encode()
                conn.sendall(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(data)}\r\n\r\n".encode() + data)

    def _answer(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        if method == "POST" and path.endswith("/steps"):
            status, answer = self.on_create(body)
            if status == 201:
                self.steps.append({"step_id": answer["step_id"], "state": "RUNNING",
                                   "error": None})
            return status, answer
        if method == "GET" and "/steps/" in path:
            step_id = int(path.rsplit("/", 1)[1])
            for step in self.steps:
                if step["step_id"] == step_id:
                    return 200, step
            return 404, {"error": {"code": "not_found", "message": f"no step {step_id}"}}
        if method == "POST" and path.endswith("/cancel"):
            return 200, {"cancelled": True}
        return 404, {"error": {"code": "not_found", "message": f"no route {path}"}}


def created(step_id: int, layout: dict[str, list[int]]) -> dict[str, Any]:
    """A StepCreated body."""
    return {"step_id": step_id, "node_names": list(layout), "layout": layout,
            "ntasks": sum(len(t) for t in layout.values()), "master_addr": "127.0.0.1",
            "master_port": 29517}
