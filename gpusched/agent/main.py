"""``gpusched agent``: registers the node (killing runs the controller has ended), does
the node commands it claims (launch, cancel, signal, limit, kill), reports job ends."""

from __future__ import annotations

import logging
import os
import pwd
import signal
import threading
import time
from collections import deque
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlencode

from gpusched import stages
from gpusched.agent.commands import NodeCommands
from gpusched.agent.confine import open_confinement, release
from gpusched.agent.containers import container_kind
from gpusched.agent.health import Fault, HealthMonitor
from gpusched.agent.healthcheck import HealthCheck
from gpusched.agent.inventory import node_inventory
from gpusched.agent.launcher import JobEnd, Launcher
from gpusched.agent.metrics import AgentMetrics
from gpusched.agent.nvml import NvmlUnavailable
from gpusched.agent.stepagent import NodeSteps
from gpusched.agent.steps import node_address
from gpusched.client import ApiClient
from gpusched.client.settings import controllers_from, node_credentials
from gpusched.config import Config
from gpusched.controller.metrics_http import MetricsServer
from gpusched.core.bounds import MAX_ENDS_REPORTED
from gpusched.errors import ConfigError, GpuschedError, NotFound, Unavailable
from gpusched.messages import JobEnd as EndReport
from gpusched.messages import NodeHealth, error_text

log = logging.getLogger(__name__)
MAX_BACKOFF = 2.0
STOP_ACK_TIMEOUT = 2.0  # seconds a stopping agent gives its last acknowledgements
# Threads reporting job ends, each on a connection of its own: an end that comes while
# another's report is on its way is reported at once instead of after it.
REPORTERS = 2
REMEMBER_REPORTED = 10_000


class _Stopping(BaseException):
    """Raised in the main thread by SIGTERM/SIGINT while it waits for work, to leave
    that poll at once. Not an Exception: the handlers that fail a job on whatever its
    launch raises must not take the agent's own stop for the job's fault (the launch,
    unacknowledged, is the next agent's to make)."""


