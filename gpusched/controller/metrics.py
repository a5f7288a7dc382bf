"""The controller's metrics (``/metrics``, docs/operations.md) and the figures of
``gpusched diag``: what this process saw (its passes, its API requests, its database
pool) is counted as it happens; what the cluster is (jobs, GPUs, nodes) is read from
the database at each scrape, in one statement (gpusched.db.metrics).

Each controller keeps its own registry (not prometheus_client's global one), so that
several controllers in one process (the tests) count apart. Observing a pass or a
request costs a few microseconds and takes no database connection.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

import gpusched
from gpusched.db.metrics import ClusterCounts, read_counts

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker
    from sqlalchemy.pool import Pool

    from gpusched.core.model import Plan, Snapshot

log = logging.getLogger(__name__)
# No *_created series: nothing reads them, and they double every counter's lines.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
DEPTH_BUCKETS = (1, 10, 100, 1000, 10_000, 100_000)
WAIT_BUCKETS = (1, 10, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86_400, 3 * 86_400, 7 * 86_400)
# An agent's work poll waits up to poll_wait (20 s by default) before it is answered.
API_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
               30.0)
UNMATCHED = "unmatched"  # the route label of a path no route serves (a 404)
# Methods named as they are; any other token a client sends counts as "other", so that
# no client can grow the label values without bound.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_CAPTURE = re.compile(r"\(\?P<(\w+)>\[\^/\]\+\)")


def route_template(pattern: str) -> str:
    """``/v1/jobs/{job_id}`` from the router's ``^/v1/jobs/(?P<job_id>[^/]+)$``."""
    return _CAPTURE.sub(r"{\1}", pattern.removeprefix("^").removesuffix("$")) or UNMATCHED


@dataclass
class PassFigures:
    """What this controller's passes did since it started (``gpusched diag``)."""

    passes: int = 0
    last_at: float | None = None  # epoch seconds the last pass ended
    last_s: float = 0.0
    max_s: float = 0.0
    total_s: float = 0.0
    depth_last: int = 0  # jobs the last pass examined (started or left pending)
    depth_max: int = 0
    depth_total: int = 0
    stopped_early: int = 0  # passes whose time budget ran out before the queue's end
    immediate: int = 0  # jobs started in priority order
    backfilled: int = 0  # jobs started past a blocked one

    def as_json(self) -> dict[str, Any]:
        """The ``scheduler`` part of the diag answer."""
        n = self.passes
        return {
            "passes": n,
            "last_pass_at": _iso(self.last_at),
            "last_ms": round(self.last_s * 1000, 3), "max_ms": round(self.max_s * 1000, 3),
            "mean_ms": round(self.total_s * 1000 / n, 3) if n else 0.0,
            "depth": {"last": self.depth_last, "max": self.depth_max,
                      "mean": round(self.depth_total / n, 1) if n else 0.0},
            "stopped_early": self.stopped_early,
            "starts": {"immediate": self.immediate, "backfilled": self.backfilled},
        }


@dataclass
class RouteFigures:
    """Requests of one (method, route) and their time, for diag."""

    count: int = 0
    errors: int = 0  # answered 4xx or 5xx
    total_s: float = 0.0
    max_s: float = 0.0


