"""The supervisor of one node's part of a job step (slurmstepd for a step): connects to
gsrun's I/O socket, starts the node's tasks, streams their output there, and sees them
to their end. A step with a pseudo-terminal (gsrun --pty) has one task on a terminal
of its own: STDIN frames are typed into it, WINSIZE frames resize it, and what the task
writes there comes back as its STDOUT.

Run as ``python -I -S stepsupervisor.py STEPDIR [--lock-fd N]`` in a session of its
own, or, usually, forked by the supervisor spawner (gpusched.agent.spawner) for a
directory named ``step-*``. Stdlib only, like supervisor.py; the frames are those of
gpusched.messages.stepio, carried to and from the tasks by gpusched.agent.steprelay.

Files in STEPDIR (gpusched.agent.steps writes the spec):
  spec.json        (input) the step's user, command, tasks and where gsrun listens
  supervisor.lock  held (flock) for the supervisor's whole life: alive <=> locked
  supervisor.json  {"supervisor_pid", "supervisor_starttime", "task_pids",
                    "task_starttimes", "start_time"}
  signal.json      {"signal": N}, written by the agent before it sends SIGUSR1: deliver
                   N to every task
  deadline.json    {"deadline": EPOCH|null}, written by the agent before it sends SIGUSR2
                   (the job's time limit changed): the step's deadline instead of the
                   spec's
  status.json      {"outcome", "exit_code", "signal", "start_time", "end_time", "error",
                    "max_rss_bytes", "cpu_usec", "tasks": [[task id, exit code, signal]]}

Outcomes: completed (every task exited 0), failed, cancelled (SIGTERM to the
supervisor, or gsrun's connection lost), timeout (the job's end by its time limit:
the spec's ``deadline``, or deadline.json's), out_of_memory, launch_failed (nothing
ran: gsrun could not be reached within ``connect_timeout``, the node refused the step,
or the step's cgroup could not be made; gsrun gets an ERROR frame where it can be
reached).
"""

from __future__ import annotations

import encodings.idna  # noqa: F401 - what connecting to a host name needs, loaded ahead
import json
import math
import os
import signal
import sys
import time
from typing import Any

if not __package__:  # run as a script: make this file's package importable
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.realpath(__file__)))))

from gpusched.agent.steprelay import StepRelay  # noqa: E402
from gpusched.agent.steptask import StepTask  # noqa: E402
from gpusched.agent.supervisor import (  # noqa: E402
    _ensure_std_fds,
    _take_lock,
    confinement_module,
    proc_starttime,
)
from gpusched.messages import stepio  # noqa: E402

SIGNAL_FILE = "signal.json"
SIGNAL_REQUEST = signal.SIGUSR1  # the agent wrote signal.json: deliver that signal
DEADLINE_FILE = "deadline.json"
DEADLINE_REQUEST = signal.SIGUSR2  # the agent wrote deadline.json: read it again
_HANDLED = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, SIGNAL_REQUEST, DEADLINE_REQUEST)
_CANCELS = frozenset({signal.SIGTERM, signal.SIGINT})
CONNECT_TIMEOUT = 10.0  # seconds to reach gsrun's I/O socket
DRAIN_TIMEOUT = 2.0  # seconds to send what is left once the tasks have ended


