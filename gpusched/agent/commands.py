"""The node commands an agent claims from the controller: launch, cancel, kill, signal,
limit, suspend, steps, a MIG layout for an idle GPU. Done in order, launches deferred while an earlier run of the same job is
still alive here, and acknowledged in batches: by the next work poll, where the
controller takes them there (it says so when the node registers), else by a request of
their own."""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from gpusched import stages
from gpusched.agent.confine import Confinement, LaunchRefused, job_cgroup_spec
from gpusched.agent.containers import ContainerError
from gpusched.agent.jobends import NOT_PREPARED, JobEnd, node_fault
from gpusched.agent.launcher import Launcher, build_spec
from gpusched.agent.migconfig import apply_command, held_gpus
from gpusched.agent.settings import AgentConfig
from gpusched.agent.stepagent import NodeSteps
from gpusched.agent.suspend import Suspender
from gpusched.client import ApiClient
from gpusched.core.bounds import MAX_ACKS_IN_POLL, MAX_COMMANDS_ACKED
from gpusched.errors import UsageError
from gpusched.messages import (
    LaunchOrder,
    LimitJob,
    NodeCommand,
    SignalJob,
    launch_job_of,
)
from gpusched.messages.agent import JobNotice
from gpusched.messages.jobcontrol import SuspendJob
from gpusched.messages.mig import MIG_KIND, MigCommand
from gpusched.messages.steps import StepCancel, StepLaunch

log = logging.getLogger(__name__)
REMEMBER_DONE = 10_000
DISK_WAIT = 60.0  # seconds a launch waits for room on the node's state disk


