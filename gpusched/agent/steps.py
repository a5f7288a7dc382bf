"""The agent's side of job steps: each node's part of a step runs under a step
supervisor (gpusched.agent.stepsupervisor) in ``state_dir/steps/<job>/step-<step>/``;
StepRunner writes its spec (gpusched.agent.stepspec), starts it through the
supervisor spawner, cancels or signals it, moves its deadline when the job's time
limit changes, finds how it ended and ends every step of a job that has ended.

Steps live apart from the batch runs of ``jobs_dir``: a node may run steps of a job
whose batch script runs elsewhere, and a batch run's directory is removed once its
end is reported, while its steps may still be reporting theirs.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpusched.agent import procs
from gpusched.agent.spawn import (
    LOCK_FD_IN_SUPERVISOR,
    STEP_SUPERVISOR,
    SupervisorSpawner,
    spawn_supervisor_process,
)
from gpusched.agent.stepsupervisor import (
    DEADLINE_FILE,
    DEADLINE_REQUEST,
    SIGNAL_FILE,
    SIGNAL_REQUEST,
    write_json_replace,
)
from gpusched.messages import error_text
from gpusched.messages.steps import StepEnd, StepLaunch

log = logging.getLogger(__name__)
STEP_PREFIX = "step-"
STEP_LOST = "step supervisor lost"


# ------------------------------------------------------------------ running steps


@dataclass(frozen=True)
class StepDone:
    """How one node's part of a step ended, ready to report."""

    job_id: int
    step_id: int
    end: StepEnd