def write_json_replace(path: str, data: dict[str, Any]) -> None:
    """Write JSON so readers see the old file or the whole new one (readable by the
    writer alone). Not synced to disk: a step's files matter only while its node runs
    (a crash of the node ends the step, and its controller records that), and a sync
    would cost each step tens of milliseconds."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(data).encode())
    finally:
        os.close(fd)
    os.rename(tmp, path)


class StepSupervisor:
    """Runs one node's part of a step from its spec."""

    def __init__(self, stepdir: str, spec: dict[str, Any]) -> None:
        self.stepdir = stepdir
        self.spec = spec
        self.tasks = [StepTask(t) for t in spec["tasks"]]
        self.relay = StepRelay(self.tasks, self._signal_tasks, self._lost_gsrun)
        self.wake_r, self.wake_w = os.pipe()
        self.start_time = 0.0
        self.stop_reason: str | None = None
        self.error: str | None = None
        self.kill_at: float | None = None
        self.deadline: float | None = None  # monotonic
        self.killed = False
        self.cgroup: Any = None
        self.confine: Any = None
        self.pending: set[int] = set()  # signals caught, not yet acted on

    # ------------------------------------------------------------ lifecycle

    def run(self) -> dict[str, Any]:
        """Connect, start the tasks, supervise them; the status to record."""
        self.start_time = time.time()
        self._install_handlers()
        io = self.spec["io"]
        error = self.relay.link.connect(
            io["host"], int(io["port"]),
            float(self.spec.get("connect_timeout") or CONNECT_TIMEOUT),
            lambda: bool(self.pending & _CANCELS))
        if error is not None:
            cancelled = self.pending & _CANCELS
            return self.status("cancelled" if cancelled else "launch_failed", error)
        self.relay.link.send(stepio.hello(io["token"], int(self.spec["job_id"]),
                                          int(self.spec["step_id"]),
                                          int(self.spec["node_index"]),
                                          [t.task_id for t in self.tasks]))
        self.relay.flush_some()  # gsrun learns at once that this node is there
        error = self._refusal() or self._make_cgroup()
        if error is not None:
            return self._launch_failed(error)
        try:
            for task in self.tasks:
                task.start(self.spec, self.cgroup)
            for task in self.tasks:
                failure = task.launch_error()
                if failure is not None:
                    self.relay.link.send_output(
                        task.task_id, stepio.STDERR,
                        f"gpusched: error: task {task.task_id}: {failure}\n".encode())
            self._write_info()
            self._supervise()
            self._finish_tasks()
        finally:
            usage = self._end_cgroup()
        return self._outcome(usage)

    def _launch_failed(self, error: str) -> dict[str, Any]:
        """Tell gsrun why nothing runs here; the launch_failed status."""
        self.relay.link.send(stepio.encode(stepio.ERROR, 0,
                                           error.encode()[:stepio.MAX_PAYLOAD]))
        self.relay.link.flush(time.monotonic() + DRAIN_TIMEOUT)
        return self.status("launch_failed", error)

    def _refusal(self) -> str | None:
        """Why this node runs nothing of the step: the agent's refusal, or a uid below
        the node's min_job_uid."""
        if self.spec.get("refusal"):
            return str(self.spec["refusal"])
        uid, min_uid = int(self.spec["uid"]), int(self.spec.get("min_uid", 1))
        if uid < min_uid:
            return (f"this node runs no job of a uid below {min_uid} (its agent's "
                    f"min_job_uid); uid {uid} is")
        if os.geteuid() != 0 and uid != os.geteuid():
            return f"the step supervisor runs as uid {os.geteuid()} and cannot run uid {uid}"
        return None

    def _make_cgroup(self) -> str | None:
        if not self.spec.get("cgroup"):
            return None
        self.confine = confinement_module()
        try:
            self.cgroup = self.confine.make_job_cgroup(self.spec["cgroup"])
        except self.confine.ConfineError as exc:
            return f"cannot confine the step: {exc}"
        return None

    def _end_cgroup(self) -> Any:
        cgroup, self.cgroup = self.cgroup, None
        return None if cgroup is None else self.confine.end_job_cgroup(cgroup)

    def _write_info(self) -> None:
        write_json_replace(os.path.join(self.stepdir, "supervisor.json"), {
            "supervisor_pid": os.getpid(), "supervisor_starttime": proc_starttime("self"),
            "task_pids": [t.pid for t in self.tasks],
            "task_starttimes": [_starttime(t.pid) for t in self.tasks],
            "start_time": self.start_time})

    # ------------------------------------------------------------ signals

    def _install_handlers(self) -> None:
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)

        def note(signum: int, frame: object) -> None:
            self.pending.add(signum)

        for sig in _HANDLED:
            signal.signal(sig, note)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)
        self.relay.watch_wakeup(self.wake_r)

    def _take_signals(self) -> set[int]:
        taken, self.pending = self.pending, set()
        while True:
            try:
                if not os.read(self.wake_r, 4096):
                    break
            except BlockingIOError:
                break
        return taken

    def _act_on_signals(self) -> None:
        taken = self._take_signals()
        if taken & _CANCELS:
            self._stop("cancelled")
        if SIGNAL_REQUEST in taken:
            try:
                with open(os.path.join(self.stepdir, SIGNAL_FILE), encoding="utf-8") as f:
                    number = int(json.load(f)["signal"])
            except (OSError, ValueError, KeyError, TypeError):
                number = 0
            if 0 < number < signal.NSIG:
                self._signal_tasks(number)
        if DEADLINE_REQUEST in taken:
            self.deadline = self._deadline()

    def _signal_tasks(self, sig: int) -> None:
        """Send ``sig`` to every running task's process group."""
        for task in self.tasks:
            if not task.exited:
                task.signal_group(sig)

    def _stop(self, reason: str) -> None:
        """End the step: SIGTERM now, everything killed after the kill grace."""
        if self.stop_reason is not None:
            return
        self.stop_reason = reason
        self.kill_at = time.monotonic() + float(self.spec.get("kill_grace", 0))
        for task in self.tasks:
            if task.pty and not task.exited:  # a shell on a terminal ignores TERM
                task.signal_group(signal.SIGHUP)
        self._signal_tasks(signal.SIGTERM)
        self._signal_tasks(signal.SIGCONT)  # a stopped task must wake up to see the TERM
        self._signal_escaped(signal.SIGTERM)

    def _signal_escaped(self, sig: int) -> None:
        """Send ``sig`` to the step's processes that left their task's process group."""
        if self.cgroup is None:
            return
        groups = {t.pid for t in self.tasks}
        for pid in self.cgroup.pids():
            try:
                if os.getpgid(pid) not in groups:
                    os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _kill_all(self) -> None:
        for task in self.tasks:
            task.signal_group(signal.SIGKILL)
        if self.cgroup is not None:
            self.cgroup.kill()
        self.killed = True

    # ------------------------------------------------------------ the loop

    def _supervise(self) -> None:
        """Stream I/O and watch the tasks until every one has exited."""
        self.relay.watch_tasks()
        self.deadline = self._deadline()
        while not all(t.exited for t in self.tasks):
            now = time.monotonic()
            if self.stop_reason is None and self.deadline is not None and now >= self.deadline:
                self._stop("timeout")
            if self.kill_at is not None and not self.killed and now >= self.kill_at:
                self._kill_all()
            self.relay.wait(self._next_wakeup())
            self._act_on_signals()
            for task in self.tasks:
                if task.poll_exit():
                    self.relay.send_exit(task)

    def _deadline(self) -> float | None:
        """When the step must stop (monotonic clock), from the epoch deadline the agent
        last wrote to deadline.json (the job's time limit changed), else the spec's."""
        at = self.spec.get("deadline")
        try:
            with open(os.path.join(self.stepdir, DEADLINE_FILE), encoding="utf-8") as f:
                written = json.load(f)["deadline"]
            if written is None or (isinstance(written, int | float)
                                   and not isinstance(written, bool)
                                   and math.isfinite(written)):
                at = written
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none written: the spec's stands
        return None if at is None else time.monotonic() + float(at) - time.time()

    def _next_wakeup(self) -> float | None:
        if self.stop_reason is None:
            return self.deadline
        return None if self.killed else self.kill_at

    def _finish_tasks(self) -> None:
        """Every task has exited: kill what they left running, send the rest of their
        output and flush it to gsrun."""
        self._kill_all()
        self.relay.finish(time.monotonic() + DRAIN_TIMEOUT)

    def _lost_gsrun(self, why: str) -> None:
        """gsrun is gone: nobody takes the output any more, so the step ends."""
        if not all(t.exited for t in self.tasks):
            self.error = self.error or why
            self._stop("cancelled")

    # ------------------------------------------------------------ the end

    def _outcome(self, usage: Any) -> dict[str, Any]:
        """The status of the step here once every task has ended."""
        rss = cpu = 0
        for task in self.tasks:
            task_rss, task_cpu = task.reap()
            rss, cpu = max(rss, task_rss), cpu + task_cpu
        codes = [t.exit_code for t in self.tasks if t.exit_code is not None]
        signals = [t.signal for t in self.tasks if t.signal is not None]
        ok = not signals and all(c == 0 for c in codes)
        outcome = self.stop_reason or ("completed" if ok else "failed")
        status = self.status(outcome, self.error)
        status.update(exit_code=max(codes) if codes else None,
                      signal=max(signals) if signals else None,
                      max_rss_bytes=rss, cpu_usec=cpu,
                      tasks=[[t.task_id, t.exit_code, t.signal] for t in self.tasks])
        if usage is not None:
            if usage.peak_memory is not None:
                status["max_rss_bytes"] = usage.peak_memory
            if usage.cpu_usec is not None:
                status["cpu_usec"] = usage.cpu_usec
            if usage.oom_killed and outcome == "failed":
                status["outcome"] = "out_of_memory"
        return status

    def status(self, outcome: str, error: str | None) -> dict[str, Any]:
        """status.json for this outcome, ending now."""
        return {"outcome": outcome, "exit_code": None, "signal": None,
                "start_time": self.start_time or None, "end_time": time.time(),
                "error": error, "max_rss_bytes": None, "cpu_usec": None,
                "tasks": [[t.task_id, None, None] for t in self.tasks]}

    def abort(self) -> None:
        """Kill everything of the step at once (the supervisor itself is failing)."""
        self._kill_all()
        if self.cgroup is not None:
            self.confine.remove_job_cgroup(self.cgroup)


