"""The step supervisor's connection to gsrun's I/O socket: frames out, held in an outbox
and sent as fast as gsrun takes them, and frames in (STDIN, SIGNAL, WINSIZE). Stdlib
only, like the step supervisor."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable

from gpusched.messages import stepio

READ_SIZE = stepio.MAX_PAYLOAD


class GsrunLink:
    """One TCP connection to gsrun, non-blocking once made."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.outbox = bytearray()
        self._decoder = stepio.Decoder(stepio.TO_NODE)

    def connect(self, host: str, port: int, limit: float,
                cancelled: Callable[[], bool]) -> str | None:
        """Connect, trying again until ``limit`` seconds have passed; why it could not.
        ``cancelled`` stops the trying early once it turns true."""
        deadline = time.monotonic() + limit
        last = ""
        while True:
            if cancelled():
                return "cancelled before the step started"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return (f"cannot reach gsrun's I/O socket at {host}:{port} within "
                        f"{limit:g} s: {last}")
            try:
                sock = socket.create_connection((host, port), timeout=min(remaining, 2.0))
            except OSError as exc:
                last = exc.strerror or str(exc)
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            self.sock = sock
            return None

    def send(self, frame: bytes) -> None:
        """Queue one frame (dropped once the connection is gone)."""
        if self.sock is not None:
            self.outbox += frame

    def send_output(self, task: int, kind: int, data: bytes) -> None:
        """Queue a task's output as frames of at most MAX_PAYLOAD bytes."""
        for frame in stepio.chunks(kind, task, data):
            self.send(frame)

    def flush_some(self) -> str | None:
        """Send what the socket takes now; why the connection failed, if it did."""
        if self.sock is None or not self.outbox:
            return None
        try:
            sent = self.sock.send(self.outbox)
        except BlockingIOError:
            return None
        except OSError:
            return "gsrun's connection failed"
        del self.outbox[:sent]
        return None

    def receive(self) -> tuple[list[stepio.Frame], str | None]:
        """The frames gsrun's latest bytes complete, and why the connection is over
        (closed, failed, or a bad frame), if it is."""
        if self.sock is None:
            return [], "no connection"
        try:
            data = self.sock.recv(READ_SIZE)
        except BlockingIOError:
            return [], None
        except OSError:
            data = b""
        if not data:
            return [], "gsrun's connection closed"
        try:
            return self._decoder.feed(data), None
        except stepio.FrameError as exc:
            return [], f"gsrun sent a bad frame: {exc}"

    def flush(self, deadline: float) -> None:
        """Send what is left (until ``deadline``, monotonic), then close: after our end
        of the stream, what gsrun sent meanwhile is read until it closes too (or the
        deadline), since closing with bytes unread resets the connection, and gsrun
        could then lose the output still on its way."""
        while self.sock is not None and self.outbox and time.monotonic() < deadline:
            _, writable, _ = select.select([], [self.sock], [],
                                           max(0.0, deadline - time.monotonic()))
            if writable and self.flush_some() is not None:
                break
        if self.sock is not None and not self.outbox:
            try:
                self.sock.shutdown(socket.SHUT_WR)
                while time.monotonic() < deadline:
                    readable, _, _ = select.select([self.sock], [], [],
                                                   max(0.0, deadline - time.monotonic()))
                    if readable and not self.sock.recv(READ_SIZE):
                        break  # gsrun closed its end
            except OSError:
                pass
        self.close()

    def close(self) -> None:
        """Close the connection; nothing more is sent."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.outbox.clear()