class ControllerMetrics:
    """Counts passes and requests as they happen, and reads the cluster at a scrape."""

    def __init__(self, sessions: sessionmaker[Session] | None, pool: Pool | None = None,
                 is_leader: Callable[[], bool] = lambda: False) -> None:
        self.sessions = sessions
        self.pool = pool
        self.is_leader = is_leader
        self.started_at = time.time()
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.pass_seconds = Histogram(
            "gpusched_scheduler_pass_duration_seconds",
            "Scheduling passes of this controller (snapshot, plan, apply) by duration.",
            buckets=PASS_BUCKETS, registry=r)
        self.pass_depth = Histogram(
            "gpusched_scheduler_pass_jobs_examined",
            "Jobs each pass examined (started or left pending): how deep it went.",
            buckets=DEPTH_BUCKETS, registry=r)
        self.passes_stopped = Counter(
            "gpusched_scheduler_passes_stopped_early",
            "Passes whose time budget ran out before the end of the queue.", registry=r)
        self.starts = Counter(
            "gpusched_job_starts", "Jobs started by this controller's passes, by kind "
            "(immediate: in priority order; backfilled: past a blocked job).",
            ["kind"], registry=r)
        self.wait_seconds = Histogram(
            "gpusched_job_wait_seconds", "Time from submission to start of the jobs "
            "this controller started, by partition.", ["partition"], buckets=WAIT_BUCKETS,
            registry=r)
        self.requests = Counter(
            "gpusched_api_requests", "API requests answered, by method, route and status.",
            ["method", "route", "code"], registry=r)
        self.request_seconds = Histogram(
            "gpusched_api_request_duration_seconds", "Time to answer API requests (an "
            "agent's work poll waits for work), by method and route.", ["method", "route"],
            buckets=API_BUCKETS, registry=r)
        for kind in ("immediate", "backfilled"):
            self.starts.labels(kind)  # both series exist from the start, at 0
        r.register(_ClusterCollector(self))
        self.figures = PassFigures()
        self.routes: dict[tuple[str, str], RouteFigures] = {}
        self._lock = threading.Lock()
        self._templates: dict[str, str] = {}
        self.cluster = AccountHours()

    # -- what happens -----------------------------------------------------------
    def observe_pass(self, seconds: float, snapshot: Snapshot, decided: Plan,
                     now: float) -> None:
        """One pass done: its time, depth, starts by kind and the started jobs' waits."""
        depth = len(decided.starts) + len(decided.pending)
        backfilled = sum(1 for s in decided.starts if s.kind == "backfilled")
        immediate = len(decided.starts) - backfilled
        self.pass_seconds.observe(seconds)
        self.pass_depth.observe(depth)
        if decided.resume_after is not None:
            self.passes_stopped.inc()
        if immediate:
            self.starts.labels("immediate").inc(immediate)
        if backfilled:
            self.starts.labels("backfilled").inc(backfilled)
        if decided.starts:
            started: dict[int, int] = {}
            for start in decided.starts:  # an array's record may start several tasks
                started[start.job_id] = started.get(start.job_id, 0) + 1
            for job in snapshot.pending:
                times = started.get(job.job_id)
                if times:
                    histogram = self.wait_seconds.labels(job.partition)
                    for _ in range(times):
                        histogram.observe(max(0.0, now - job.submit_time))
        with self._lock:
            f = self.figures
            f.passes += 1
            f.last_at, f.last_s = now, seconds
            f.max_s = max(f.max_s, seconds)
            f.total_s += seconds
            f.depth_last, f.depth_max = depth, max(f.depth_max, depth)
            f.depth_total += depth
            f.stopped_early += decided.resume_after is not None
            f.immediate += immediate
            f.backfilled += backfilled

    def observe_request(self, method: str, pattern: str, status: int, seconds: float) -> None:
        """One API request answered (``pattern``: the router's, "" when none matched)."""
        method = method if method in METHODS else "other"
        route = self._templates.get(pattern)
        if route is None:
            route = self._templates[pattern] = route_template(pattern)
        self.requests.labels(method, route, str(status)).inc()
        self.request_seconds.labels(method, route).observe(seconds)
        with self._lock:
            figures = self.routes.get((method, route))
            if figures is None:
                figures = self.routes[(method, route)] = RouteFigures()
            figures.count += 1
            figures.errors += status >= 400
            figures.total_s += seconds
            figures.max_s = max(figures.max_s, seconds)

    # -- what is read ------------------------------------------------------------
    def scrape(self) -> bytes:
        """The text exposition of every metric (what ``GET /metrics`` answers)."""
        return prometheus_client.generate_latest(self.registry)

    def read_cluster(self) -> ClusterCounts | None:
        """The database's counts now; None when the database cannot be read."""
        if self.sessions is None:
            return None
        try:
            with self.sessions() as session:
                counts = read_counts(session)
        except Exception as exc:  # noqa: BLE001 - a scrape still shows the process's own
            log.warning("metrics: cannot read the cluster from the database: %s",
                        str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)
            return None
        self.cluster.advance(counts)
        return counts

    def pool_figures(self) -> dict[str, int]:
        """The database pool: its size, connections in use, idle, and beyond the size."""
        pool = self.pool
        if pool is None:
            return {"size": 0, "checked_out": 0, "idle": 0, "overflow": 0}
        size, out = _call(pool, "size"), _call(pool, "checkedout")
        return {"size": size, "checked_out": out, "idle": _call(pool, "checkedin"),
                "overflow": max(0, _call(pool, "overflow"))}

    def diag(self) -> dict[str, Any]:
        """Everything ``gpusched diag`` shows (docs/operations.md has the shape)."""
        counts = self.read_cluster()
        with self._lock:
            scheduler = self.figures.as_json()
            api: list[dict[str, Any]] = [{"method": method, "route": route, "count": f.count, "errors": f.errors,
                    "mean_ms": round(f.total_s * 1000 / f.count, 3),
                    "max_ms": round(f.max_s * 1000, 3), "total_s": round(f.total_s, 3)}
                   for (method, route), f in self.routes.items()]
        api.sort(key=lambda row: (-int(row["count"]), str(row["route"]), str(row["method"])))
        now = time.time()
        return {
            "controller": {"version": gpusched.__version__, "leader": self.is_leader(),
                           "started_at": _iso(self.started_at),
                           "uptime_s": round(now - self.started_at, 3), "now": _iso(now)},
            "scheduler": scheduler,
            "api": api,
            "agents": None if counts is None else [
                {"node": node, "state": state,
                 "heartbeat_age_s": None if age is None else round(age, 3)}
                for node, state, age in counts.nodes],
            "database": {"reachable": counts is not None, "pool": self.pool_figures()},
        }