class NodeCommands:
    """Does the commands of work answers for one node's agent."""

    def __init__(self, config: AgentConfig, confinement: Confinement, launcher: Launcher,
                 steps: NodeSteps, reported: deque[tuple[int, int]],
                 gpus: Callable[[], dict[str, dict[str, Any]]],
                 queue_end: Callable[[JobEnd], None],
                 register: Callable[[ApiClient], None] | None = None,
                 cluster_name: str | None = None) -> None:
        self.config = config
        self.node = config.node_name
        self.cluster_name = cluster_name  # the configuration's, for SLURM_CLUSTER_NAME
        self.confinement = confinement
        self.launcher = launcher
        self.steps = steps
        # (job id, run) of runs whose end the controller acknowledged (shared with the
        # end reports): a launch claimed just before that must not rerun the run.
        self._reported = reported
        self._gpus = gpus  # the registered GPUs, by UUID
        self._queue_end = queue_end
        # Registers the node's inventory again (after a MIG layout change).
        self._register = register
        # Commands done whose acknowledgement may have been lost: done again as nothing.
        self._done: deque[int] = deque(maxlen=REMEMBER_DONE)
        # Whether the controller takes acknowledgements in a work poll (``done``), as it
        # said when the node last registered; and those the next poll is to carry.
        self.acks_in_poll = False
        self._unacked: list[int] = []
        # Launches waiting for an earlier run of the same job to end here first.
        self._deferred: dict[tuple[int, int], NodeCommand] = {}
        self._disk_waits: dict[tuple[int, int], float] = {}  # (job, run) -> first refusal
        self.suspender = Suspender(launcher, steps)  # gcontrol suspend and resume

    @property
    def waiting(self) -> bool:
        """Whether a launch waits for an earlier run of its job to end here."""
        return bool(self._deferred)

    def kill_run(self, job_id: int, run: int) -> None:
        """Stop a run the controller has ended, if this node still runs that very run;
        its supervisor ends it and the end report, for a run long over, is ignored.
        The job's steps here end with it."""
        self.steps.end_job(job_id, run)
        if self.launcher.run_of(job_id) == run and self.launcher.cancel(job_id):
            log.warning("job %d: killing run %d, which the controller has ended", job_id, run)

    def handle(self, client: ApiClient, work: dict[str, Any]) -> None:
        """Do each command of a work answer in order, then the deferred launches whose
        way is now clear; then acknowledge all that were done in one request (a launch
        does not wait for the acknowledgement of the one before it)."""
        done: list[int] = []
        for raw in work.get("commands", []):
            if isinstance(raw, dict) and raw.get("kind") == MIG_KIND:
                seq = self._mig(client, raw)
                if seq is not None:
                    done.append(seq)
                continue
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
        if not self.acks_in_poll:
            self._ack(client, done)
            return
        self._unacked.extend(done)
        over = len(self._unacked) - MAX_ACKS_IN_POLL
        if over > 0:  # more than one poll carries: the oldest go now
            self._ack(client, self._unacked[:over])
            del self._unacked[:over]

    def acks_for_poll(self, client: ApiClient) -> list[int]:
        """The acknowledgements the next work poll carries (call ``acked`` with them once
        it is answered). Any held while the controller no longer takes them in a poll
        are sent now, by a request of their own."""
        if self._unacked and not self.acks_in_poll:
            self.flush_acks(client)
        return self._unacked[:MAX_ACKS_IN_POLL]

    def acked(self, seqs: list[int]) -> None:
        """A work poll that carried ``seqs`` (acks_for_poll's) was answered."""
        if seqs and self._unacked[:len(seqs)] == seqs:
            del self._unacked[:len(seqs)]
            self._done.extend(seqs)

    def flush_acks(self, client: ApiClient, timeout: float | None = None) -> None:
        """Send every acknowledgement still held, by a request of its own (the agent
        stops polling, or the controller no longer takes them in a poll)."""
        held = list(self._unacked)
        self._ack(client, held, timeout)
        del self._unacked[:len(held)]

    def _mig(self, client: ApiClient, raw: dict[str, Any]) -> int | None:
        """Give one GPU the MIG layout a ``mig`` command asks for (gpusched.agent.migconfig),
        and register the node's GPUs again when its slices changed; the number to
        acknowledge the command by."""
        if raw.get("seq") in self._done:
            return int(raw["seq"])
        try:
            command = MigCommand.parse(raw)
        except UsageError as exc:
            return self._refuse(raw, exc)
        if apply_command(command, self.config, held_gpus(self.launcher)) \
                and self._register is not None:
            self._register(client)
        return command.seq

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
            self.suspender.release(job_id)  # a frozen job must see its SIGTERM
            if command.kind == "kill":
                self.kill_run(job_id, run)
            elif ours:
                self.launcher.cancel(job_id)
            elif self._deferred.pop((job_id, run), None) is not None or (
                    self.launcher.run_of(job_id) is None and (job_id, run) not in self._reported):
                # Cancelled before it was ever launched here: report that directly.
                self._queue_end(JobEnd(job_id, "cancelled", None, None, None, time.time(),
                                       None, run))
        elif command.kind == "step" and isinstance(command.payload, StepLaunch):
            self.steps.launch(command.payload, self._gpus(), self.launcher.held_cpus())
        elif command.kind == "step_cancel" and isinstance(command.payload, StepCancel):
            self.steps.cancel(job_id, command.payload.step_id, command.payload.signal)
        elif command.kind == "signal" and isinstance(command.payload, SignalJob):
            sent = ours and self.launcher.signal(job_id, command.payload.signal)
            log.info("signal %d to job %d: %s", command.payload.signal, job_id,
                     "sent" if sent else "job not running here")
        elif command.kind == "notice" and isinstance(command.payload, JobNotice):
            if not (ours and self.launcher.notice(job_id, command.seq, command.payload.text)):
                log.info("job %d: notice not written: job not running here", job_id)
        elif command.kind == "suspend" and isinstance(command.payload, SuspendJob):
            self.suspender.apply(job_id, run, command.payload)
        elif command.kind == "limit" and isinstance(command.payload, LimitJob):
            if ours and self.launcher.set_limit(job_id, command.payload.time_limit):
                log.info("job %d: time limit now %s s", job_id, command.payload.time_limit)
            self.steps.new_limit(job_id, run, command.payload)  # batch run here or not
        return True

    def _ack(self, client: ApiClient, seqs: list[int], timeout: float | None = None) -> None:
        """Tell the controller these commands are done, as few requests as the bound allows."""
        for first in range(0, len(seqs), MAX_COMMANDS_ACKED):
            batch = seqs[first:first + MAX_COMMANDS_ACKED]
            client.request("POST", "/agent/v1/commands/done", {"node": self.node,
                                                               "seqs": batch}, timeout)
            self._done.extend(batch)

    def _launch(self, client: ApiClient, command: NodeCommand) -> bool:
        """Launch one run; an order this node cannot run fails its job (LaunchFailed,
        with the reason). False while an earlier run of the job is still alive here."""
        job_id, run = command.job_id, command.run
        if (job_id, run) in self._reported:
            return True
        if self.launcher.run_of(job_id) != run and not self.launcher.clear_stale(job_id):
            return False  # an earlier run, killed but not gone yet
        # What an earlier run left (ended: the controller has ended that run too, or it
        # would not launch this one, recorded or not) is gone.
        order = command.payload
        assert isinstance(order, LaunchOrder)
        try:
            refusal = self._refusal(order)
            if refusal is None:
                cgroup = job_cgroup_spec(self.confinement, order, self._gpus(),
                                         self.launcher.held_cpus())
                spec = build_spec(order, self.config.kill_grace, self.node,
                                  self.config.min_job_uid, cgroup,
                                  {**vars(self.config), "cluster_name": self.cluster_name},
                                  self._gpus())
                if self.launcher.launch(job_id, spec, order.script):
                    stages.stamp("spawned", (job_id,))
                    log.info("launched job %d (run %d) for %s", job_id, run, order.user)
        except LaunchRefused as exc:
            refusal = f"the agent on {self.node} cannot confine the job: {exc.message}"
        except ContainerError as exc:
            refusal = f"the agent on {self.node} cannot run the job's container: {exc}"
        except Exception as exc:  # noqa: BLE001 - whatever a job holds, it fails that job
            log.warning("job %s: launch failed: %r", job_id, exc)
            refusal = f"the agent on {self.node} could not launch the job: {exc!r}"
            if node_fault(exc):
                # The node's disk, not the job: the launch waits (not acknowledged, so an
                # agent restart gets it again) and is tried at every round until the disk
                # has room; past DISK_WAIT the run goes back to the queue, never started.
                first = self._disk_waits.setdefault((job_id, run), time.monotonic())
                if time.monotonic() - first < DISK_WAIT:
                    return False
                del self._disk_waits[(job_id, run)]
                self._queue_end(JobEnd(job_id, "not_started", None, None, None, time.time(),
                                       f"{NOT_PREPARED} on {self.node}: {exc}", run))
                return True
        self._disk_waits.pop((job_id, run), None)
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
