"""One task of a job step, in the step supervisor: its process (forked, confined,
turned into the job's user, exec'd) and the pipes of its streamed stdin, stdout and
stderr, or, for a step with a pseudo-terminal, the terminal's master side (the task's
stdin, stdout and stderr are the terminal, its controlling terminal). Stdlib only, like
the step supervisor that imports it.
"""

from __future__ import annotations

import fcntl
import grp
import os
import signal
import struct
import termios
from typing import Any

from gpusched.agent.jobexec import default_signals
from gpusched.agent.supervisor import LaunchError, _drop_privileges

_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
EXEC_FAILED_EXIT = 2  # what srun's task shows when its command cannot be executed
DEFAULT_WINDOW = (24, 80)  # rows, columns of a terminal until gsrun tells its own
TTY_MODE = 0o620  # a terminal's mode, as a login sets it (the owner, and group tty)
_WINSIZE = struct.Struct("HHHH")


class StepTask:
    """One task: its spec (``task_id``, ``env``, ``stdout``, ``stderr``, ``stdin``,
    ``stdin_frames``, ``pty``), its process once started, and the parent's ends of its
    pipes (None where the stream goes to a file or is not streamed). With ``pty`` both
    ends are the terminal's master: ``out_fd`` reads what the task writes, ``in_fd``
    (another descriptor of the same master) takes its input and window size."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.task_id = int(spec["task_id"])
        self.spec = spec
        self.pid = 0
        self.out_fd: int | None = None
        self.err_fd: int | None = None
        self.in_fd: int | None = None
        self.stdin_buffer = bytearray()
        self.stdin_closing = False  # an empty STDIN frame came: close once flushed
        self.exited = False
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.pty = bool(spec.get("pty"))
        self.eof = b"\x04"  # the terminal's end-of-file character (VEOF), for a pty
        self._report_fd: int | None = None

    @property
    def streams(self) -> list[int]:
        """The parent's read ends still open."""
        return [fd for fd in (self.out_fd, self.err_fd) if fd is not None]

    def start(self, step: dict[str, Any], cgroup: Any) -> None:
        """Fork the task, which execs its command; ``launch_error`` says how that went.
        Every task of a node is forked before any is waited for, so that they start
        side by side."""
        if self.pty:
            self._start_on_terminal(step, cgroup)
            return
        child_fds: list[int] = []
        ends = {}
        for name, streamed in (("stdout", self.spec.get("stdout") is None),
                               ("stderr", self.spec.get("stderr") is None)):
            if streamed:
                read_end, write_end = os.pipe()
                os.set_blocking(read_end, False)
                ends[name] = write_end
                child_fds.append(write_end)
                setattr(self, "out_fd" if name == "stdout" else "err_fd", read_end)
        if self.spec.get("stdin_frames"):
            read_end, write_end = os.pipe()
            os.set_blocking(write_end, False)
            ends["stdin"] = read_end
            child_fds.append(read_end)
            self.in_fd = write_end
        report_r, report_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(report_r)
            _child_main(step, self.spec, ends, report_w, cgroup)
        os.close(report_w)
        for fd in child_fds:
            os.close(fd)
        self._report_fd = report_r

    def _start_on_terminal(self, step: dict[str, Any], cgroup: Any) -> None:
        """Fork the task on a new pseudo-terminal, owned by the job's user."""
        master, slave = os.openpty()
        try:
            _set_window(slave, *DEFAULT_WINDOW)
            if os.geteuid() == 0:
                os.fchown(slave, int(step["uid"]), _tty_group(int(step["gid"])))
                os.fchmod(slave, TTY_MODE)
            self.eof = termios.tcgetattr(slave)[6][termios.VEOF] or self.eof
            report_r, report_w = os.pipe()
            self.pid = os.fork()
            if self.pid == 0:
                os.close(report_r)
                os.close(master)
                _child_main(step, self.spec, {"tty": slave}, report_w, cgroup)
            os.close(report_w)
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        self.in_fd = master
        self.out_fd = os.dup(master)
        os.set_inheritable(self.out_fd, False)
        self._report_fd = report_r

    def set_window(self, rows: int, cols: int) -> None:
        """Give the task's terminal this size (the kernel tells its foreground process
        group by SIGWINCH); nothing for a task without one or whose terminal closed."""
        if self.pty and self.in_fd is not None:
            try:
                _set_window(self.in_fd, rows, cols)
            except OSError:
                pass

    def end_input(self) -> None:
        """gsrun's input ended: close the pipe to the task once what is held is written,
        or, on a terminal, type its end-of-file character (as Ctrl-D does)."""
        if self.pty:
            self.stdin_buffer += self.eof
        else:
            self.stdin_closing = True

    def launch_error(self) -> str | None:
        """Once the task has exec'd its command: None; the error text when it could not
        (the child then exits EXEC_FAILED_EXIT)."""
        if self._report_fd is None:
            return None
        chunks = []
        while chunk := os.read(self._report_fd, 4096):  # closed by the exec (CLOEXEC)
            chunks.append(chunk)
        os.close(self._report_fd)
        self._report_fd = None
        return b"".join(chunks).decode(errors="replace") if chunks else None

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the task's process group. The task's process stays unreaped
        until the step ends, so the group id cannot have been reused."""
        if self.pid > 0:
            try:
                os.killpg(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def poll_exit(self) -> bool:
        """Whether the task has just been seen to exit (left unreaped); its exit code or
        signal are noted."""
        if self.exited or self.pid <= 0:
            return False
        info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is None:
            return False
        self.exited = True
        if info.si_code == os.CLD_EXITED:
            self.exit_code = info.si_status
        else:
            self.signal = info.si_status
        return True

    def reap(self) -> tuple[int, int]:
        """Reap the task's process: its peak RSS in bytes and CPU time in microseconds
        (with its descendants that it waited for)."""
        if self.pid <= 0:
            return 0, 0
        try:
            _, _, usage = os.wait4(self.pid, 0)
        except ChildProcessError:
            return 0, 0
        cpu = int((usage.ru_utime + usage.ru_stime) * 1_000_000)
        return usage.ru_maxrss * 1024, cpu

    def close_stdin(self) -> None:
        if self.in_fd is not None:
            os.close(self.in_fd)
            self.in_fd = None
        self.stdin_buffer.clear()


# ---------------------------------------------------------------- the task child


def _open_as_user(path: str, flags: int, what: str) -> int:
    try:
        return os.open(path, flags, 0o666)  # less the user's umask
    except OSError as exc:
        raise LaunchError(f"cannot open {what} file {path}: {exc.strerror}") from None


def _set_window(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, _WINSIZE.pack(rows, cols, 0, 0))


def _tty_group(fallback: int) -> int:
    """The group that owns terminals (``tty``), else the job's group."""
    try:
        return grp.getgrnam("tty").gr_gid
    except KeyError:
        return fallback