class Agent:
    """One node's agent. Jobs run under supervisors that outlive it."""

    def __init__(self, config: Config, socket_path: Path) -> None:
        self.config = config.agent
        self.node = config.agent.node_name
        self.node_timeout = config.controller.node_timeout  # the controllers' (same file)
        self.socket_path = socket_path
        # Before anything is spawned: under cgroup v2 the agent moves into a leaf.
        self.confinement = open_confinement(self.config)
        self._gpus: dict[str, dict[str, Any]] = {}  # the registered GPUs, by UUID
        self.launcher = Launcher(self.config.state_dir / "jobs", site_programs=(
            self.config.prolog is not None or self.config.epilog is not None))
        self.steps = NodeSteps(self.config, self.confinement, self.config.state_dir / "jobs")
        self._address: str | None = None  # where other nodes reach this one (steps)
        # (job id, run) of runs whose end the controller acknowledged. A launch claimed
        # just before that could still come; the run's directory is gone, so only this
        # stops a rerun. A requeued job comes back under the same id as its next run.
        self._reported: deque[tuple[int, int]] = deque(maxlen=REMEMBER_REPORTED)
        self.commands = NodeCommands(self.config, self.confinement, self.launcher,
                                     self.steps, self._reported, lambda: self._gpus,
                                     self._queue_end, self._register, config.cluster_name)
        self._extra_ends: list[JobEnd] = []
        self._reporting: set[int] = set()  # jobs whose end a reporter is reporting
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._polling = False  # the main thread waits for work (see install_signal_handlers)
        self._register_lock = threading.Lock()
        self._registered: object = None  # the GPUs and links last registered
        self._monitor: HealthMonitor | None = None
        self._health_check = (
            None if self.config.health_check is None else HealthCheck(
                self.config.health_check, self.config.health_check_interval,
                self.config.health_check_timeout, self.node))
        self.trusted_server_uids = trusted_server_uids(self.config.controller_user)
        # Over TCP: the controllers to fail over between, and this node's credentials.
        self.controllers = controllers_from(os.environ, config.controllers)
        self._credentials = (node_credentials(config.auth, self.node)
                             if self.controllers else None)
        self.metrics_listen = config.metrics.agent_listen  # where GET /metrics is served
        self.metrics = (None if self.metrics_listen is None
                        else AgentMetrics(self.node, self.launcher))

    def _client(self) -> ApiClient:
        """A connection to the controllers over TCP with this node's credentials, or to
        the local socket when none are configured: there only to a trusted server (root,
        this agent's own uid, or the configured controller user)."""
        if self.controllers:
            return ApiClient(controllers=self.controllers, credentials=self._credentials)
        return ApiClient(self.socket_path, trusted_server_uids=self.trusted_server_uids)

    def inventory(self) -> dict[str, Any]:
        """What this agent registers (gpusched.agent.inventory), with how it confines
        jobs."""
        if self._address is None:
            self._address = node_address(self.config.address, self.controllers)
        return {**node_inventory(self.config), **self.confinement.registration(),
                "address": self._address, "container_runtime": container_kind(self.config)}

    def run(self) -> None:
        """Adopt surviving jobs, register, then serve launches and cancels until stopped."""
        adopted = self.launcher.adopt()
        if adopted:
            log.info("re-adopted running jobs %s", adopted)
        try:
            self.launcher.warm()
        except OSError as exc:  # the first launch starts it, or a fresh interpreter
            log.warning("cannot start the supervisor spawner yet: %s", exc)
        server = None
        if self.metrics is not None and self.metrics_listen is not None:
            server = MetricsServer(self.metrics_listen.host, self.metrics_listen.port,
                                   self.metrics.scrape, "metrics.agent_listen")
            server.start()
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        for number in range(REPORTERS):
            threading.Thread(target=self._report_loop, name=f"reporter-{number}",
                             daemon=True).start()
        self.steps.adopt()
        threading.Thread(target=self._step_report_loop, name="step-reporter",
                         daemon=True).start()
        watcher = threading.Thread(target=self._inventory_loop, name="inventory", daemon=True)
        watcher.start()
        if self.config.gpu_source != "static":
            threading.Thread(target=self._health_loop, name="health", daemon=True).start()
        if self._health_check is not None:
            threading.Thread(target=self._health_check_loop, name="health-check",
                             daemon=True).start()
        with self._client() as client:
            self._serve(client)
        if server is not None:
            server.close()
        release(self.confinement)

    def stop(self) -> None:
        """Ask the loops to finish."""
        self._stop.set()
        if self._monitor is not None:
            self._monitor.stop.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop the agent (never the jobs).

        The handler runs in the main thread between two of its steps, which may be
        inside an Event's own lock (the loop's backoff wait): setting the stop event
        there would wait for that lock for ever. So the handler only writes to a pipe,
        and a thread of its own sets the events; while the main thread waits for work,
        the handler also raises _Stopping there to leave the poll at once (no Python
        lock is taken in it)."""
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)  # a handler never waits on the pipe

        def watch() -> None:
            os.read(wake_read, 1)
            self.stop()

        threading.Thread(target=watch, name="stop-watch", daemon=True).start()

        def handler(signum: int, frame: FrameType | None) -> None:
            try:
                os.write(wake_write, b"s")
            except OSError:  # BlockingIOError after many signals: one is enough
                pass
            if self._polling:
                raise _Stopping()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def _serve(self, client: ApiClient) -> None:
        registered, backoff = False, 0.05
        try:
            while not self._stop.is_set():
                try:
                    if not registered:
                        self._health_check_result()  # run once before the node takes work
                        self._register(client)  # with that result: never UP in between
                        registered, backoff = True, 0.05
                    self._polling = True
                    try:
                        work = self._poll(client)
                    finally:
                        self._polling = False
                    if work is None:
                        registered = False  # see _poll: learn what to kill first
                        continue
                    self.commands.handle(client, work)
                except NotFound:
                    registered = False  # the controller forgot us (new database): register again
                except Unavailable as exc:
                    registered = False
                    log.warning("controller unavailable: %s", exc)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF)
                except GpuschedError as exc:
                    # Any other refusal or fault of the controller (a 500, a 403 while
                    # credentials change): the node keeps its jobs and tries again.
                    registered = False
                    log.warning("the controller refused the agent's request: %s", exc)
                    self._stop.wait(max(backoff, 1.0))
                    backoff = min(backoff * 2, MAX_BACKOFF)
        except _Stopping:
            pass
        try:  # the commands done since the last poll, which no poll will carry now
            self.commands.flush_acks(client, timeout=STOP_ACK_TIMEOUT)
        except GpuschedError as exc:
            log.warning("could not acknowledge the last commands done: %s", exc)
        log.info("agent stopped; running jobs continue under their supervisors")

    def _register(self, client: ApiClient, body: dict[str, Any] | None = None) -> None:
        """Register the node with the runs it holds, and kill at once those the
        controller has ended (fencing by run) before any new work is taken."""
        with self._register_lock:
            body = body or self.inventory()
            health = None if self._health_check is None else self._health_check.last
            answer = client.request("POST", "/agent/v1/register", {
                **body, "runs": [{"job_id": j, "run": r} for j, r in self.launcher.runs()],
                "health": None if health is None else health.to_json()})
            self._registered = _hardware(body)
            self._gpus = {g["uuid"]: g for g in body["gpus"]}
            self.commands.acks_in_poll = answer.get("acks_in_poll") is True
            for job_id, run in _runs_to_kill(answer.get("kill")):
                self.commands.kill_run(job_id, run)
        log.info("registered node %s with %d GPUs and slices (%s)", self.node,
                 len(body["gpus"]), body["source"])

    def _health_loop(self) -> None:
        """Watch the GPUs through NVML and report failing ones (gpusched.agent.health)."""
        with self._client() as client:
            def report(faults: list[Fault]) -> None:
                client.request("POST", "/agent/v1/health", {
                    "node": self.node,
                    "faults": [{"uuid": f.uuid, "reason": f.reason} for f in faults]})

            def sample(gpus: list[dict[str, Any]]) -> None:
                client.request("POST", "/agent/v1/samples", {"node": self.node, "gpus": gpus})

            make = HealthMonitor if self.metrics is None else self.metrics.health_monitor
            monitor = make(report, frozenset(self.config.ignore_xids),
                           self.config.max_temperature, self.config.health_interval, sample)
            self._monitor = monitor
            try:
                monitor.run()
            except NvmlUnavailable as exc:
                log.info("no GPU health checks: %s", exc.message)

    def _health_check_result(self) -> NodeHealth | None:
        """The node health check's latest result, running the check first if it never
        ran; None when no check is configured."""
        check = self._health_check
        if check is None:
            return None
        return check.last or check.check()

    def _report_health_check(self, client: ApiClient, health: NodeHealth | None) -> None:
        """Tell the controller what the node health check found: a failure drains the
        node, a pass lifts a drain an earlier failure made."""
        if health is not None:
            client.request("POST", f"/agent/v1/nodes/{self.node}/health", health.to_json())

    def _health_check_loop(self) -> None:
        """Run the node health check every interval and report its result."""
        check = self._health_check
        assert check is not None
        with self._client() as client:
            check.run(lambda health: self._report_health_check(client, health), self._stop)

    def _inventory_loop(self) -> None:
        """Register again when the GPUs change: one vanishes, MIG is reconfigured."""
        with self._client() as client:
            while not self._stop.wait(self.config.rediscover_interval):
                try:
                    body = self.inventory()
                    if self._registered is not None and _hardware(body) != self._registered:
                        log.warning("GPU inventory of %s changed: registering again", self.node)
                        self._register(client, body)
                except GpuschedError as exc:
                    log.warning("cannot check the GPU inventory: %s", exc)

    def _poll(self, client: ApiClient) -> dict[str, Any] | None:
        """The next work answer; None when it came so late (this agent was stopped, or
        cut off) that the controller may have given the node up and ended the runs it
        names: the agent then registers again, kills what it must, and gets the
        commands that still hold handed out again."""
        # While a launch waits for an earlier run to end here, look again soon.
        wait = min(self.config.poll_wait, 1.0) if self.commands.waiting else self.config.poll_wait
        query: dict[str, Any] = {"node": self.node, "wait": wait}
        acks = self.commands.acks_for_poll(client)
        if acks:  # the commands done since the last poll (one request less for them)
            query["done"] = ",".join(map(str, acks))
        asked = time.monotonic()
        work = client.request("GET", f"/agent/v1/work?{urlencode(query)}", timeout=wait + 15)
        took = time.monotonic() - asked
        self.commands.acked(acks)
        if took > trusted_for(wait, self.node_timeout):
            log.warning("a work answer took %.1f s: registering again before acting on it",
                        took)
            return None
        if stages.on():
            stages.stamp("received", [c["job_id"] for c in work.get("commands", ())
                                      if isinstance(c, dict) and c.get("kind") == "launch"
                                      and isinstance(c.get("job_id"), int)])
        return work

    def _queue_end(self, end: JobEnd) -> None:
        with self._lock:
            self._extra_ends.append(end)

    def _report_loop(self) -> None:
        backoff = 0.05
        with self._client() as client:
            while not self._stop.is_set():
                try:  # unreported ends stay on disk; those another reporter has are skipped
                    ended = self.launcher.wait_ended(timeout=0.5, skip=self._reporting)
                except OSError as exc:  # the state disk failing: look again, never give up
                    log.warning("cannot read job ends from the state directory: %s", exc)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF)
                    continue
                with self._lock:
                    ended = [end for end in ended if end.job_id not in self._reporting]
                    self._reporting.update(end.job_id for end in ended)
                    synthetic, self._extra_ends = self._extra_ends, []
                try:
                    backoff = self._report_ends(client, ended, synthetic, backoff)
                finally:
                    with self._lock:
                        self._reporting.difference_update(end.job_id for end in ended)

    def _report_ends(self, client: ApiClient, ended: list[JobEnd], synthetic: list[JobEnd],
                     backoff: float) -> float:
        """Report the ends read from disk and the synthetic ones; the next backoff."""
        for end in ended:  # the batch run is over: so are the job's steps here
            self.steps.end_job(end.job_id, end.run)
        for end in ended if stages.on() else ():
            stages.stamp("end_seen", (end.job_id,), started=end.start_time,
                         ended=end.end_time)
        try:
            self._report(client, ended, synthetic=False)
            while synthetic:
                batch = synthetic[:MAX_ENDS_REPORTED]
                self._report(client, batch, synthetic=True)
                del synthetic[:len(batch)]
            return 0.05
        except GpuschedError as exc:
            log.warning("cannot report job ends yet: %s", exc)
            with self._lock:
                self._extra_ends[:0] = synthetic  # kept only in memory: retry them
            self._stop.wait(backoff)
            return min(backoff * 2, MAX_BACKOFF)

    def _step_report_loop(self) -> None:
        with self._client() as client:
            self.steps.report_loop(client, self._stop)

    def _report(self, client: ApiClient, ends: list[JobEnd], synthetic: bool) -> None:
        """Report how runs ended, as many in one request as the bound allows; each is
        forgotten here once the controller has recorded it."""
        for first in range(0, len(ends), MAX_ENDS_REPORTED):
            batch = ends[first:first + MAX_ENDS_REPORTED]
            answer = client.request("POST", "/agent/v1/jobs/ended", {
                "node": self.node,
                "ends": [{"job_id": end.job_id, **self._end_report(end).to_json()}
                         for end in batch]})
            recorded = answer.get("ended")
            if not isinstance(recorded, list) or len(recorded) != len(batch):
                raise Unavailable("the controller's answer to a report of job ends does not "
                                  "name each of them")
            for end, result in zip(batch, recorded, strict=True):
                self._forget(end, synthetic, isinstance(result, dict) and result.get("stale"))

    def _end_report(self, end: JobEnd) -> EndReport:
        return EndReport(node=self.node, run=end.run, outcome=end.outcome,
                         exit_code=end.exit_code, signal=end.signal, end_time=end.end_time,
                         error=error_text(end.error), max_rss_bytes=end.max_rss_bytes,
                         cpu_usec=end.cpu_usec, epilog_error=error_text(end.epilog_error))

    def _forget(self, end: JobEnd, synthetic: bool, stale: object) -> None:
        """A run's end the controller recorded: its directory goes."""
        if not synthetic and self.launcher.run_of(end.job_id) == end.run:
            self.launcher.mark_reported(end.job_id)
        self._reported.append((end.job_id, end.run))
        stages.stamp("reported", (end.job_id,))
        log.info("job %d run %d ended: %s%s", end.job_id, end.run, end.outcome,
                 " (a run the controller had ended: ignored)" if stale else "")


