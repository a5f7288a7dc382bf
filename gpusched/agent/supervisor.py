"""The per-job supervisor (like Slurm's slurmstepd): starts one job and watches it.

Run as ``python -I -S supervisor.py JOBDIR [--lock-fd N]`` in a session of its own,
so it outlives agent restarts; or, usually, forked in a new session by the agent's
``supervisor.py --spawner FD`` process (gpusched.agent.spawner), which spares each job
an interpreter start-up.
It imports only the stdlib and gpusched.agent.jobexec (stdlib only: what its forked
child does to become the job), to start fast and to depend on nothing the agent might
be upgrading underneath it.

Files in JOBDIR:
  spec.json        (input) what to run, as whom, where, for how long
  supervisor.lock  held (flock) for the supervisor's whole life: alive <=> locked; it
                   holds FORKED from just before the job is forked (empty: nothing of
                   the job ran; a supervisor of an earlier version made a file
                   ``forking`` instead)
  status.reserve   room set aside by the launcher, given up to write the two files
                   below when the state disk is full (see make_reserve)
  supervisor.json  {"supervisor_pid", "supervisor_starttime", "job_pid", "job_starttime",
                    "start_time"}
  status.json      {"outcome", "exit_code", "signal", "start_time", "end_time", "error",
                    "max_rss_bytes", "cpu_usec", "epilog_error"}

Outcomes: completed, failed, cancelled (SIGTERM to the supervisor), timeout,
launch_failed (nothing of the job ever ran), out_of_memory (the OOM killer killed in
the job's cgroup and the job did not succeed), prolog_failed (the node's prolog failed:
the job never started).

A spec with a ``cgroup`` has the job confined in a cgroup of its own (made before the
fork, joined by the child before it drops privileges, killed whole at the end); with a
``prolog`` or ``epilog`` those run as the supervisor's user around the job. Both come
from gpusched.agent.jobconfine, imported only then.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import time
from types import ModuleType
from typing import Any


def _add_package_path() -> None:
    """Make the package this file belongs to importable (and only it): run as
    ``python -I -S`` the supervisor has no package path until this adds it."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    if root not in sys.path and os.path.isfile(os.path.join(root, "gpusched", "agent",
                                                            "jobconfine.py")):
        sys.path.append(root)


if not __package__:  # run as a script: the job's exec is in a module of its package
    _add_package_path()

# LaunchError, _drop_privileges and _note_error are re-exported (steptask, spawner).
from gpusched.agent.endpipe import tell  # noqa: E402
from gpusched.agent.jobexec import LaunchError as LaunchError  # noqa: E402
from gpusched.agent.jobexec import _child_main, changed_signals, run_as_job_user  # noqa: E402
from gpusched.agent.jobexec import _drop_privileges as _drop_privileges  # noqa: E402
from gpusched.agent.jobexec import _note_error as _note_error  # noqa: E402
from gpusched.agent.jobfiles import (  # noqa: E402
    FULL_DISK_PATIENCE,
    write_job_file,
    write_then_tell,
)
from gpusched.agent.jobfiles import write_json_atomic as write_json_atomic  # noqa: E402
from gpusched.agent.notices import reap, take_notices, write_as_job_user  # noqa: E402

# Written into supervisor.lock just before the job is forked (a write, not a new file:
# on some file systems making a file costs a job more than most of its start): a job
# directory with an empty lock (nor supervisor.json, nor the ``forking`` file an earlier
# version made) is one of which nothing ever ran, whatever became of its supervisor.
FORKED = b"forked\n"
FORKING = "forking"
# The agent writes a running job's new time limit here and sends LIMIT_SIGNAL; the
# same signal has the supervisor write the job's notices (gpusched.agent.notices).
LIMIT_FILE = "limit.json"
LIMIT_SIGNAL = signal.SIGUSR2
_WATCHED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, LIMIT_SIGNAL}
_CANCEL_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def proc_starttime(pid: int | str) -> int:
    """Field 22 of /proc/PID/stat: start time in clock ticks since boot."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # comm (field 2) may contain spaces and parentheses; the fields after it do not.
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def job_forked(jobdir: str) -> bool:
    """Whether JOBDIR's supervisor got as far as forking the job (FORKED in its lock, or
    an earlier version's ``forking`` file)."""
    try:
        if os.stat(os.path.join(jobdir, "supervisor.lock")).st_size > 0:
            return True
    except FileNotFoundError:
        pass
    return os.path.exists(os.path.join(jobdir, FORKING))


def _starttime_or_none(pid: int) -> int | None:
    try:
        return proc_starttime(pid)
    except (OSError, ValueError, IndexError):
        return None  # already gone (and unreaped: the group id is still ours)


