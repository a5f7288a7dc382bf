"""Submissions per second through the API on one keep-alive connection; prints
``name: value`` lines.

    .venv/bin/python bench/api_submit.py [--submits 500] [--runs 3]

A real controller (and agent) on a scratch PostgreSQL. One client is made and kept:
every submission (a script, its directory, a submit_key, held so that no pass starts
jobs meanwhile) goes over its one connection, one after the other, and each answer must
be 201 on a connection the server keeps open. The client is gpusched's own
(gpusched.client.ApiClient, as gsubmit and any Python caller use it), and, for
comparison, the standard library's ``http.client`` (which sends a request's head and
body in two writes):

- ``api_keepalive_submits_per_s``: ApiClient over the Unix socket (the caller known by
  SO_PEERCRED);
- ``api_keepalive_tcp_key_submits_per_s``: ApiClient over TCP, each request with a
  key-method token signed in process (as root or an agent does, holding a host key);
- ``api_keepalive_httpclient_submits_per_s``, ``api_keepalive_httpclient_tcp_key_*``:
  the same with ``http.client``;
- ``*_server_ms_median``: the controller's own time per submission (from reading the
  request to its answer being ready, its stage log), the rest being the client, the
  socket and the encoding: from one more run, on a controller with its stage log on
  (GPUSCHED_LOG_STAGES=1, which costs it about 0.1 ms of CPU per submission); the other
  figures are of a controller without it, as one runs in service;
- ``*_reconnects``: connections opened again during the timed submissions (0: the
  controller kept the first one open throughout);
- ``*_controller_cpu_s_per_1000``, ``*_postgres_cpu_s_per_1000``,
  ``*_client_cpu_s_per_1000``: CPU time (user and system) of the controller process, of
  the PostgreSQL server's processes and of this one (the client), per 1,000 timed
  submissions: steadier than the rate on a busy machine, and their sum bounds the rate
  of one client from above.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpusched.auth.keys import (  # noqa: E402
    derive_host_key,
    new_master_key,
    render_master_key,
    write_key_file,
)
from gpusched.auth.keytoken import KeySigner  # noqa: E402
from gpusched.client.api import ApiClient  # noqa: E402
from gpusched.client.endpoints import Endpoint  # noqa: E402
from tests.e2e.cluster import scratch_cluster  # noqa: E402

_ANSWERED = re.compile(r"stage answered t=\S+ jobs=- method=POST path=/v1/jobs status=201 "
                       r"ms=(\S+)")


class UnixConnection(http.client.HTTPConnection):
    """http.client over the controller's Unix socket."""

    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=30)
        self.path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path)
        self.sock = sock


def cpu_seconds(pids: Sequence[int]) -> float:
    """User and system CPU time of these processes so far (those gone count 0)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def postgres_pids(url: str) -> list[int]:
    """The PostgreSQL server of ``url`` (a scratch one, its socket beside its data
    directory) and every process it has started."""
    socket_dir = Path(re.search(r"host=([^&]+)", url).group(1))  # type: ignore[union-attr]
    server = int((socket_dir.parent / "data" / "postmaster.pid").read_text().split()[0])
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == server:
                children.append(int(stat.parent.name))
        except (OSError, ValueError):
            continue
    return [server, *children]


class Submitter:
    """Sends one held submission and checks its answer; ``opened``: connections it has
    opened so far."""

    def __init__(self, send: Callable[[dict[str, Any]], tuple[int, bytes, bool]],
                 opened: Callable[[], int]) -> None:
        self.send, self.opened = send, opened

    @classmethod
    def api_client(cls, client: ApiClient) -> Submitter:
        """gpusched's own client: one write per request."""

        def send(body: dict[str, Any]) -> tuple[int, bytes, bool]:
            data = client.request_bytes("POST", "/v1/jobs", body)
            return 201, data, False  # a 2xx, else it raised; closing shows in opened

        return cls(send, lambda: client.connections_opened)

    @classmethod
    def http_client(cls, conn: http.client.HTTPConnection,
                    authorization: Callable[[], str] | None) -> Submitter:
        """The standard library's client."""
        opened = 0

        def send(body: dict[str, Any]) -> tuple[int, bytes, bool]:
            nonlocal opened
            if conn.sock is None:
                opened += 1
            headers = {"Content-Type": "application/json"}
            if authorization is not None:
                headers["Authorization"] = authorization()
            conn.request("POST", "/v1/jobs", json.dumps(body), headers)
            answer = conn.getresponse()
            closed = answer.getheader("Connection", "").lower() == "close"
            return answer.status, answer.read(), closed

        return cls(send, lambda: opened)


