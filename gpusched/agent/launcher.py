"""The agent side of running jobs: job directories, supervisors, and their ends.

Each job gets ``jobs_dir/<job_id>/`` holding its script, ``spec.json`` and what its
supervisor (``supervisor.py``, one process per job in a session of its own) writes.
The directory on disk is the truth, not this object: a restarted agent builds a new
Launcher, calls ``adopt()`` and carries on, the way slurmd finds its slurmstepds.

A supervisor holds ``supervisor.lock`` (flock) for its whole life, handed to it
already locked, so "the lock is held" means "a supervisor is alive", with no window
after the spawn and no trust in pids that may have been reused.
"""

from __future__ import annotations

import fcntl
import logging
import os
import selectors
import shutil
import signal
import sys
import threading
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from gpusched.agent import procs
from gpusched.agent.endpipe import EndPipe, read_ready
from gpusched.agent.jobcontrol import RunningJobs
from gpusched.agent.jobends import (
    JobEnd,
    discard,
    job_end,
    read_json,
    remove_discarded,
    spec_run,
    write_status,
)
from gpusched.agent.jobprep import prepare_job
from gpusched.agent.jobspec import build_spec, site_programs
from gpusched.agent.lostjobs import SupervisorNotFound, find_supervisor, record_lost
from gpusched.agent.mps import MpsDaemons
from gpusched.agent.sparedirs import SpareDirs
from gpusched.agent.spawn import (
    LOCK_FD_IN_SUPERVISOR,
    SupervisorSpawner,
    spawn_supervisor_process,
)
from gpusched.agent.specindex import SpecIndex

log = logging.getLogger(__name__)
__all__ = ["JobEnd", "Launcher", "build_spec", "site_programs", "spec_run"]

# How long the removal of a reported job's directory waits for its supervisor, which
# told its end before making status.json durable, to exit (else its exit removes it).
SUPERVISOR_EXIT_WAIT = 2.0
_TOLD = -1  # the selector's key of the end pipe (jobs are keyed by their id)


