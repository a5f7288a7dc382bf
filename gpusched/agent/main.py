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
from gpusched.agent.confine import (
    LaunchRefused,
    job_cgroup_spec,
    open_confinement,
    release,
)
from gpusched.agent.health import Fault, HealthMonitor
from gpusched.agent.healthcheck import HealthCheck
from gpusched.agent.inventory import node_inventory
from gpusched.agent.launcher import JobEnd, Launcher, build_spec
from gpusched.agent.nvml import NvmlUnavailable
from gpusched.agent.stepagent import NodeSteps
from gpusched.agent.steps import node_address
from gpusched.client import ApiClient
from gpusched.client.settings import controllers_from, node_credentials
from gpusched.config import Config
from gpusched.core.bounds import MAX_COMMANDS_ACKED, MAX_ENDS_REPORTED
from gpusched.errors import (
    ConfigError,
    GpuschedError,
    NotFound,
    Unavailable,
    UsageError,
)
from gpusched.messages import JobEnd as EndReport
from gpusched.messages import (
    LaunchOrder,
    LimitJob,
    NodeCommand,
    NodeHealth,
    SignalJob,
    error_text,
    launch_job_of,
)
from gpusched.messages.steps import StepCancel, StepLaunch

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
        self.node_timeout = config.controller.node_timeout  # the controllers' (same file)
        self.socket_path = socket_path
        # Before anything is spawned: under cgroup v2 the agent moves into a leaf.
        self.confinement = open_confinement(self.config)
        self._gpus: dict[str, dict[str, Any]] = {}  # the registered GPUs, by UUID
        self.launcher = Launcher(self.config.state_dir / "jobs")
        self.steps = NodeSteps(self.config, self.confinement, self.config.state_dir / "jobs")
        self._address: str | None = None  # where other nodes reach this one (steps)
        # (job id, run) of runs whose end the controller acknowledged. A launch claimed
        # just before that could still come; the run's directory is gone, so only this
        # stops a rerun. A requeued job comes back under the same id as its next run.
        self._reported: deque[tuple[int, int]] = deque(maxlen=REMEMBER_REPORTED)
        # Commands done whose acknowledgement may have been lost: done again as nothing.
        self._done: deque[int] = deque(maxlen=REMEMBER_REPORTED)
        # Launches waiting for an earlier run of the same job to end here first.
        self._deferred: dict[tuple[int, int], NodeCommand] = {}
        self._extra_ends: list[JobEnd] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
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
                "address": self._address}

    def run(self) -> None:
        """Adopt surviving jobs, register, then serve launches and cancels until stopped."""
        adopted = self.launcher.adopt()
        if adopted:
            log.info("re-adopted running jobs %s", adopted)
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        reporter = threading.Thread(target=self._report_loop, name="reporter", daemon=True)
        reporter.start()
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
        release(self.confinement)

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
                        self._health_check_result()  # run once before the node takes work
                        self._register(client)  # with that result: never UP in between
                        registered, backoff = True, 0.05
                    work = self._poll(client)
                    if work is None:
                        registered = False  # see _poll: learn what to kill first
                        continue
                    self._handle(client, work)
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
            for job_id, run in _runs_to_kill(answer.get("kill")):
                self._kill_run(job_id, run)
        log.info("registered node %s with %d GPUs and slices (%s)", self.node,
                 len(body["gpus"]), body["source"])

    def _kill_run(self, job_id: int, run: int) -> None:
        """Stop a run the controller has ended, if this node still runs that very run;
        its supervisor ends it and the end report, for a run long over, is ignored.
        The job's steps here end with it."""
        self.steps.end_job(job_id, run)
        if self.launcher.run_of(job_id) == run and self.launcher.cancel(job_id):
            log.warning("job %d: killing run %d, which the controller has ended", job_id, run)

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
        wait = min(self.config.poll_wait, 1.0) if self._deferred else self.config.poll_wait
        query = {"node": self.node, "wait": wait}
        asked = time.monotonic()
        work = client.request("GET", f"/agent/v1/work?{urlencode(query)}", timeout=wait + 15)
        took = time.monotonic() - asked
        if took > trusted_for(wait, self.node_timeout):
            log.warning("a work answer took %.1f s: registering again before acting on it",
                        took)
            return None
        if stages.on():
            stages.stamp("received", [c["job_id"] for c in work.get("commands", ())
                                      if isinstance(c, dict) and c.get("kind") == "launch"
                                      and isinstance(c.get("job_id"), int)])
        return work

    def _handle(self, client: ApiClient, work: dict[str, Any]) -> None:
        """Do each command of a work answer in order, then the deferred launches whose
        way is now clear; then acknowledge all that were done in one request (a launch
        does not wait for the acknowledgement of the one before it)."""
        done: list[int] = []
        for raw in work.get("commands", []):
            try:
                command = NodeCommand.parse(raw)
            except UsageError as exc:
                seq = self._refuse(raw, exc)
                if seq is not None:
                    done.append(seq)
                continue
            if self._do(client, command):
                done.append(command.seq)
        for key, command in list(self._deferred.items()):
            if self._launch(client, command):
                del self._deferred[key]
                done.append(command.seq)
        self._ack(client, done)

    def _refuse(self, raw: object, exc: UsageError) -> int | None:
        """Log a command that does not parse (a launch fails its job); the number to
        acknowledge it by, so that it does not come back, if it has one."""
        log.warning("refused a malformed command: %s: %.200r", exc.message, raw)
        envelope = raw if isinstance(raw, dict) else {}
        seq, named = envelope.get("seq"), launch_job_of(envelope.get("payload"))
        if envelope.get("kind") == "launch" and named is not None:
            self._queue_end(JobEnd(named[0], "launch_failed", None, None, None, time.time(),
                                   f"the agent on {self.node} refused the launch order: "
                                   f"{exc.message}", named[1]))
        return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0 else None

    def _do(self, client: ApiClient, command: NodeCommand) -> bool:
        """Act on one command; False while a launch must wait (not acknowledged)."""
        if command.seq in self._done:
            return True  # done before; only its acknowledgement was lost
        job_id, run = command.job_id, command.run
        ours = self.launcher.run_of(job_id) == run
        if command.kind == "launch":
            if not self._launch(client, command):
                self._deferred[(job_id, run)] = command
                return False
        elif command.kind in ("cancel", "kill"):
            if command.kind == "kill":
                self._kill_run(job_id, run)
            elif ours:
                self.launcher.cancel(job_id)
            elif self._deferred.pop((job_id, run), None) is not None or (
                    self.launcher.run_of(job_id) is None and (job_id, run) not in self._reported):
                # Cancelled before it was ever launched here: report that directly.
                self._queue_end(JobEnd(job_id, "cancelled", None, None, None, time.time(),
                                       None, run))
        elif command.kind == "step" and isinstance(command.payload, StepLaunch):
            self.steps.launch(command.payload, self._gpus, self.launcher.held_cpus())
        elif command.kind == "step_cancel" and isinstance(command.payload, StepCancel):
            self.steps.cancel(job_id, command.payload.step_id, command.payload.signal)
        elif command.kind == "signal" and isinstance(command.payload, SignalJob):
            sent = ours and self.launcher.signal(job_id, command.payload.signal)
            log.info("signal %d to job %d: %s", command.payload.signal, job_id,
                     "sent" if sent else "job not running here")
        elif command.kind == "limit" and isinstance(command.payload, LimitJob):
            if ours and self.launcher.set_limit(job_id, command.payload.time_limit):
                log.info("job %d: time limit now %s s", job_id, command.payload.time_limit)
            self.steps.new_limit(job_id, run, command.payload)  # batch run here or not
        return True

    def _ack(self, client: ApiClient, seqs: list[int]) -> None:
        """Tell the controller these commands are done, as few requests as the bound allows."""
        for first in range(0, len(seqs), MAX_COMMANDS_ACKED):
            batch = seqs[first:first + MAX_COMMANDS_ACKED]
            client.request("POST", "/agent/v1/commands/done", {"node": self.node,
                                                               "seqs": batch})
            self._done.extend(batch)

    def _launch(self, client: ApiClient, command: NodeCommand) -> bool:
        """Launch one run; an order this node cannot run fails its job (LaunchFailed,
        with the reason). False while an earlier run of the job is still alive here."""
        job_id, run = command.job_id, command.run
        if (job_id, run) in self._reported:
            return True
        held = self.launcher.run_of(job_id)
        if held is not None and held != run:
            if self.launcher.is_running(job_id):
                return False  # killed, but not gone yet
            # Ended: the controller has ended that run too, or it would not launch this one.
            self.launcher.mark_reported(job_id)
        order = command.payload
        assert isinstance(order, LaunchOrder)
        try:
            refusal = self._refusal(order)
            if refusal is None:
                cgroup = job_cgroup_spec(self.confinement, order, self._gpus,
                                         self.launcher.held_cpus())
                spec = build_spec(order, self.config.kill_grace, self.node,
                                  self.config.min_job_uid, cgroup, vars(self.config))
                if self.launcher.launch(job_id, spec, order.script):
                    stages.stamp("spawned", (job_id,))
                    log.info("launched job %d (run %d) for %s", job_id, run, order.user)
        except LaunchRefused as exc:
            refusal = f"the agent on {self.node} cannot confine the job: {exc.message}"
        except Exception as exc:  # noqa: BLE001 - whatever a job holds, it fails that job
            log.warning("job %s: launch failed: %r", job_id, exc)
            refusal = f"the agent on {self.node} could not launch the job: {exc!r}"
        if refusal is not None:
            self._queue_end(JobEnd(job_id, "launch_failed", None, None, None, time.time(),
                                   refusal, run))
        return True

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
                for end in ended:  # the batch run is over: so are the job's steps here
                    self.steps.end_job(end.job_id, end.run)
                with self._lock:
                    synthetic, self._extra_ends = self._extra_ends, []
                for end in ended if stages.on() else ():
                    stages.stamp("end_seen", (end.job_id,), started=end.start_time,
                                 ended=end.end_time)
                try:
                    self._report(client, ended, synthetic=False)
                    while synthetic:
                        batch = synthetic[:MAX_ENDS_REPORTED]
                        self._report(client, batch, synthetic=True)
                        del synthetic[:len(batch)]
                    backoff = 0.05
                except GpuschedError as exc:
                    log.warning("cannot report job ends yet: %s", exc)
                    with self._lock:
                        self._extra_ends[:0] = synthetic  # kept only in memory: retry them
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF)

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
