"""What reading the metrics and the diag costs on a cluster with a long history; prints
``name: value`` lines.

    .venv/bin/python bench/metrics.py [--history 20000] [--pending 1000] [--requests 100]
                                      [--queue 600] [--rounds 300] [--seconds 900]

A real controller and agent on a scratch PostgreSQL; the agent discovers 8 A100s through
the real pynvml from the project's fake NVML library (tests/fakenvml) and samples them
every second (``[agent.health] interval = 1``); both serve their ``[metrics]`` listener
on a loopback port. One job runs on 2 GPUs, ``--pending`` held jobs are submitted
through the API, and ``--history`` finished (COMPLETED) jobs, copies of the running one
with 2 released allocations each, are inserted in the database, then ANALYZE. Every
request below is made ``--requests`` times one after another, after 5 to warm up:

- ``jobs_rows``, ``allocation_rows``: what the database holds while measuring;
- ``controller_scrape_ms_median``, ``_p95``: the controller's ``GET /metrics``, each on
  a new connection (as Prometheus without keep-alive), from the request to the last byte;
  ``controller_scrape_bytes``: the size of one scrape;
- ``scrape_statement_ms``: the time of the scrape's SQL statement, as the controller
  reports it (``gpusched_metrics_query_duration_seconds`` of one more scrape);
- ``agent_scrape_ms_median``, ``_p95``: the agent's ``GET /metrics``;
- ``diag_ms_median``, ``_p95``: ``GET /v1/diag`` over the Unix socket on one client;
- ``passes_while_measuring``, ``pass_mean_ms``: the controller's passes so far (diag);
- ``observe_pass_us``: in this process, what recording one pass costs
  (``ControllerMetrics.observe_pass``) for a pass over 10,000 pending jobs that started
  100, mean of 100.

Then, unless ``--rounds 0``: do scrapes slow the passes? ``--queue`` jobs of 8 GPUs are
submitted (they wait behind the running job), and four rounds of ``--rounds``
submissions, each cancelled 10 ms after it was made, 10 ms apart, wake passes:
without scrapes, with a scrape every 50 ms, again without, again with.
``pass_mean_ms_<round>``: the passes' mean time during that round (from diag), with
how many passes and scrapes there were (the rounds differ by the machine's other load
as well).

Every loop is bounded in count and by ``--seconds`` in all; the cluster, the database
and the temporary directory are removed at the end, on failure too.
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, text  # noqa: E402

from gpusched.client import ApiClient  # noqa: E402
from gpusched.controller.metrics import ControllerMetrics  # noqa: E402
from gpusched.core.model import (  # noqa: E402
    Pending,
    PendingJob,
    Plan,
    Reason,
    Snapshot,
    Start,
)
from tests.e2e.cluster import Cluster, scratch_cluster  # noqa: E402
from tests.nvml_fixture import FakeNvml, build_fake_nvml  # noqa: E402
from tests.ops.metrics_cluster import free_port, get  # noqa: E402

WARM_UP = 5

# Copies of the running job, finished: ids of their own, no submit key (it is unique per
# user), run and ended at times an hour or more ago, one second apart.
HISTORY_JOBS = text("""
INSERT INTO jobs
SELECT (r).* FROM (
    SELECT jsonb_populate_record(j, jsonb_build_object(
        'id', nextval(pg_get_serial_sequence('jobs', 'id')),
        'state', 'COMPLETED', 'submit_key', NULL, 'exit_code', 0,
        'submit_time', now() - interval '3 hours' - n * interval '1 second',
        'start_time', now() - interval '2 hours' - n * interval '1 second',
        'end_time', now() - interval '1 hour' - n * interval '1 second')) AS r
    FROM jobs j, generate_series(1, :count) AS n
    WHERE j.id = :job) copies""")
# Each finished job held the node's first 2 GPUs while it ran.
HISTORY_ALLOCATIONS = text("""
INSERT INTO allocations (job_id, gpu_id, node_id, allocated_at, released_at)
SELECT j.id, g.id, g.node_id, j.start_time, j.end_time
FROM jobs j CROSS JOIN LATERAL (SELECT id, node_id FROM gpus ORDER BY id LIMIT 2) g
WHERE j.state = 'COMPLETED'""")
ROWS = text("SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM allocations)")


class Deadline:
    """The bench's whole time: every loop asks it before each step."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def check(self) -> None:
        if time.monotonic() > self.at:
            raise SystemExit(f"ran past --seconds {self.seconds:g}")


