"""The metrics listener of a controller or an agent (``[metrics]`` in the configuration):
plain HTTP that answers ``GET /metrics`` (and ``HEAD``) with the Prometheus text format,
404 for any other path and 501 for any other method. It reads nothing a client sends
but the request line and headers, runs nothing, and takes no credential: bind it to
loopback or a monitoring network (docs/operations.md).

Standard library and prometheus_client only: the agent serves it too.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpusched.errors import Unavailable

log = logging.getLogger(__name__)
MAX_SCRAPES = 4  # scrapes answered at once; more wait for a slot or get 503
SLOT_WAIT = 5.0  # seconds a scrape waits for a slot
CLIENT_TIMEOUT = 10.0  # seconds a client may take to send its request
# What generate_latest writes: every name here is a legacy one, so the text is the 0.0.4
# format that every Prometheus reads (recent clients would announce 1.0.0 for it).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsServer(ThreadingHTTPServer):
    """Serves ``render()`` at ``/metrics`` on ``host:port`` in a thread of its own."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, host: str, port: int, render: Callable[[], bytes],
                 what: str = "metrics") -> None:
        self.render = render
        self.slots = threading.BoundedSemaphore(MAX_SCRAPES)
        try:
            family = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0,
                                        socket.AI_PASSIVE)[0][0]
        except socket.gaierror as exc:
            raise Unavailable(f"{what}: cannot resolve {host}: {exc.strerror}") from None
        self.address_family = family
        try:
            super().__init__((host, port), _MetricsHandler)
        except OSError as exc:
            raise Unavailable(f"{what}: cannot listen on {host}:{port}: "
                              f"{exc.strerror or exc}") from None
        self._thread: threading.Thread | None = None

    def server_bind(self) -> None:
        """Bind, without HTTPServer's reverse lookup of the address (a slow resolver
        would hold the daemon's start)."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    @property
    def port(self) -> int:
        """The port listened on."""
        return int(self.socket.getsockname()[1])

    def start(self) -> None:
        """Serve in a daemon thread until close()."""
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the port."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5)
        self.server_close()


class _MetricsHandler(BaseHTTPRequestHandler):
    server: MetricsServer
    timeout = CLIENT_TIMEOUT
    protocol_version = "HTTP/1.1"
    server_version = "gpusched-metrics"
    sys_version = ""

    def do_GET(self) -> None:  # noqa: N802 - the name http.server looks up
        self._answer(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        if self.path.partition("?")[0] != "/metrics":
            self._send(404, b"not found: only /metrics is served here\n", "text/plain", body)
            return
        if not self.server.slots.acquire(timeout=SLOT_WAIT):
            self._send(503, b"too many scrapes at once\n", "text/plain", body)
            return
        try:
            payload = self.server.render()
        except Exception:  # noqa: BLE001 - one failed scrape, said in the log
            log.exception("metrics: a scrape failed")
            self._send(500, b"the scrape failed; see the log\n", "text/plain", body)
            return
        finally:
            self.server.slots.release()
        self._send(200, payload, CONTENT_TYPE, body)

    def _send(self, status: int, payload: bytes, content_type: str, body: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if body:
            self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("metrics: %s " + format, self.address_string(), *args)