class Launcher(RunningJobs):
    """Starts job supervisors, cancels them, and reports how their jobs ended."""

    def __init__(self, jobs_dir: Path, python: str = sys.executable,
                 spawner: bool = True, site_programs: bool = False) -> None:
        self.jobs_dir = Path(jobs_dir)
        self.python = python
        if not self.jobs_dir.is_dir():
            self.jobs_dir.mkdir(parents=True, exist_ok=True)
            # Job users must pass through to exec their script, but not list other jobs.
            self.jobs_dir.chmod(0o711)
        self._lock = threading.Lock()  # guards _pidfds and _to_register
        # adopt() must not take a job dir that launch() is still filling for lost.
        self._launch_lock = threading.Lock()
        self._select_lock = threading.Lock()  # whoever holds it owns the selector
        self._pidfds: dict[int, int] = {}  # job id -> pidfd of its live supervisor
        self._specs = SpecIndex(self.jobs_dir)  # what run_of and held_cpus read
        self._spares = SpareDirs(self.jobs_dir)  # reported runs' directories, for new runs
        self._to_register: list[tuple[int, int]] = []
        # Jobs whose supervisor died and whose end could not be written yet (the state
        # disk full): tried again at each look for ended jobs.
        self._unrecorded: set[int] = set()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        # Supervisors tell their jobs' ends on it before exiting (gpusched.agent.endpipe):
        # jobs told, watched still, whose status.json is read; and those whose directory
        # their supervisor's exit removes (reported while it still made the status durable).
        self._ends = EndPipe()
        self._selector.register(self._ends.read_fd, selectors.EVENT_READ, _TOLD)
        self._told: set[int] = set()
        self._discard_on_exit: set[int] = set()
        # site_programs: the node runs a prolog or an epilog (see serve_spawner).
        self._spawner = (SupervisorSpawner(python, self.jobs_dir.parent / "spawner.log",
                                           site_programs) if spawner else None)
        self.mps = MpsDaemons(self.jobs_dir.parent / "mps")  # of the GPUs jobs share by MPS

    def warm(self) -> None:
        """Start the supervisor spawner now, so that the first launch need not wait for
        an interpreter to start."""
        if self._spawner is not None:
            self._spawner.warm()

    def close(self) -> None:
        """Stop watching; the supervisors (and their jobs) keep running."""
        if self._spawner is not None:
            self._spawner.close()
        with self._select_lock, self._lock:
            for pidfd in self._pidfds.values():
                os.close(pidfd)
            self._pidfds.clear()
            self._to_register.clear()
            self._selector.close()
            self._ends.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    # ------------------------------------------------------------ launching

    def launch(self, job_id: int, spec: dict[str, Any], script_text: str) -> bool:
        """Start the job's supervisor; False (and nothing done) if it was launched before."""
        with self._launch_lock:
            return self._launch(job_id, spec, script_text)

    def _launch(self, job_id: int, spec: dict[str, Any], script_text: str) -> bool:
        jobdir = self._jobdir(job_id)
        if not self._spares.take(jobdir):
            try:
                os.mkdir(jobdir, 0o711)  # atomic: of two launches of one job, one wins
            except FileExistsError:
                return False
            os.chmod(jobdir, 0o711)  # mkdir's mode went through the umask
        written = prepare_job(jobdir, job_id, spec, script_text, self.mps)
        if written is None:
            self._wake()
            return True
        self._specs.remember(job_id, written)
        try:
            pid = self._spawn_supervisor(jobdir)
        except OSError as exc:
            write_status(jobdir, "launch_failed", None,
                         f"cannot start the job supervisor: {exc}")
            self._wake()
            return True
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            # The supervisor ran the job and exited already (this agent was slow or
            # paused): its status.json stands (the end may be reported and the
            # directory gone already); without one it was lost.
            if jobdir.is_dir() and not (jobdir / "status.json").exists():
                self._record_lost_or_later(job_id)
            self._wake()
            return True
        self._watch(job_id, pidfd)
        return True

    def _spawn_supervisor(self, jobdir: Path) -> int:
        lock_fd = os.open(jobdir / "supervisor.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)  # a fresh file: this never blocks
            if self._spawner is not None:
                try:
                    return self._spawner.spawn(jobdir, lock_fd, self._ends.write_fd)
                except OSError as exc:
                    log.warning("supervisor spawner failed (%s); starting a fresh interpreter", exc)
            # Started with its signals blocked, as it runs: a cancel that comes
            # while Python is still starting stays pending instead of killing it.
            return spawn_supervisor_process(
                self.python, [str(jobdir), "--lock-fd", str(LOCK_FD_IN_SUPERVISOR)],
                jobdir / "supervisor.log", lock_fd)
        finally:
            os.close(lock_fd)

    def _watch(self, job_id: int, pidfd: int) -> None:
        with self._lock:
            self._pidfds[job_id] = pidfd
            self._to_register.append((job_id, pidfd))
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"!")
        except BlockingIOError:
            pass  # the pipe is full: a wake-up is pending already

    # ------------------------------------------------------------ control

    def cancel(self, job_id: int) -> bool:
        """Ask the job's supervisor to cancel it; False if it is unknown or ended."""
        with self._lock:
            pidfd = self._pidfds.get(job_id)
            if pidfd is None or (self._jobdir(job_id) / "status.json").exists():
                return False
            try:
                # Through the pidfd: the signal cannot reach a process that reused the pid.
                signal.pidfd_send_signal(pidfd, signal.SIGTERM)
            except ProcessLookupError:
                return False
            return True

    def running(self) -> list[int]:
        """Ids of the jobs whose supervisor is alive and has not told their end."""
        with self._lock:
            return sorted(job for job, pidfd in self._pidfds.items()
                          if job not in self._told and not procs.pidfd_exited(pidfd))

    def run_of(self, job_id: int) -> int | None:
        """Which run of the job its directory here holds (its restart count), or None
        when there is none."""
        return self._specs.run_of(job_id)

    def runs(self) -> list[tuple[int, int]]:
        """(job id, run) of each job whose supervisor is alive."""
        found = []
        for job_id in self.running():
            run = self.run_of(job_id)
            if run is not None:
                found.append((job_id, run))
        return found

    def is_running(self, job_id: int) -> bool:
        """Whether the job's supervisor is alive here."""
        with self._lock:
            pidfd = self._pidfds.get(job_id)
            return pidfd is not None and not procs.pidfd_exited(pidfd)

    def adopt(self) -> list[int]:
        """Watch the live supervisors found in jobs_dir; return the ids of running jobs."""
        with self._launch_lock:
            remove_discarded(self.jobs_dir)
            running = [job_id for job_id in self._job_ids() if self._adopt_one(job_id)]
            self.mps.release(self.jobs_dir)  # MPS daemons left that no job here needs
            return running

    def _adopt_one(self, job_id: int) -> bool:
        """Watch one job dir's supervisor; True if the job is still running."""
        with self._lock:
            if job_id in self._pidfds:
                return True
        jobdir = self._jobdir(job_id)
        if (jobdir / "reported").exists():  # the marker an earlier version made
            shutil.rmtree(jobdir, ignore_errors=True)  # mark_reported was interrupted
            return False
        if read_json(jobdir / "status.json") is not None:  # one a crash cut is not
            return False
        if not (jobdir / "spec.json").exists() and not procs.lock_is_held(
                jobdir / "supervisor.lock"):
            # Made by a launch that stopped before its spec (the agent died, or its
            # disk failed): no supervisor ever ran it, so nothing of the job did. The
            # directory goes, so that the launch, sent again, can make it anew.
            log.warning("job %s: a launch left no spec; its directory is removed", job_id)
            shutil.rmtree(jobdir, ignore_errors=True)
            return False
        try:
            pidfd = find_supervisor(jobdir)
        except SupervisorNotFound:
            # Alive (it holds the lock) but unidentifiable, e.g. started by hand: leave
            # it be. Its status.json is still found by the scans of wait_ended().
            log.warning("job %s: supervisor alive but not found; not watching it", job_id)
            return True
        if pidfd is None:
            record_lost(jobdir)
            return False
        self._watch(job_id, pidfd)
        return True

    # ------------------------------------------------------------ ends

    def wait_ended(self, timeout: float, skip: Collection[int] = ()) -> list[JobEnd]:
        """Block up to timeout until a job has ended; return all ended, unreported jobs
        (but those of ``skip``)."""
        deadline = time.monotonic() + timeout
        if not self._select_lock.acquire(timeout=max(0.0, timeout)):
            return [end for end in self._scan_ended() if end.job_id not in skip]
        try:
            while True:
                self._handle_exits(0)
                ended = [end for end in self._scan_ended() if end.job_id not in skip]
                remaining = deadline - time.monotonic()
                if ended or remaining <= 0:
                    return ended
                self._handle_exits(remaining)
        finally:
            self._select_lock.release()

    def unreported(self) -> list[JobEnd]:
        """The ended jobs not yet marked reported, without blocking."""
        if self._select_lock.acquire(blocking=False):
            try:
                self._handle_exits(0)
            finally:
                self._select_lock.release()
        return self._scan_ended()

    def clear_stale(self, job_id: int) -> bool:
        """Remove what an earlier run of the job left here, for a new run of it: False
        (and nothing removed) while a supervisor of the job is still alive."""
        jobdir = self._jobdir(job_id)
        with self._lock:
            told = job_id in self._told
        if told:  # ended: its supervisor is making the status durable
            self._exited(job_id, SUPERVISOR_EXIT_WAIT)
        if self.is_running(job_id) or procs.lock_is_held(jobdir / "supervisor.lock"):
            return False
        if jobdir.is_dir():
            log.info("job %s: a new run replaces what an ended run left here", job_id)
            discard(jobdir)
        return True

    def mark_reported(self, job_id: int) -> None:
        """The controller has recorded the job's end: forget it (a running job is kept)."""
        jobdir = self._jobdir(job_id)
        if not (jobdir / "status.json").exists():
            return
        if not self._exited(job_id, SUPERVISOR_EXIT_WAIT):
            with self._lock:
                if job_id in self._pidfds:  # told, and still making it durable
                    self._told.discard(job_id)
                    self._discard_on_exit.add(job_id)
                    return
        self._retire(jobdir)  # an interrupted removal still counts as reported

    def _retire(self, jobdir: Path) -> None:
        """A reported run's directory, its supervisor gone: kept for a later run, or
        removed."""
        if not self._spares.keep(jobdir):
            discard(jobdir)

    def _exited(self, job_id: int, timeout: float) -> bool:
        """Whether the job's supervisor (if watched) has exited, waiting up to timeout."""
        with self._lock:
            pidfd = self._pidfds.get(job_id)
            if pidfd is None:
                return True
            pidfd = os.dup(pidfd)  # its exit may be handled (and the pidfd closed) meanwhile
        try:
            return procs.pidfd_exited(pidfd, timeout)
        finally:
            os.close(pidfd)

    def _handle_exits(self, timeout: float) -> None:
        """Register new supervisors, wait up to timeout, and handle those that exited."""
        with self._lock:
            new, self._to_register = self._to_register, []
        for job_id, pidfd in new:
            self._selector.register(pidfd, selectors.EVENT_READ, job_id)
        for key, _ in self._selector.select(timeout):
            if key.data == _TOLD:
                told = self._ends.take()
                with self._lock:
                    self._told.update(job for job in told if job in self._pidfds)
            elif key.data is None:
                read_ready(self._wake_r)  # empty the wake-up pipe
            else:
                self._supervisor_exited(key.data, key.fd)

    def _supervisor_exited(self, job_id: int, pidfd: int) -> None:
        self._selector.unregister(pidfd)
        procs.reap_pidfd(pidfd)
        with self._lock:
            current = self._pidfds.get(job_id) == pidfd
            if current:
                del self._pidfds[job_id]
                self._told.discard(job_id)
            later = current and job_id in self._discard_on_exit
            self._discard_on_exit.discard(job_id)
            os.close(pidfd)  # under the lock: cancel() must not signal a closed fd
        jobdir = self._jobdir(job_id)
        if later:  # reported already
            self._retire(jobdir)
        # Not current: the job was reported and launched anew; the dir is the new run's.
        elif current and jobdir.is_dir() and not (jobdir / "status.json").exists():
            self._record_lost_or_later(job_id)
        with self._launch_lock:  # a launch that needs a daemon does not see it stop
            self.mps.release(self.jobs_dir)

    def held_cpus(self) -> set[int]:
        """The CPUs of the cpusets of the jobs running here."""
        return set[int]().union(*(self._specs.cpus_of(job_id) for job_id in self.running()))

    def _job_ids(self) -> list[int]:
        ids = []
        for entry in os.scandir(self.jobs_dir):
            if entry.name.isdigit() and entry.is_dir(follow_symlinks=False):
                ids.append(int(entry.name))
        return sorted(ids)

    def _record_lost_or_later(self, job_id: int) -> None:
        """_record_lost, or, when the state disk refuses the status, again later."""
        try:
            record_lost(self._jobdir(job_id))
        except OSError as exc:
            log.warning("job %s: cannot record its lost supervisor yet: %s", job_id, exc)
            with self._lock:
                self._unrecorded.add(job_id)

    def _scan_ended(self) -> list[JobEnd]:
        with self._lock:
            waiting, self._unrecorded = self._unrecorded, set()
            # A watched supervisor writes status.json just before it exits, and its
            # exit (or its telling, endpipe) is handled before the next scan: only the
            # others are read.
            watched = set(self._pidfds) - self._told
        for job_id in waiting:  # lost supervisors whose end the full disk refused
            if self._jobdir(job_id).is_dir() and not (self._jobdir(job_id) / "status.json").exists():
                self._record_lost_or_later(job_id)
        ended = []
        for job_id in self._job_ids():
            if job_id in watched:
                continue
            jobdir = self._jobdir(job_id)
            if (jobdir / "reported").exists():
                continue
            status = read_json(jobdir / "status.json")
            if status is not None:
                ended.append(job_end(job_id, status, self.run_of(job_id) or 0))
        return ended