def submits_per_s(submitter: Submitter, work: Path, count: int,
                  watched: Callable[[], dict[str, list[int]]] = dict
                  ) -> tuple[float, int, dict[str, float]]:
    """Sequential held submissions; the rate, how many times the connection was opened
    again while timed (0: kept alive throughout), and the CPU seconds of each group of
    ``watched`` processes per 1,000 timed submissions."""
    body = {"script": "#!/bin/sh\ntrue\n", "work_dir": str(work), "hold": True, "gpus": 1}

    def one() -> None:
        status, data, closed = submitter.send({**body, "submit_key": os.urandom(16).hex()})
        if status != 201:
            raise SystemExit(f"submit answered {status}: {data[:200]!r}")
        if closed:
            raise SystemExit("the controller closed a keep-alive connection")

    for _ in range(20):  # warm up: the connection, caches, the first queries
        one()
    opened = submitter.opened()
    groups = watched()
    cpu = {name: cpu_seconds(pids) for name, pids in groups.items()}
    began = time.perf_counter()
    for _ in range(count):
        one()
    rate = count / (time.perf_counter() - began)
    return rate, submitter.opened() - opened, {
        name: (cpu_seconds(pids) - cpu[name]) * 1000 / count for name, pids in groups.items()}


def server_ms(log: Path, skip: int) -> float:
    """Median controller-side ms of the POST /v1/jobs answers in ``log`` after the
    first ``skip``."""
    found = [float(m.group(1)) for m in _ANSWERED.finditer(log.read_text(errors="replace"))]
    return statistics.median(found[skip:]) if found[skip:] else float("nan")


def _ours(client: ApiClient) -> tuple[Submitter, Callable[[], None]]:
    return Submitter.api_client(client), client.close


def _stdlib(conn: http.client.HTTPConnection, authorization: Callable[[], str] | None
            ) -> tuple[Submitter, Callable[[], None]]:
    return Submitter.http_client(conn, authorization), conn.close


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submits", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    site = Path(f"/tmp/gpusched-bench-api-{os.getpid()}")
    site.mkdir(mode=0o755)
    master = new_master_key()
    write_key_file(site / "master.key", render_master_key(master))
    auth = f'[auth]\nmethod = "key"\nkey_file = "{site / "master.key"}"\nreplay_cache = 10000000\n'
    signer = KeySigner(derive_host_key(master, "login1"))

    def series(stages: bool, runs: int) -> None:
        """``runs`` runs over each transport on a cluster of its own, with its stage log
        on (the server's ms printed) or off (the rest)."""
        if stages:
            os.environ["GPUSCHED_LOG_STAGES"] = "1"
        else:
            os.environ.pop("GPUSCHED_LOG_STAGES", None)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        with scratch_cluster(listen=[f"127.0.0.1:{port}"], auth_toml=auth) as (cluster, url):
            log = cluster.root / "controller.log"
            controller = cluster.procs["controller"].pid

            def watched() -> dict[str, list[int]]:
                return {"controller": [controller], "postgres": postgres_pids(url),
                        "client": [os.getpid()]}

            endpoint = Endpoint("127.0.0.1", port)
            transports: list[tuple[str, Callable[[], tuple[Submitter, Callable[[], None]]]]] = [
                ("api_keepalive", lambda: _ours(ApiClient(cluster.socket))),
                ("api_keepalive_tcp_key", lambda: _ours(ApiClient(
                    controllers=[endpoint], credentials=signer.authorization))),
                ("api_keepalive_httpclient", lambda: _stdlib(
                    UnixConnection(cluster.socket), None)),
                ("api_keepalive_httpclient_tcp_key", lambda: _stdlib(
                    http.client.HTTPConnection("127.0.0.1", port, timeout=30),
                    signer.authorization))]
            seen = 0
            for _ in range(runs):
                for name, connect in transports:
                    submitter, close = connect()
                    rate, opened, cpu = submits_per_s(submitter, cluster.work, args.submits,
                                                      watched)
                    close()
                    if stages:
                        print(f"{name}_server_ms_median: {server_ms(log, seen + 20):.2f}")
                    else:
                        print(f"{name}_submits_per_s: {rate:.0f}")
                        print(f"{name}_reconnects: {opened}")
                        for group, seconds in cpu.items():
                            print(f"{name}_{group}_cpu_s_per_1000: {seconds:.3f}")
                    seen += 20 + args.submits

    try:
        series(False, args.runs)
        series(True, 1)
    finally:
        for path in site.iterdir():
            path.unlink()
        site.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