class StepRunner:
    """Starts step supervisors, cancels and signals them, and reports their ends."""

    def __init__(self, steps_dir: Path, node: str, python: str = sys.executable,
                 spawner: bool = True) -> None:
        self.steps_dir = Path(steps_dir)
        self.node = node
        self.python = python
        self.steps_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._pidfds: dict[tuple[int, int], int] = {}
        self._spawner = SupervisorSpawner(python, self.steps_dir / "spawner.log") \
            if spawner else None

    def warm(self) -> None:
        """Start the supervisor spawner ahead of the first step (it starts in tens of
        milliseconds, a step should not wait for that)."""
        if self._spawner is not None:
            try:
                self._spawner.warm()
            except OSError as exc:
                log.warning("cannot start the step supervisor spawner yet: %s", exc)

    def close(self) -> None:
        """Stop watching; the step supervisors keep running."""
        if self._spawner is not None:
            self._spawner.close()
        with self._lock:
            for pidfd in self._pidfds.values():
                os.close(pidfd)
            self._pidfds.clear()

    def stepdir(self, job_id: int, step_id: int) -> Path:
        return self.steps_dir / str(int(job_id)) / f"{STEP_PREFIX}{int(step_id)}"

    def start(self, launch: StepLaunch, spec: dict[str, Any]) -> bool:
        """Start the step supervisor of ``spec``; False if this step was started here
        before (a repeated command)."""
        stepdir = self.stepdir(launch.job_id, launch.step_id)
        stepdir.parent.mkdir(mode=0o700, exist_ok=True)
        try:
            stepdir.mkdir(mode=0o700)  # atomic: of two starts of one step, one wins
        except FileExistsError:
            return False
        try:
            write_json_replace(str(stepdir / "spec.json"), spec)
            pid = self._spawn(stepdir)
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            _write_status(stepdir, "launch_failed", f"cannot start the step supervisor: {exc}")
            return True
        with self._lock:
            self._pidfds[(launch.job_id, launch.step_id)] = pidfd
        return True

    def _spawn(self, stepdir: Path) -> int:
        lock_fd = os.open(stepdir / "supervisor.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                          0o600)
        try:
            import fcntl

            fcntl.flock(lock_fd, fcntl.LOCK_EX)  # a fresh file: this never blocks
            if self._spawner is not None:
                try:
                    return self._spawner.spawn(stepdir, lock_fd)
                except OSError as exc:
                    log.warning("supervisor spawner failed (%s); starting a fresh "
                                "interpreter", exc)
            return spawn_supervisor_process(
                self.python, [str(stepdir), "--lock-fd", str(LOCK_FD_IN_SUPERVISOR)],
                stepdir / "supervisor.log", lock_fd, program=STEP_SUPERVISOR)
        finally:
            os.close(lock_fd)

    def cancel(self, job_id: int, step_id: int, signum: int | None = None) -> bool:
        """End the step here (``signum`` None: SIGTERM, then the kill grace), or just
        deliver ``signum`` to its tasks; False if it does not run here."""
        stepdir = self.stepdir(job_id, step_id)
        with self._lock:
            pidfd = self._pidfds.get((job_id, step_id))
            if pidfd is None or procs.pidfd_exited(pidfd) or (stepdir / "status.json").exists():
                return False
            try:
                if signum is None:
                    signal.pidfd_send_signal(pidfd, signal.SIGTERM)
                else:
                    write_json_replace(str(stepdir / SIGNAL_FILE), {"signal": int(signum)})
                    if not (stepdir / "supervisor.json").exists():
                        return False  # not yet listening for it
                    signal.pidfd_send_signal(pidfd, SIGNAL_REQUEST)
            except ProcessLookupError:
                return False
            return True

    def set_deadline(self, job_id: int, run: int, deadline: float | None) -> list[int]:
        """Give the running steps of run ``run`` of the job here a new deadline (epoch
        seconds; None: none), which their supervisors reread from ``deadline.json`` on
        SIGUSR2; the ids of the steps told."""
        told = []
        for step_id in self._step_ids(job_id):
            stepdir = self.stepdir(job_id, step_id)
            spec = _read_json(stepdir / "spec.json") or {}
            if spec.get("run") != run:
                continue
            with self._lock:
                pidfd = self._pidfds.get((job_id, step_id))
                if pidfd is None or procs.pidfd_exited(pidfd) \
                        or (stepdir / "status.json").exists():
                    continue
                # A supervisor that has not written supervisor.json yet reads the file
                # before it starts watching the time (and only then handles the signal).
                write_json_replace(str(stepdir / DEADLINE_FILE), {"deadline": deadline})
                if (stepdir / "supervisor.json").exists():
                    try:
                        signal.pidfd_send_signal(pidfd, DEADLINE_REQUEST)
                    except ProcessLookupError:
                        continue
                told.append(step_id)
        return told

    def end_job(self, job_id: int, run: int | None = None) -> list[int]:
        """End every step of the job here (of runs up to ``run``; None: all); the ids of
        those told to end."""
        ended = []
        for step_id in self._step_ids(job_id):
            spec = _read_json(self.stepdir(job_id, step_id) / "spec.json") or {}
            step_run = spec.get("run")
            if run is not None and isinstance(step_run, int) and step_run > run:
                continue
            if self.cancel(job_id, step_id):
                ended.append(step_id)
        return ended

    def running(self) -> list[tuple[int, int]]:
        """(job id, step id) of the steps whose supervisor is alive here."""
        with self._lock:
            return sorted(k for k, fd in self._pidfds.items() if not procs.pidfd_exited(fd))

    def adopt(self) -> list[tuple[int, int]]:
        """Watch the live step supervisors found on disk (after an agent restart);
        those whose supervisor died without a status get one."""
        found = []
        for job_id, step_id in self._all_steps():
            stepdir = self.stepdir(job_id, step_id)
            if (stepdir / "status.json").exists() or (job_id, step_id) in self._pidfds:
                continue
            pidfd = self._find_supervisor(stepdir)
            if pidfd is None:
                self._record_lost(stepdir)
                continue
            with self._lock:
                self._pidfds[(job_id, step_id)] = pidfd
            found.append((job_id, step_id))
        return found

    def _find_supervisor(self, stepdir: Path) -> int | None:
        if not procs.lock_is_held(stepdir / "supervisor.lock"):
            return None
        info = _read_json(stepdir / "supervisor.json")
        if info is not None:
            return procs.open_pidfd(int(info["supervisor_pid"]),
                                    int(info["supervisor_starttime"]))
        return procs.open_lock_holder(stepdir / "supervisor.lock")

    def _record_lost(self, stepdir: Path) -> None:
        """A supervisor died without writing its status: kill what it left, record it."""
        info = _read_json(stepdir / "supervisor.json") or {}
        spec = _read_json(stepdir / "spec.json") or {}
        cgroup = spec.get("cgroup")
        if isinstance(cgroup, dict):
            from gpusched.agent.cgroups import CgroupTree, JobCgroup

            try:
                job = JobCgroup.existing(CgroupTree.from_json(cgroup["tree"]),
                                         str(cgroup["name"]))
                job.kill()
                job.remove()
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("%s: cannot remove its cgroup: %s", stepdir, exc)
        if info and "uid" in spec:
            pids, starts = info.get("task_pids") or [], info.get("task_starttimes") or []
            for pid, started in zip(pids, starts, strict=False):
                procs.kill_process_group(int(pid), None if started is None else int(started),
                                         int(spec["uid"]), int(info["supervisor_starttime"]))
        if not (stepdir / "status.json").exists():
            log.warning("%s: %s", stepdir, STEP_LOST)
            _write_status(stepdir, "failed", STEP_LOST)

    def wait_ended(self, timeout: float) -> list[StepDone]:
        """Wait up to ``timeout`` for a step supervisor to end; the ended, unreported
        steps."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                exited = [(k, fd) for k, fd in self._pidfds.items() if procs.pidfd_exited(fd)]
                for key, pidfd in exited:
                    del self._pidfds[key]
            for key, pidfd in exited:
                procs.reap_pidfd(pidfd)
                os.close(pidfd)
                stepdir = self.stepdir(*key)
                if stepdir.is_dir() and not (stepdir / "status.json").exists():
                    self._record_lost(stepdir)
            done = self.unreported()
            if done or time.monotonic() >= deadline:
                return done
            # Woken as soon as a supervisor watched now ends (its pidfd turns readable);
            # one started meanwhile is watched from the next round, 50 ms at most.
            with self._lock:
                watched = list(self._pidfds.values())
            try:
                select.select(watched, [], [], min(0.05, max(0.0, deadline - time.monotonic())))
            except (OSError, ValueError):  # a pidfd closed meanwhile (close())
                time.sleep(0.01)

    def unreported(self) -> list[StepDone]:
        """The steps with a status not yet reported."""
        done = []
        for job_id, step_id in self._all_steps():
            stepdir = self.stepdir(job_id, step_id)
            status = _read_json(stepdir / "status.json")
            spec = _read_json(stepdir / "spec.json") or {}
            if status is not None and not (stepdir / "reported").exists():
                done.append(StepDone(job_id, step_id, _step_end(self.node, status, spec)))
        return done

    def mark_reported(self, job_id: int, step_id: int) -> None:
        """The controller has the step's end: forget it."""
        stepdir = self.stepdir(job_id, step_id)
        if not (stepdir / "status.json").exists():
            return
        (stepdir / "reported").touch()
        shutil.rmtree(stepdir, ignore_errors=True)
        try:
            stepdir.parent.rmdir()  # the job's last step here
        except OSError:
            pass

    def _step_ids(self, job_id: int) -> list[int]:
        try:
            names = os.listdir(self.steps_dir / str(int(job_id)))
        except OSError:
            return []
        return sorted(int(n[len(STEP_PREFIX):]) for n in names
                      if n.startswith(STEP_PREFIX) and n[len(STEP_PREFIX):].isdigit())

    def _all_steps(self) -> Iterable[tuple[int, int]]:
        for entry in sorted(os.listdir(self.steps_dir)):
            if entry.isdigit():
                for step_id in self._step_ids(int(entry)):
                    yield int(entry), step_id


def _step_end(node: str, status: Mapping[str, Any], spec: Mapping[str, Any]) -> StepEnd:
    """The StepEnd of a status.json, its values bounded as the controller takes them."""
    outcome = str(status.get("outcome"))
    tasks = []
    for item in status.get("tasks") or []:
        if isinstance(item, list) and len(item) == 3:
            tasks.append((int(item[0]), _small(item[1], 255), _small(item[2], 128)))
    run = spec.get("run")
    return StepEnd(
        node=node, outcome=outcome if outcome in _OUTCOMES else "failed",
        run=run if isinstance(run, int) and not isinstance(run, bool) and run >= 0 else 0,
        exit_code=_small(status.get("exit_code"), 255),
        signal=_small(status.get("signal"), 128, low=1),
        end_time=_float(status.get("end_time")), error=error_text(status.get("error")),
        max_rss_bytes=_small(status.get("max_rss_bytes"), (1 << 63) - 1),
        cpu_usec=_small(status.get("cpu_usec"), (1 << 63) - 1), tasks=tuple(tasks))


_OUTCOMES = ("completed", "failed", "launch_failed", "cancelled", "timeout", "out_of_memory")


def _small(value: object, high: int, low: int = 0) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return value
    return None


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def _write_status(stepdir: Path, outcome: str, error: str) -> None:
    now = time.time()
    write_json_replace(str(stepdir / "status.json"), {
        "outcome": outcome, "exit_code": None, "signal": None, "start_time": None,
        "end_time": now, "error": error})


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# ------------------------------------------------------------------ the node's address


def node_address(configured: str | None, controllers: Iterable[Any]) -> str:
    """Where other nodes reach this one: ``[agent] address``, else the local address
    of a TCP connection to the first controller that answers, else 127.0.0.1 (an agent
    on the controller's local socket)."""
    if configured:
        return configured
    for endpoint in controllers:
        try:
            with socket.create_connection((endpoint.host, endpoint.port), timeout=2.0) as s:
                return str(s.getsockname()[0])
        except OSError:
            continue
    return "127.0.0.1"


__all__ = ["StepDone", "StepRunner", "node_address"]