# ---------------------------------------------------------------- supervision


def confinement_module() -> ModuleType:
    """gpusched.agent.jobconfine (stdlib only), imported only for a job that needs it."""
    try:
        from gpusched.agent import jobconfine
    except ImportError:
        _add_package_path()
        from gpusched.agent import jobconfine
    return jobconfine


class Supervisor:
    """Starts the job of one JOBDIR and sees it to its end."""

    def __init__(self, jobdir: str, spec: dict[str, Any], lock_fd: int) -> None:
        self.jobdir = jobdir
        self.spec = spec
        self.lock_fd = lock_fd  # supervisor.lock, held
        self.job_pid = 0
        self.start_time = 0.0
        self.stop_reason: str | None = None  # "cancelled" or "timeout" once stopping
        self.kill_at: float | None = None
        self.killed = False
        self.warn_at: float | None = None  # --signal: when to warn of the time limit
        self.warned = False
        self.cgroup: Any = None  # the job's JobCgroup, while it exists
        self.confine: Any = None  # gpusched.agent.jobconfine, for a job that needs it
        self.notice_writers: list[int] = []  # children writing notices as the job's user

    def run(self) -> dict[str, Any]:
        """Run the prolog, start the job, supervise it, run the epilog; return the status
        to record."""
        if self.spec.get("cgroup") or self.spec.get("prolog") or self.spec.get("epilog"):
            self.confine = confinement_module()
        if self.confine is not None and self.spec.get("prolog"):
            error = self.confine.run_prolog(self.spec)
            if error is not None:
                return self.status("prolog_failed", None, None, f"prolog failed: {error}")
        if _cancel_pending():
            status = self.status("cancelled", None, None, None)
        else:
            status = self._run_job()
        cleanup = (self.spec.get("container") or {}).get("cleanup")
        if cleanup:  # what the runtime keeps of the run's container, as the job's user
            run_as_job_user(self.spec, cleanup)
        if self.confine is not None and self.spec.get("epilog"):
            error = self.confine.run_epilog(self.spec)
            if error is not None:
                status["epilog_error"] = f"epilog failed: {error}"
        return status

    def _run_job(self) -> dict[str, Any]:
        """Confine, start and supervise the job; its status."""
        if self.spec.get("cgroup"):
            try:
                self.cgroup = self.confine.make_job_cgroup(self.spec["cgroup"])
            except self.confine.ConfineError as exc:
                return self.status("launch_failed", None, None,
                                   f"cannot confine the job: {exc}")
            for note in self.spec["cgroup"].get("notes") or []:
                print(f"gpusched: job {self.spec.get('job_id')}: {note}", flush=True)
        try:
            error = self._start()
            if error is not None:
                status = self.status("launch_failed", None, None, error)
            else:
                wait_status = self._supervise()
                if os.WIFSIGNALED(wait_status):
                    exit_code, sig = None, os.WTERMSIG(wait_status)
                else:
                    exit_code, sig = os.waitstatus_to_exitcode(wait_status), None
                outcome = self.stop_reason or ("completed" if exit_code == 0 else "failed")
                status = self.status(outcome, exit_code, sig, None)
        finally:
            usage = self._end_cgroup()
        if usage is not None:
            status["max_rss_bytes"], status["cpu_usec"] = usage.peak_memory, usage.cpu_usec
            if usage.oom_killed and status["outcome"] == "failed":
                status["outcome"] = "out_of_memory"
        return status

    def _end_cgroup(self) -> Any:
        """Empty and remove the job's cgroup; what it used (None: not confined)."""
        job, self.cgroup = self.cgroup, None
        return None if job is None else self.confine.end_job_cgroup(job)

    def abort(self) -> None:
        """Kill everything of the job at once (the supervisor itself is failing)."""
        if self.job_pid > 0:
            self.signal_job(signal.SIGKILL)
        if self.cgroup is not None:
            self.confine.remove_job_cgroup(self.cgroup)

    def _start(self) -> str | None:
        """Fork and exec the job; return the launch error, or None once it runs."""
        report_r, report_w = os.pipe()  # both ends CLOEXEC: exec closes the write end
        self.start_time = time.time()
        os.pwrite(self.lock_fd, FORKED, 0)
        changed = changed_signals()
        self.job_pid = os.fork()
        if self.job_pid == 0:
            os.close(report_r)
            _child_main(self.spec, report_w, self.cgroup, changed)
        os.close(report_w)
        # Not durable: what it names (this process, the job's) does not outlive a
        # crash of the machine either, and the job runs meanwhile.
        write_job_file(os.path.join(self.jobdir, "supervisor.json"), durable=False,
                       patience=FULL_DISK_PATIENCE, data={
            "supervisor_pid": os.getpid(),
            "supervisor_starttime": proc_starttime("self"),
            "job_pid": self.job_pid,
            "job_starttime": _starttime_or_none(self.job_pid),
            "start_time": self.start_time,
        })
        chunks = []
        while chunk := os.read(report_r, 4096):
            chunks.append(chunk)
        os.close(report_r)
        if not chunks:
            return None
        os.waitpid(self.job_pid, 0)
        return b"".join(chunks).decode(errors="replace")

    def _deadline(self, limit: float | None) -> float | None:
        """When a job with this time limit must stop (monotonic clock), and when it is
        warned (--signal); None without a limit."""
        if limit is None:
            self.warn_at = None
            return None
        # The job may have run a while already (output files on slow storage).
        deadline = time.monotonic() + float(limit) - (time.time() - self.start_time)
        if self.spec.get("warn_signal") and not self.warned:
            self.warn_at = deadline - float(self.spec.get("warn_seconds") or 0)
        return deadline

    def _new_limit(self) -> float | None:
        """The time limit the agent wrote for this running job (``limit.json``)."""
        try:
            with open(os.path.join(self.jobdir, LIMIT_FILE), encoding="utf-8") as f:
                limit = json.load(f)["time_limit"]
        except (OSError, ValueError, KeyError):
            limit = self.spec.get("time_limit")
        return None if limit is None else float(limit)

    def _supervise(self) -> int:
        """Wait for the job, enforcing the time limit and cancels; return its wait status."""
        deadline = self._deadline(self.spec.get("time_limit"))
        while not self._job_exited():
            now = time.monotonic()
            if self.warn_at is not None and now >= self.warn_at and self.stop_reason is None:
                self._warn()
            if self.stop_reason is None and deadline is not None and now >= deadline:
                self._stop("timeout", now)
            if self.kill_at is not None and not self.killed and now >= self.kill_at:
                self.signal_job(signal.SIGKILL)
                if self.cgroup is not None:
                    self.cgroup.kill()  # also what left the process group
                self.killed = True
            wake = self._next_wakeup(deadline)
            info: signal.struct_siginfo | None
            if wake is None:
                info = signal.sigwaitinfo(_WATCHED)
            else:
                info = signal.sigtimedwait(_WATCHED, max(0.0, wake - time.monotonic()))
            if info is not None and info.si_signo in _CANCEL_SIGNALS and self.stop_reason is None:
                self._stop("cancelled", time.monotonic())
            elif info is not None and info.si_signo == LIMIT_SIGNAL and self.stop_reason is None:
                deadline = self._deadline(self._new_limit())
            if info is not None and info.si_signo == LIMIT_SIGNAL:
                writer = write_as_job_user(self.spec, take_notices(self.jobdir))
                self.notice_writers += [writer] if writer else []
            if info is not None and info.si_signo == signal.SIGCHLD:
                self.notice_writers = reap(self.notice_writers)
        # Slurm ends the whole step with its main process: leftovers (backgrounded
        # grandchildren) are killed. The unreaped child keeps the group id from reuse.
        self._signal_group(signal.SIGKILL)
        if self.cgroup is not None:
            self.cgroup.kill()  # and what escaped it with setsid or a double fork
        _, wait_status = os.waitpid(self.job_pid, 0)
        return wait_status

    def _next_wakeup(self, deadline: float | None) -> float | None:
        if self.stop_reason is None:
            return deadline if self.warn_at is None else self.warn_at
        return None if self.killed else self.kill_at

    def _warn(self) -> None:
        """sbatch --signal: tell the job (or its batch script alone) its time is nearly up."""
        self.warn_at = None
        self.warned = True
        number = int(self.spec["warn_signal"])
        if self.spec.get("warn_batch_only"):
            try:
                os.kill(self.job_pid, number)
            except (ProcessLookupError, PermissionError):
                pass
        else:
            self.signal_job(number)

    def _job_exited(self) -> bool:
        # WNOWAIT: leave the zombie in place so the process group id cannot be reused
        # before the leftovers of the group are killed.
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        return os.waitid(os.P_PID, self.job_pid, flags) is not None

    def _stop(self, reason: str, now: float) -> None:
        self.stop_reason = reason
        self.kill_at = now + float(self.spec.get("kill_grace", 0))
        self.signal_job(signal.SIGTERM)
        self.signal_job(signal.SIGCONT)  # a stopped job must wake up to see the TERM

    def signal_job(self, sig: int) -> None:
        """Send sig to the job's whole process group, if anything of it is left, and to
        what of it left the group, in its cgroup."""
        self._signal_group(sig)
        if self.cgroup is not None:
            self.confine.signal_others(self.cgroup, self.job_pid, sig)

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.job_pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def status(self, outcome: str, exit_code: int | None, sig: int | None,
               error: str | None) -> dict[str, Any]:
        """The status.json content for this outcome, ending now (no start time when
        nothing of the job started)."""
        return {"outcome": outcome, "exit_code": exit_code, "signal": sig,
                "start_time": self.start_time or None, "end_time": time.time(),
                "error": error}


