"""Starting job supervisors: a fresh interpreter, or a fork of the spawner process."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import threading
from pathlib import Path

SUPERVISOR = Path(__file__).with_name("supervisor.py")
STEP_SUPERVISOR = Path(__file__).with_name("stepsupervisor.py")
LOCK_FD_IN_SUPERVISOR = 3  # the fd a supervisor (or the spawner's socket) is handed on
SUPERVISOR_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                  "LC_ALL": "C.UTF-8"}
# What supervisor._WATCHED waits for (a test checks the two agree).
SUPERVISOR_SIGMASK = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGUSR2)


def spawn_supervisor_process(python: str, args: list[str], log_path: Path, handed_fd: int,
                             program: Path = SUPERVISOR) -> int:
    """``python -I -S supervisor.py ARGS`` (or another ``program``, such as the step
    supervisor) in a new session, ``handed_fd`` on fd 3; its pid.

    It starts with its signals blocked, as a supervisor runs: a cancel that comes
    while Python is still starting stays pending instead of killing it.
    """
    # posix_spawn's dup2 clears close-on-exec only when the numbers differ.
    high_fd = fcntl.fcntl(handed_fd, fcntl.F_DUPFD_CLOEXEC, 10)
    try:
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
            (os.POSIX_SPAWN_DUP2, 1, 2),
            (os.POSIX_SPAWN_DUP2, high_fd, LOCK_FD_IN_SUPERVISOR),
        ]
        argv = [python, "-I", "-S", str(program), *args]
        return os.posix_spawn(python, argv, SUPERVISOR_ENV, file_actions=actions,
                              setsid=True, setsigmask=SUPERVISOR_SIGMASK)
    finally:
        os.close(high_fd)


class SupervisorSpawner:
    """A single-threaded ``supervisor.py --spawner`` process that forks supervisors.

    Forking it costs a millisecond or two; starting a fresh interpreter per job costs
    tens. It is started on first use and again if it dies; it exits when we close our
    end of the socket, leaving the supervisors it forked running.
    """

    def __init__(self, python: str, log_path: Path, site_programs: bool = False) -> None:
        self.python = python
        self.log_path = log_path
        self.site_programs = site_programs  # the node runs a prolog or an epilog
        self._sock: socket.socket | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def spawn(self, jobdir: Path, lock_fd: int, tell_fd: int | None = None) -> int:
        """Have a supervisor forked for ``jobdir``, handing it ``lock_fd`` (and
        ``tell_fd``, the agent's end pipe, gpusched.agent.endpipe); its pid."""
        with self._lock:
            for attempt in range(2):
                try:
                    if self._sock is None:
                        self._start()
                    assert self._sock is not None
                    socket.send_fds(self._sock, [str(jobdir).encode()],
                                    [lock_fd] if tell_fd is None else [lock_fd, tell_fd])
                    answer = b""
                    while len(answer) < 4:
                        chunk = self._sock.recv(4 - len(answer))
                        if not chunk:
                            raise ConnectionError("the supervisor spawner exited")
                        answer += chunk
                    pid = int.from_bytes(answer, "little")
                    if pid <= 0:
                        raise OSError("the supervisor spawner could not fork")
                    return pid
                except OSError:
                    self._stop()
                    if attempt:
                        raise
            raise AssertionError("unreachable")

    def warm(self) -> None:
        """Start the spawner process now, so that the first spawn need not wait for an
        interpreter to start."""
        with self._lock:
            if self._sock is None:
                self._start()

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._pid = spawn_supervisor_process(
                self.python, ["--spawner", str(LOCK_FD_IN_SUPERVISOR),
                              *(["--site-programs"] if self.site_programs else [])],
                self.log_path, theirs.fileno())
        finally:
            theirs.close()
        self._sock = ours

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._pid:
            try:
                os.waitpid(self._pid, 0)  # it leaves as soon as it sees our end close
            except ChildProcessError:
                pass
            self._pid = 0

    def close(self) -> None:
        """Let the spawner exit; supervisors it forked keep running."""
        with self._lock:
            self._stop()