def trusted_server_uids(controller_user: str | None) -> frozenset[int]:
    """The uids that may serve the controller socket: root, ours, the controller's."""
    uids = {0, os.geteuid()}
    if controller_user is not None:
        if controller_user.isdigit():
            uids.add(int(controller_user))
        else:
            try:
                uids.add(pwd.getpwnam(controller_user).pw_uid)
            except KeyError:
                raise ConfigError(f"agent.controller_user: no user {controller_user!r} "
                                  "on this node") from None
    return frozenset(uids)


def trusted_for(wait: float, node_timeout: float) -> float:
    """Seconds after asking within which a work answer may be acted on. The controller
    claimed its commands no earlier than the question and gives a node up no sooner
    than node_timeout after that, so an answer well inside node_timeout is still good;
    one from later (the agent was stopped or cut off meanwhile) may name runs already
    ended. Never less than the wait itself plus a little, so that a short timeout does
    not distrust every answer."""
    return max(wait + 0.5, min(node_timeout - 1.0, max(wait + 5.0, node_timeout / 2)))


def _runs_to_kill(raw: object) -> list[tuple[int, int]]:
    """The (job id, run) pairs of a registration's ``kill``; anything else is skipped."""
    found = []
    for item in raw if isinstance(raw, list) else []:
        pair = (item.get("job_id"), item.get("run")) if isinstance(item, dict) else (None, None)
        if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pair):
            found.append((int(pair[0]), int(pair[1])))  # type: ignore[arg-type]
        else:
            log.warning("ignoring a malformed run to kill: %.200r", item)
    return found


def _hardware(body: dict[str, Any]) -> object:
    """The part of a registration that changes with the hardware: GPUs and links."""
    return (body["gpus"], body["links"])