def _cancel_pending() -> bool:
    """Whether a cancel came (blocked, pending) before the job was started."""
    return bool(signal.sigpending() & _CANCEL_SIGNALS)


# ---------------------------------------------------------------- entry point


def _take_lock(jobdir: str, lock_fd: int | None) -> int | None:
    """Hold JOBDIR/supervisor.lock; None when another supervisor already holds it."""
    path = os.path.join(jobdir, "supervisor.lock")
    if lock_fd is not None:
        # Handed over already locked by the launcher, so there is no unlocked window.
        if os.path.samestat(os.fstat(lock_fd), os.stat(path)):
            os.set_inheritable(lock_fd, False)
            return lock_fd
        os.close(lock_fd)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _ensure_std_fds() -> None:
    # Files opened later must not land on 0-2, or dup2 onto them would be a no-op.
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)


def _read_spec(jobdir: str) -> dict[str, Any]:
    with open(os.path.join(jobdir, "spec.json"), "rb") as f:
        spec = json.load(f)
    for key in ("uid", "gid", "user", "argv", "cwd", "env", "stdout", "stderr"):
        if key not in spec:
            raise ValueError(f"missing key {key!r}")
    if not spec["argv"] or not os.path.isabs(spec["argv"][0]):
        raise ValueError("argv[0] must be an absolute path")
    return dict(spec)