def _starttime(pid: int) -> int | None:
    try:
        return proc_starttime(pid)
    except (OSError, ValueError, IndexError):
        return None  # never started, or already gone (and unreaped)


# ---------------------------------------------------------------- entry point


def _read_spec(stepdir: str) -> dict[str, Any]:
    with open(os.path.join(stepdir, "spec.json"), "rb") as f:
        spec = json.load(f)
    for key in ("job_id", "step_id", "uid", "gid", "user", "argv", "cwd", "tasks", "io"):
        if key not in spec:
            raise ValueError(f"missing key {key!r}")
    if not spec["argv"] or not spec["tasks"]:
        raise ValueError("no command or no tasks")
    return dict(spec)


def _parse_args(argv: list[str]) -> tuple[str, int | None]:
    if len(argv) == 2:
        return argv[1], None
    if len(argv) == 4 and argv[2] == "--lock-fd":
        return argv[1], int(argv[3])
    raise SystemExit("usage: stepsupervisor.py STEPDIR [--lock-fd N]")


def main(argv: list[str]) -> int:
    """Supervise the step part of STEPDIR; exit 0 once its status.json is written."""
    stepdir, lock_fd = _parse_args(argv)
    status_path = os.path.join(stepdir, "status.json")
    if os.path.exists(status_path):
        return 0
    _ensure_std_fds()
    if _take_lock(stepdir, lock_fd) is None or os.path.exists(status_path):
        return 0  # another supervisor runs (or ran) this step
    try:
        spec = _read_spec(stepdir)
    except (OSError, ValueError) as exc:
        now = time.time()
        write_json_replace(status_path, {
            "outcome": "launch_failed", "exit_code": None, "signal": None,
            "start_time": now, "end_time": now, "error": f"bad step spec: {exc}"})
        return 0
    supervisor = StepSupervisor(stepdir, spec)
    try:
        status = supervisor.run()
    except BaseException as exc:
        supervisor.abort()  # never leave tasks running unsupervised
        status = supervisor.status("failed", f"step supervisor error: {exc!r}")
        write_json_replace(status_path, status)
        raise
    write_json_replace(status_path, status)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
