"""``gpusched controller``: the API server plus the leader-only scheduling loop."""

from __future__ import annotations

import gc
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from types import FrameType

import psycopg
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as SqlTimeoutError

from gpusched.auth.backends import Authenticator
from gpusched.config import Config
from gpusched.controller.api import Api
from gpusched.controller.events import Events
from gpusched.controller.http import (
    HttpService,
    ServerLimits,
    TcpHttpServer,
    UnixHttpServer,
)
from gpusched.controller.mail import MailJob, ThrottledLog
from gpusched.controller.metrics import ControllerMetrics
from gpusched.controller.metrics_http import MetricsServer
from gpusched.controller.retention import ArchiveShelf, RetentionJob
from gpusched.controller.scheduler import SchedulerLoop
from gpusched.db import allocations, health, node_failure
from gpusched.db.engine import make_engine, make_sessionmaker, psycopg_dsn
from gpusched.db.leadership import NotLeader
from gpusched.db.migrate import current
from gpusched.db.notify import notify_in
from gpusched.db.partitions import seed_partitions
from gpusched.db.usage import accrue_usage
from gpusched.errors import Unavailable

log = logging.getLogger(__name__)
# What a request fails with when the database is out of reach or its pool exhausted:
# answered 503 (HttpService.unavailable). Statements run on the driver's connection
# (db.engine.driver, the hot paths) raise psycopg's own error, not SQLAlchemy's.
UNAVAILABLE: tuple[type[Exception], ...] = (SqlTimeoutError, OperationalError,
                                            psycopg.OperationalError)
SWITCH_INTERVAL = 0.0005  # seconds; see serve_forever
GC_THRESHOLD = 50_000  # allocations between young-generation collections (default 700)


class DatabaseDownLog:
    """The periodic jobs' failures to reach the database (PostgreSQL down or
    restarting, the pool exhausted): one WARNING line per job at most every EVERY
    seconds (mail's ThrottledLog), with no traceback; the job simply runs again at its
    next interval."""

    EVERY = 60.0

    def __init__(self) -> None:
        self.throttle = ThrottledLog(self.EVERY, log)

    def around(self, job: Callable[[], None]) -> Callable[[], None]:
        """``job``, its database failures logged here instead of raised."""
        name = getattr(job, "__name__", "periodic job")

        def run() -> None:
            try:
                job()
            except (SqlTimeoutError, OperationalError) as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                self.throttle.warning(name, f"{name}: the database cannot be reached "
                                            f"({first[:200]}); trying again at its next run")

        run.__name__ = name
        return run