def _parse_args(argv: list[str]) -> tuple[str, int | None]:
    if len(argv) == 2:
        return argv[1], None
    if len(argv) == 4 and argv[2] == "--lock-fd":
        return argv[1], int(argv[3])
    raise SystemExit("usage: supervisor.py JOBDIR [--lock-fd N] | "
                     "supervisor.py --spawner FD [--site-programs]")


def main(argv: list[str], tell_fd: int | None = None) -> int:
    """Supervise the job of JOBDIR; exit 0 once its status.json is written (durably;
    with ``tell_fd``, the agent's end pipe, told so before it is made durable)."""
    jobdir, lock_fd = _parse_args(argv)
    status_path = os.path.join(jobdir, "status.json")
    if os.path.exists(status_path):
        return 0
    _ensure_std_fds()
    held = _take_lock(jobdir, lock_fd)
    if held is None or os.path.exists(status_path):
        return 0  # another supervisor runs (or ran) this job
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # The launcher spawns us with these blocked already (so an early cancel is not
    # fatal); block them anyway for a supervisor started by hand. Blocked before the fork: a SIGCHLD or cancel that comes early stays pending
    # for sigtimedwait instead of being lost. The child unblocks before exec.
    signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)
    try:
        spec = _read_spec(jobdir)
    except (OSError, ValueError) as exc:
        now = time.time()
        write_job_file(status_path, {
            "outcome": "launch_failed", "exit_code": None, "signal": None,
            "start_time": now, "end_time": now, "error": f"bad job spec: {exc}"},
            patience=FULL_DISK_PATIENCE)
        return 0
    supervisor = Supervisor(jobdir, spec, held)
    try:
        status = supervisor.run()
    except BaseException as exc:
        # Never leave a job running unsupervised.
        supervisor.abort()
        status = supervisor.status("failed", None, None, f"job supervisor error: {exc!r}")
        write_job_file(status_path, status, patience=FULL_DISK_PATIENCE)
        raise
    if tell_fd is None:
        write_job_file(status_path, status, patience=FULL_DISK_PATIENCE)
    else:  # the agent reads it while it goes to disk
        write_then_tell(status_path, status, FULL_DISK_PATIENCE,
                        lambda: tell(tell_fd, spec.get("job_id")))
    return 0


if __name__ == "__main__":
    if len(sys.argv) in (3, 4) and sys.argv[1] == "--spawner":
        from gpusched.agent.spawner import serve_spawner

        sys.exit(serve_spawner(int(sys.argv[2]), "--site-programs" in sys.argv[3:]))
    sys.exit(main(sys.argv))