def percentile(ordered: Sequence[float], share: float) -> float:
    """Nearest-rank percentile of sorted values."""
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def timed(request: Callable[[], object], count: int, deadline: Deadline) -> tuple[float, float]:
    """Median and p95 ms of ``count`` calls of ``request``, after WARM_UP untimed ones."""
    for _ in range(WARM_UP):
        deadline.check()
        request()
    took = []
    for _ in range(count):
        deadline.check()
        began = time.perf_counter()
        request()
        took.append((time.perf_counter() - began) * 1000)
    took.sort()
    return statistics.median(took), percentile(took, 0.95)


def scrape(port: int) -> bytes:
    """One ``GET /metrics``; its body, which must be a 200's."""
    status, _type, body = get(port, "/metrics")
    if status != 200:
        raise SystemExit(f"GET /metrics on port {port} answered {status}: {body[:200]!r}")
    return body


def submit(client: ApiClient, body: dict[str, object], count: int, deadline: Deadline) -> None:
    for _ in range(count):
        deadline.check()
        client.request("POST", "/v1/jobs", body)


def insert_history(url: str, job: int, count: int) -> tuple[int, int]:
    """``count`` finished copies of ``job`` with their allocations; the rows after."""
    engine = create_engine(url)
    try:
        with engine.begin() as db:
            if count:
                db.execute(HISTORY_JOBS, {"count": count, "job": job})
                db.execute(HISTORY_ALLOCATIONS)
            db.execute(text("ANALYZE"))
            jobs, allocations = db.execute(ROWS).one()
        return int(jobs), int(allocations)
    finally:
        engine.dispose()


def observe_pass_us() -> float:
    """Mean µs of ``observe_pass`` for 10,000 pending jobs of which 100 started."""
    metrics = ControllerMetrics(None)
    pending = tuple(PendingJob(job_id=i, partition="gpu", gpus=1, uid=0, submit_time=0.0)
                    for i in range(10_000))
    plan = Plan(starts=tuple(Start(i, "node01", ("GPU-0",)) for i in range(100)),
                pending=tuple(Pending(i, Reason.RESOURCES) for i in range(100, 10_000)))
    snapshot = Snapshot(nodes=(), partitions=(), pending=pending)
    began = time.perf_counter()
    for _ in range(100):
        metrics.observe_pass(0.01, snapshot, plan, 1000.0)
    return (time.perf_counter() - began) / 100 * 1e6


def measure_reads(cluster: Cluster, url: str, args: argparse.Namespace, ports: tuple[int, int],
                  deadline: Deadline) -> int:
    """The scrape and diag figures; returns the running job's id."""
    controller_port, agent_port = ports
    job = cluster.submit("-G", "2", "--wrap", "sleep 3600")
    cluster.wait_state(job, "RUNNING", timeout=60)
    held = {"script": "#!/bin/sh\ntrue\n", "work_dir": str(cluster.work),
            "output": "/dev/null", "hold": True}
    with ApiClient(cluster.socket, timeout=60) as client:
        submit(client, held, args.pending, deadline)
    deadline.check()
    jobs, allocations = insert_history(url, job, args.history)
    print(f"jobs_rows: {jobs}")
    print(f"allocation_rows: {allocations}")
    size = len(scrape(controller_port))
    median, p95 = timed(lambda: scrape(controller_port), args.requests, deadline)
    print(f"controller_scrape_ms_median: {median:.2f}")
    print(f"controller_scrape_ms_p95: {p95:.2f}")
    print(f"controller_scrape_bytes: {size}")
    statement = [line for line in scrape(controller_port).decode().splitlines()
                 if line.startswith("gpusched_metrics_query_duration_seconds ")]
    if len(statement) != 1:
        raise SystemExit("the scrape has no gpusched_metrics_query_duration_seconds")
    print(f"scrape_statement_ms: {float(statement[0].split()[-1]) * 1000:.2f}")
    median, p95 = timed(lambda: scrape(agent_port), args.requests, deadline)
    print(f"agent_scrape_ms_median: {median:.2f}")
    print(f"agent_scrape_ms_p95: {p95:.2f}")
    with ApiClient(cluster.socket, timeout=60) as client:
        median, p95 = timed(lambda: client.request("GET", "/v1/diag"), args.requests, deadline)
    print(f"diag_ms_median: {median:.2f}")
    print(f"diag_ms_p95: {p95:.2f}")
    passes = cluster.api("GET", "/v1/diag")["scheduler"]
    print(f"passes_while_measuring: {passes['passes']}")
    print(f"pass_mean_ms: {passes['mean_ms']}")
    print(f"observe_pass_us: {observe_pass_us():.0f}")
    return job