class AccountHours:
    """GPU-hours each account's running jobs held, added up at each scrape from the
    GPUs held then and at the scrape before (the trapezoid between the two): exact for
    what runs across scrapes, within one scrape interval for a job that starts or ends
    between two. It counts from this controller's start; gacct --report has the exact
    figures from the records."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.hours: dict[str, float] = {}
        self._last: tuple[float, dict[str, float]] | None = None

    def advance(self, counts: ClusterCounts) -> None:
        held = dict(counts.accounts)
        with self._lock:
            if self._last is not None and counts.now > self._last[0]:
                then, before = self._last
                span = (counts.now - then) / 3600
                for account in before.keys() | held.keys():
                    added = (before.get(account, 0.0) + held.get(account, 0.0)) / 2 * span
                    self.hours[account] = self.hours.get(account, 0.0) + added
            for account in held:
                self.hours.setdefault(account, 0.0)
            if self._last is None or counts.now > self._last[0]:
                self._last = (counts.now, held)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self.hours)


class _ClusterCollector(Collector):
    """What a scrape reads at its time: the database's counts, the pool, leadership."""

    def __init__(self, metrics: ControllerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        began = time.perf_counter()
        counts = m.read_cluster()
        took = time.perf_counter() - began
        yield _gauge("gpusched_build_info", "The controller's version.", ["version"],
                     [((gpusched.__version__,), 1.0)])
        yield _gauge("gpusched_controller_leader",
                     "1 while this controller leads (runs the passes), else 0.", [],
                     [((), 1.0 if m.is_leader() else 0.0)])
        yield _gauge("gpusched_controller_start_time_seconds",
                     "When this controller started, epoch seconds.", [],
                     [((), m.started_at)])
        pool = m.pool_figures()
        yield _gauge("gpusched_db_pool_size_connections",
                     "Connections the database pool keeps.", [], [((), pool["size"])])
        yield _gauge("gpusched_db_pool_connections",
                     "Connections of the database pool, by state (checked_out: in use; "
                     "idle: kept open, free; overflow: open beyond the pool's size).",
                     ["state"], [((s,), pool[s]) for s in ("checked_out", "idle", "overflow")])
        yield _gauge("gpusched_metrics_database_up",
                     "1 when this scrape could read the database, else 0.", [],
                     [((), 0.0 if counts is None else 1.0)])
        yield _gauge("gpusched_metrics_query_duration_seconds",
                     "Time this scrape's database statement took.", [], [((), took)])
        if counts is None:
            return
        yield _gauge("gpusched_jobs", "Pending and running jobs by state, partition and "
                     "reason (an array's pending tasks count as one).",
                     ["state", "partition", "reason"],
                     [((s, p, r), n) for s, p, r, n in counts.jobs])
        yield _gauge("gpusched_gpus", "GPUs and MIG slices that can be handed out, by "
                     "state (allocated, idle, drained, unhealthy, down), type and MIG "
                     "profile.", ["state", "type", "mig_profile"],
                     [((s, t, p), n) for s, t, p, n in counts.gpus])
        by_state: dict[str, int] = {}
        for _, state, _ in counts.nodes:
            by_state[state] = by_state.get(state, 0) + 1
        yield _gauge("gpusched_nodes", "Nodes by state.", ["state"],
                     [((s,), n) for s, n in sorted(by_state.items())])
        yield _gauge("gpusched_node_heartbeat_age_seconds",
                     "Seconds since each node's agent was last heard.", ["node"],
                     [((node,), age) for node, _, age in counts.nodes if age is not None])
        yield _gauge("gpusched_account_gpus", "GPUs the running jobs of each account hold "
                     "(a share counts as its part of the GPU).", ["account"],
                     [((a,), held) for a, held in counts.accounts])
        hours = CounterMetricFamily(
            "gpusched_account_gpu_hours", "GPU-hours held by each account's running jobs "
            "since this controller started (sampled at each scrape).", labels=["account"])
        for account, value in sorted(m.cluster.snapshot().items()):
            hours.add_metric([account], value)
        yield hours


def _gauge(name: str, doc: str, labels: list[str],
           samples: list[tuple[tuple[str, ...], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for key, value in samples:
        family.add_metric(list(key), float(value))
    return family


def _call(pool: Any, name: str) -> int:
    method = getattr(pool, name, None)
    try:
        return int(method()) if callable(method) else 0
    except Exception:  # noqa: BLE001 - a pool kind without the figure
        return 0


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC).isoformat()
