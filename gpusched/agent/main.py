"""``gpusched agent``: registers the node, claims launches and cancels, reports job ends."""

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

from gpusched.agent.health import Fault, HealthMonitor
from gpusched.agent.inventory import node_inventory
from gpusched.agent.launcher import JobEnd, Launcher, build_spec
from gpusched.agent.nvml import NvmlUnavailable
from gpusched.client import ApiClient
from gpusched.config import Config
from gpusched.errors import (
    ConfigError,
    GpuschedError,
    NotFound,
    Unavailable,
    UsageError,
)
from gpusched.messages import JobEnd as EndReport
from gpusched.messages import LaunchOrder, error_text, launch_job_of

log = logging.getLogger(__name__)
MAX_BACKOFF = 2.0
REMEMBER_REPORTED = 10_000


class _Stopping(Exception):
    """Raised in the main thread by SIGTERM/SIGINT to leave a blocking poll at once."""


class Agent:
    """One node's agent. Jobs run under supervisors that outlive it."""

    def __init__(self, config: Config, socket_path: Path) -> None:
        self.config = config.agent
        self.node = config.agent.node_name
        self.socket_path = socket_path
        self.launcher = Launcher(self.config.state_dir / "jobs")
        self.signalled: set[int] = set()
        # Ends the controller acknowledged. A poll answered just before that could still
        # carry the job as a launch; its directory is gone, so only this stops a rerun.
        # (job id, restarts) of runs whose end the controller acknowledged: a requeued job
        # comes back under the same id with one restart more.
        self._reported: deque[tuple[int, int]] = deque(maxlen=REMEMBER_REPORTED)
        self._runs: dict[int, int] = {}  # job id -> restarts of the run launched here
        self._extra_ends: list[JobEnd] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._register_lock = threading.Lock()
        self._registered: object = None  # the GPUs and links last registered
        self._monitor: HealthMonitor | None = None
        self._delivered: dict[int, int] = {}  # job id -> the signal request last sent
        self._limits: dict[int, int] = {}  # job id -> the time-limit change last applied
        self.trusted_server_uids = trusted_server_uids(self.config.controller_user)

    def _client(self) -> ApiClient:
        """A connection to the controller that talks only to a trusted server: root,
        this agent's own uid, or the configured controller user."""
        return ApiClient(self.socket_path, trusted_server_uids=self.trusted_server_uids)

    def inventory(self) -> dict[str, Any]:
        """What this agent registers (gpusched.agent.inventory)."""
        return node_inventory(self.config)

    def run(self) -> None:
        """Adopt surviving jobs, register, then serve launches and cancels until stopped."""
        adopted = self.launcher.adopt()
        if adopted:
            log.info("re-adopted running jobs %s", adopted)
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        reporter = threading.Thread(target=self._report_loop, name="reporter", daemon=True)
        reporter.start()
        watcher = threading.Thread(target=self._inventory_loop, name="inventory", daemon=True)
        watcher.start()
        if self.config.gpu_source != "static":
            threading.Thread(target=self._health_loop, name="health", daemon=True).start()
        with self._client() as client:
            self._serve(client)

    def stop(self) -> None:
        """Ask the loops to finish."""
        self._stop.set()
        if self._monitor is not None:
            self._monitor.stop.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop the agent (never the jobs)."""
        def handler(signum: int, frame: FrameType | None) -> None:
            self.stop()
            raise _Stopping()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def _serve(self, client: ApiClient) -> None:
        registered, backoff = False, 0.05
        try:
            while not self._stop.is_set():
                try:
                    if not registered:
                        self._register(client)
                        registered, backoff = True, 0.05
                    self._handle(client, self._poll(client))
                except NotFound:
                    registered = False  # the controller forgot us (new database): register again
                except Unavailable as exc:
                    registered = False
                    log.warning("controller unavailable: %s", exc)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF)
        except _Stopping:
            pass
        log.info("agent stopped; running jobs continue under their supervisors")

    def _register(self, client: ApiClient, body: dict[str, Any] | None = None) -> None:
        with self._register_lock:
            body = body or self.inventory()
            client.request("POST", "/agent/v1/register", body)
            self._registered = _hardware(body)
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

            monitor = HealthMonitor(report, frozenset(self.config.ignore_xids),
                                    self.config.max_temperature, self.config.health_interval,
                                    sample)
            self._monitor = monitor
            try:
                monitor.run()
            except NvmlUnavailable as exc:
                log.info("no GPU health checks: %s", exc.message)

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

    def _poll(self, client: ApiClient) -> dict[str, Any]:
        query = {"node": self.node, "wait": self.config.poll_wait,
                 "signalled": ",".join(str(j) for j in sorted(self.signalled))}
        return client.request("GET", f"/agent/v1/work?{urlencode(query)}",
                              timeout=self.config.poll_wait + 15)

    def _handle(self, client: ApiClient, work: dict[str, Any]) -> None:
        for launch in work.get("launches", []):
            self._launch(client, launch)
        for request in work.get("signals", []):
            job_id, seq = request["job_id"], request["seq"]
            if self._delivered.get(job_id) != seq:
                sent = self.launcher.signal(job_id, request["signal"])
                log.info("signal %d to job %d: %s", request["signal"], job_id,
                         "sent" if sent else "job not running here")
                self._delivered[job_id] = seq
            client.request("POST", f"/agent/v1/jobs/{job_id}/signalled",
                           {"node": self.node, "seq": seq})
        for change in work.get("limits", []):
            job_id, seq = change["job_id"], change["seq"]
            if self._limits.get(job_id) != seq and self.launcher.set_limit(
                    job_id, change["time_limit"]):
                log.info("job %d: time limit now %s s", job_id, change["time_limit"])
                self._limits[job_id] = seq
        for job_id in work.get("cancels", []):
            if not self.launcher.cancel(job_id) and not self._known(job_id):
                # Cancelled before it was ever launched here: report that directly.
                self._queue_end(JobEnd(job_id, "cancelled", None, None, None, time.time(), None))
            self.signalled.add(job_id)

    def _known(self, job_id: int) -> bool:
        return (self.launcher.jobs_dir / str(job_id)).exists()

    def _launch(self, client: ApiClient, launch: object) -> None:
        """Launch one order of the work poll; an order this node cannot run, or one that
        does not parse, fails its job (LaunchFailed, with the reason)."""
        named = launch_job_of(launch)
        if named is None:
            log.warning("ignoring a launch order that names no job: %.200r", launch)
            return
        job_id, run = named
        if (job_id, run) in self._reported:
            return
        previous = self._runs.get(job_id)
        if previous is not None and previous < run:
            # Requeued, and back before the reporter thread tidied up its last run: the
            # controller recorded that run's end, or it would not have requeued the job.
            self.launcher.mark_reported(job_id)
        self._runs[job_id] = run
        try:
            order = LaunchOrder.parse(launch)
            refusal = self._refusal(order)
            if refusal is None:
                spec = build_spec(order, self.config.kill_grace, self.node,
                                  self.config.min_job_uid)
                if self.launcher.launch(job_id, spec, order.script):
                    log.info("launched job %d for %s", job_id, order.user)
        except UsageError as exc:
            log.warning("job %s: refused a malformed launch order: %s", job_id, exc.message)
            refusal = f"the agent on {self.node} refused the launch order: {exc.message}"
        except Exception as exc:  # noqa: BLE001 - whatever a job holds, it fails that job
            log.warning("job %s: launch failed: %r", job_id, exc)
            refusal = f"the agent on {self.node} could not launch the job: {exc!r}"
        if refusal is not None:
            self._queue_end(JobEnd(job_id, "launch_failed", None, None, None, time.time(),
                                   refusal))
            return
        client.request("POST", f"/agent/v1/jobs/{job_id}/launched", {"node": self.node})

    def _refusal(self, order: LaunchOrder) -> str | None:
        """Why this node will not run the job, or None."""
        uid = order.uid
        if uid < self.config.min_job_uid:
            return (f"the agent on {self.node} runs no job of uid {uid}: its min_job_uid "
                    f"is {self.config.min_job_uid}")
        if os.geteuid() != 0 and uid != os.geteuid():
            return (f"the agent on {self.node} runs as uid {os.geteuid()} and cannot run "
                    f"jobs of uid {uid}")
        return None

    def _queue_end(self, end: JobEnd) -> None:
        with self._lock:
            self._extra_ends.append(end)

    def _report_loop(self) -> None:
        backoff = 0.05
        with self._client() as client:
            while not self._stop.is_set():
                ended = self.launcher.wait_ended(timeout=0.5)  # unreported ends stay on disk
                with self._lock:
                    synthetic, self._extra_ends = self._extra_ends, []
                try:
                    for end in ended:
                        self._report(client, end, synthetic=False)
                    while synthetic:
                        self._report(client, synthetic[0], synthetic=True)
                        synthetic.pop(0)
                    backoff = 0.05
                except GpuschedError as exc:
                    log.warning("cannot report job ends yet: %s", exc)
                    with self._lock:
                        self._extra_ends[:0] = synthetic  # kept only in memory: retry them
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF)

    def _report(self, client: ApiClient, end: JobEnd, synthetic: bool) -> None:
        report = EndReport(node=self.node, outcome=end.outcome, exit_code=end.exit_code,
                           signal=end.signal, end_time=end.end_time,
                           error=error_text(end.error))
        client.request("POST", f"/agent/v1/jobs/{end.job_id}/ended", report.to_json())
        if not synthetic:
            self.launcher.mark_reported(end.job_id)
        self._reported.append((end.job_id, self._runs.pop(end.job_id, 0)))
        self._delivered.pop(end.job_id, None)
        self._limits.pop(end.job_id, None)
        self.signalled.discard(end.job_id)
        log.info("job %d ended: %s", end.job_id, end.outcome)


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


def _hardware(body: dict[str, Any]) -> object:
    """The part of a registration that changes with the hardware: GPUs and links."""
    return (body["gpus"], body["links"])