def pass_round(cluster: Cluster, port: int, rounds: int, scraping: bool,
               deadline: Deadline) -> tuple[float, int, int]:
    """One round of submissions and cancels, with or without a scraper; the passes' mean
    ms in it, how many passes and how many scrapes."""
    stop = threading.Event()
    scrapes = [0]

    def scraper() -> None:
        while not stop.is_set() and time.monotonic() < deadline.at:
            scrape(port)
            scrapes[0] += 1
            stop.wait(0.05)

    thread = threading.Thread(target=scraper, daemon=True)
    body = {"script": "#!/bin/sh\ntrue\n", "work_dir": str(cluster.work),
            "output": "/dev/null", "gpus": 8}
    before = cluster.api("GET", "/v1/diag")["scheduler"]
    if scraping:
        thread.start()
    try:
        with ApiClient(cluster.socket, timeout=60) as client:
            for _ in range(rounds):
                deadline.check()
                made = client.request("POST", "/v1/jobs", body)["job_id"]
                time.sleep(0.01)
                client.request("POST", f"/v1/jobs/{made}/cancel", {})
                time.sleep(0.01)
        time.sleep(2)  # the last passes woken end
        after = cluster.api("GET", "/v1/diag")["scheduler"]
    finally:
        stop.set()
        if scraping:
            thread.join(timeout=30)
    count = after["passes"] - before["passes"]
    spent = after["mean_ms"] * after["passes"] - before["mean_ms"] * before["passes"]
    return (spent / count if count else float("nan")), count, scrapes[0]


def measure_passes(cluster: Cluster, args: argparse.Namespace, port: int,
                   deadline: Deadline) -> None:
    """Pass time with and without a scraper, over a queue of ``--queue`` jobs."""
    queued = {"script": "#!/bin/sh\ntrue\n", "work_dir": str(cluster.work),
              "output": "/dev/null", "gpus": 8}
    with ApiClient(cluster.socket, timeout=60) as client:
        submit(client, queued, args.queue, deadline)
    time.sleep(3)  # the passes the queue woke end
    for label, scraping in (("no_scrapes", False), ("scrapes_every_50ms", True),
                            ("no_scrapes_again", False), ("scrapes_every_50ms_again", True)):
        mean, count, scrapes = pass_round(cluster, port, args.rounds, scraping, deadline)
        print(f"pass_mean_ms_{label}: {mean:.2f} (passes {count}, scrapes {scrapes})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=20_000,
                        help="finished jobs inserted in the database")
    parser.add_argument("--pending", type=int, default=1000, help="held jobs submitted")
    parser.add_argument("--requests", type=int, default=100,
                        help="timed requests of each kind")
    parser.add_argument("--queue", type=int, default=600,
                        help="jobs of 8 GPUs waiting during the pass rounds")
    parser.add_argument("--rounds", type=int, default=300,
                        help="submissions and cancels per pass round (0: no pass rounds)")
    parser.add_argument("--seconds", type=float, default=900.0, help="the most it may take")
    args = parser.parse_args(argv)
    if not (0 <= args.history <= 1_000_000 and 0 <= args.pending <= 100_000
            and 1 <= args.requests <= 10_000 and 0 <= args.queue <= 10_000
            and 0 <= args.rounds <= 10_000 and 1 <= args.seconds <= 3600):
        parser.error("history 0..1,000,000, pending 0..100,000, requests 1..10,000, "
                     "queue and rounds 0..10,000, seconds 1..3,600")
    deadline = Deadline(args.seconds)
    work = Path(tempfile.mkdtemp(prefix="gpusched-bench-metrics-"))
    try:
        fake = FakeNvml(build_fake_nvml(work / "lib"), "dgx_a100_8.json", work / "faults")
        ports = (free_port(), free_port())
        listeners = (f'[metrics]\ncontroller_listen = "127.0.0.1:{ports[0]}"\n'
                     f'agent_listen = "127.0.0.1:{ports[1]}"\n')
        with scratch_cluster(nvml=fake.variables(), auth_toml=listeners,
                             agent_toml="[agent.health]\ninterval = 1\n") as (cluster, url):
            measure_reads(cluster, url, args, ports, deadline)
            if args.rounds:
                measure_passes(cluster, args, ports[0], deadline)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