class Controller:
    """One controller process; several may run against one database."""

    def __init__(self, config: Config) -> None:
        self.config = config
        try:
            revision = current(config.database_url)
        except OperationalError as exc:
            raise Unavailable(f"cannot reach the database: {exc.orig}") from None
        if revision is None:
            raise Unavailable("the database has no gpusched schema; run 'gpusched db upgrade'")
        self.engine = make_engine(config.database_url, pool_size=20)
        self.sessions = make_sessionmaker(self.engine)
        with self.sessions() as session, session.begin():
            seed_partitions(session, config.partitions)
        dsn = psycopg_dsn(config.database_url)
        self.events = Events()
        self.events.own_senders(self.engine)
        self.scheduler = SchedulerLoop(self.sessions, self.events, dsn, config.scheduler.policy(),
                                       config.scheduler.pass_budget or None,
                                       config.scheduler.admin_cache_max_age)
        retention = config.controller.retention
        self.retention = (RetentionJob(self.sessions, retention, self.scheduler.leadership)
                          if retention.purge_after is not None else None)
        if self.retention is not None and retention.archive:
            self.retention.shelf.prepare()  # a bad archive directory stops the start here
        self.metrics = ControllerMetrics(self.sessions, self.engine.pool,
                                         lambda: self.scheduler.is_leader)
        self.scheduler.observer = self.metrics.observe_pass
        api = Api(self.sessions, self.events, lambda: self.scheduler.is_leader,
                  lambda: asdict(self.scheduler.stats), config.scheduler.policy(),
                  (config.controller.idle_percent, config.controller.idle_after),
                  config.controller.max_submit_jobs_per_user, config.controller.admin_group,
                  config.scheduler.allocation_grace, self.metrics,
                  archives=ArchiveShelf(config.controller.retention.archive_dir))
        limits = ServerLimits(idle_timeout=config.controller.idle_timeout,
                              max_connections=config.controller.max_connections,
                              max_connections_per_user=config.controller.max_connections_per_user)
        router = api.router()
        service = HttpService(router, limits, *_authentication(config))
        service.unavailable = UNAVAILABLE
        service.observe = self.metrics.observe_request
        self.server = UnixHttpServer(config.controller.socket, router,
                                     config.controller.socket_mode, limits, service)
        self.listeners: list[TcpHttpServer] = []
        self.metrics_server: MetricsServer | None = None
        try:
            for endpoint in config.controller.listen:
                self.listeners.append(TcpHttpServer(endpoint, service))
            if (where := config.metrics.controller_listen) is not None:
                self.metrics_server = MetricsServer(where.host, where.port, self.metrics.scrape,
                                                    "metrics.controller_listen")
        except BaseException:
            self._close_servers()
            raise
        self.periodic = BackgroundScheduler(daemon=True)
        self._database_down = DatabaseDownLog()
        quiet = self._database_down.around
        self.periodic.add_job(self.events.wake_scheduler, "interval",
                              seconds=config.controller.schedule_interval, id="backstop-pass")
        self.periodic.add_job(quiet(self.accrue_usage), "interval",
                              seconds=config.scheduler.usage_interval, id="fairshare-usage")
        # Often enough that a dead node's jobs are requeued within node_timeout + 5 s.
        self.periodic.add_job(quiet(self.check_nodes), "interval",
                              seconds=min(5.0, max(1.0, config.controller.node_timeout / 5)),
                              id="node-liveness")
        # An allocation whose client went silent ends within the grace and a fifth of it.
        self.periodic.add_job(quiet(self.check_allocations), "interval",
                              seconds=min(5.0, max(1.0, config.scheduler.allocation_grace / 5)),
                              id="allocation-clients")
        if config.controller.gpu_resume_after:
            self.periodic.add_job(quiet(self.resume_gpus), "interval",
                                  seconds=max(1.0, min(60.0, config.controller.gpu_resume_after / 4)),
                                  id="gpu-clean-period")
        if self.retention is not None:  # finished jobs archived and purged
            self.periodic.add_job(quiet(self.retention.run), "interval",
                                  seconds=config.controller.retention.interval, id="job-retention")
        if config.mail.method != "off":  # on APScheduler's threads: never in a pass's way
            self.periodic.add_job(MailJob(config.mail, self.sessions,
                                          lambda: self.scheduler.is_leader).run, "interval",
                                  seconds=config.mail.interval, id="mail", coalesce=True,
                                  max_instances=2)  # a second returns at once (MailJob.run)
        self._dsn = dsn

    def resume_gpus(self) -> None:
        """Return GPUs that stayed out of service for the clean period (leader only)."""
        if not self.scheduler.is_leader:
            return
        with self.sessions() as session, session.begin():
            back = health.resume_after(session, self.config.controller.gpu_resume_after)
        for uuid in back:
            log.info("GPU %s back in service after its clean period", uuid)
        if back:
            self.events.wake_scheduler()

    def check_nodes(self) -> None:
        """Nodes whose agent went silent for node_timeout are lost: DOWN, their jobs
        ended NODE_FAIL or requeued (leader only, in its epoch). A leader gives agents
        node_timeout from when it took over before it judges them: while no controller
        led, none could hear them."""
        leadership, timeout = self.scheduler.leadership, self.config.controller.node_timeout
        since = leadership.since
        if not self.scheduler.is_leader or since is None or time.time() - since < timeout:
            return
        try:
            with self.sessions() as session, session.begin():
                leadership.hold_epoch(session)
                lost = node_failure.fail_silent_nodes(session, timeout)
                if lost.nodes:
                    notify_in(session, "sched", *(f"node:{n}" for n in sorted(lost.kill_on)))
        except NotLeader as exc:
            log.warning("node check refused: %s; stepping down", exc)
            leadership.release()
            return
        for name in lost.nodes:
            log.warning("node %s is not responding: lost", name)
        if lost.nodes:
            log.warning("jobs requeued %s, NODE_FAIL %s, cancelled %s, failed %s",
                        lost.requeued, lost.node_failed, lost.cancelled, lost.failed)
            for name in lost.kill_on:
                self.events.wake_node(name)
            self.events.wake_scheduler()

    def check_allocations(self) -> None:
        """End allocations whose client went silent for allocation_grace (CANCELLED,
        "client lost") or that passed their time limit (TIMEOUT) (leader only, in its
        epoch). A new leader judges silence only once it has led for the grace: while
        no controller ran, none could store a heartbeat."""
        leadership, grace = self.scheduler.leadership, self.config.scheduler.allocation_grace
        since = leadership.since
        if not self.scheduler.is_leader or since is None:
            return
        try:
            with self.sessions() as session, session.begin():
                leadership.hold_epoch(session)
                checked = allocations.check_allocations(
                    session, grace, datetime.now(UTC), silent_too=time.time() - since >= grace)
                if checked.ended:
                    notify_in(session, "sched", *(f"node:{n}" for n in sorted(checked.kill_on)))
        except NotLeader as exc:
            log.warning("allocation check refused: %s; stepping down", exc)
            leadership.release()
            return
        for state, ids in sorted(checked.ended.items()):
            log.info("allocations ended %s: %s", state, ids)
        if checked.ended:
            for name in checked.kill_on:
                self.events.wake_node(name)
            self.events.wake_scheduler()

    def accrue_usage(self) -> None:
        """Bill running jobs' GPU time into fair-share usage, decayed (leader only)."""
        if not self.scheduler.is_leader:
            return
        with self.sessions() as session, session.begin():
            accrue_usage(session, datetime.now(UTC), self.config.scheduler.half_life)

    def serve_forever(self) -> None:
        """Run until SIGTERM or SIGINT."""
        # A pass is pure Python and holds the GIL for long stretches; handing it over
        # every half millisecond (instead of 5 ms) lets API requests that wait on the
        # database or the socket run between its slices.
        sys.setswitchinterval(SWITCH_INTERVAL)
        # Everything loaded so far (modules, mappers, compiled queries) lives as long as
        # the process: keep it out of the collector's scans. Listing a long queue makes
        # many short-lived objects, and a larger first generation collects them in fewer
        # passes.
        gc.freeze()
        gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
        self.events.listen(self._dsn)
        self.scheduler.start()
        self.periodic.start()

        def stop(signum: int, frame: FrameType | None) -> None:
            log.info("received signal %d, shutting down", signum)
            threading.Thread(target=self._shutdown_servers, daemon=True).start()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        for listener in self.listeners:
            threading.Thread(target=listener.serve_forever, kwargs={"poll_interval": 0.5},
                             name=f"listen-{listener.endpoint}", daemon=True).start()
        if self.metrics_server is not None:
            self.metrics_server.start()
        log.info("controller listening on %s%s", self.config.controller.socket,
                 "".join(f" and {listener.endpoint}" for listener in self.listeners))
        try:
            self.server.serve_forever(poll_interval=0.5)
        finally:
            self.close()

    def close(self) -> None:
        """Stop every thread and release the socket and leadership."""
        self.periodic.shutdown(wait=False)
        self.events.stop()
        self.scheduler.stop()
        self._close_servers()
        self.engine.dispose()

    def _shutdown_servers(self) -> None:
        """End every listener's loop (serve_forever returns)."""
        for listener in self.listeners:
            listener.shutdown()
        self.server.shutdown()

    def _close_servers(self) -> None:
        if self.metrics_server is not None:
            self.metrics_server.close()
        for listener in self.listeners:
            listener.server_close()
        self.server.server_close()


def _authentication(config: Config) -> tuple[Authenticator | None, str]:
    """What checks the credentials of requests over TCP, and its scheme; none when the
    controller listens on its Unix socket only."""
    if not config.controller.listen:
        return None, ""
    from gpusched.auth.backends import SCHEME_OF_METHOD, authenticator_for
    from gpusched.auth.nodeaddr import NodeAddressBook

    addresses = NodeAddressBook(dict(config.controller.node_addresses))
    return (authenticator_for(config.auth, node_addresses=addresses),
            SCHEME_OF_METHOD.get(config.auth.method, ""))