def _task_fds(task: dict[str, Any], ends: dict[str, int]) -> tuple[int, int, int]:
    """stdin, stdout, stderr of the task: its terminal, its pipes, or its files opened
    as its user."""
    if "tty" in ends:
        return ends["tty"], ends["tty"], ends["tty"]
    out = ends.get("stdout")
    if out is None:
        out = _open_as_user(task["stdout"], _WRITE_FLAGS, "output")
    err = ends.get("stderr")
    if err is None:
        err = out if task["stderr"] == task.get("stdout") else _open_as_user(
            task["stderr"], _WRITE_FLAGS, "error")
    stdin = ends.get("stdin")
    if stdin is None:
        stdin = _open_as_user(task.get("stdin") or os.devnull, _READ_FLAGS, "input")
    return stdin, out, err


def _become_task(step: dict[str, Any], task: dict[str, Any], ends: dict[str, int],
                 cgroup: Any) -> None:
    """In the forked child: become the task. Returns only by raising LaunchError."""
    os.setsid()  # its own process group: signals reach all it starts
    if cgroup is not None:
        try:
            cgroup.add(os.getpid())  # as root, before anything of the task runs
        except OSError as exc:
            raise LaunchError(f"cannot join the step's cgroup: {exc.strerror}") from None
    if "tty" in ends:
        try:  # the new session's controlling terminal
            fcntl.ioctl(ends["tty"], termios.TIOCSCTTY, 0)
        except OSError as exc:
            raise LaunchError(f"cannot take the pseudo-terminal: {exc.strerror}") from None
    _drop_privileges(step)
    os.umask(int(step.get("umask", 0o022)) & 0o777)
    stdin, out, err = _task_fds(task, ends)
    os.dup2(stdin, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    try:
        os.chdir(step["cwd"])
    except OSError as exc:
        raise LaunchError(f"cannot change to working directory {step['cwd']}: "
                          f"{exc.strerror}") from None
    signal.set_wakeup_fd(-1)
    default_signals()
    argv = step["argv"]
    try:
        os.execvpe(argv[0], argv, task["env"])
    except OSError as exc:
        raise LaunchError(f"cannot execute {argv[0]}: {exc.strerror}") from None


def _child_main(step: dict[str, Any], task: dict[str, Any], ends: dict[str, int],
                report_fd: int, cgroup: Any) -> None:
    """Run in the fork; never returns. A failure goes up the CLOEXEC report pipe (the
    step supervisor sends it to gsrun as the task's stderr)."""
    try:
        _become_task(step, task, ends, cgroup)
        message = "exec returned"
    except LaunchError as exc:
        message = str(exc)
    except BaseException as exc:  # anything at all must reach the parent, not a traceback
        message = f"cannot start the task: {exc!r}"
    try:
        os.write(report_fd, message.encode()[:4000])
    finally:
        os._exit(EXEC_FAILED_EXIT)
