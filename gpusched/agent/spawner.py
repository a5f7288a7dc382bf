"""The supervisor spawner: one started interpreter (``supervisor.py --spawner FD``)
that forks a supervisor per job. Stdlib only, like the supervisor."""

from __future__ import annotations

import os
import socket

from gpusched.agent import supervisor
from gpusched.agent.endpipe import TELL_FD
from gpusched.agent.supervisor import _note_error

_LOCK_FD = 3  # where a supervisor keeps its supervisor.lock (as the launcher hands it)


def serve_spawner(sock_fd: int, site_programs: bool = False) -> int:
    """Fork one supervisor per request on ``sock_fd`` until the agent closes it.

    A request is a job directory path, with its already locked supervisor.lock passed
    as SCM_RIGHTS (and the agent's end pipe, gpusched.agent.endpipe, after it); the
    answer is the new supervisor's pid as 4 bytes (0 if fork failed). Forking this
    started interpreter spares every job a Python start-up. When the agent goes away
    the spawner leaves; the supervisors it forked live on in their own sessions.
    ``site_programs``: the node runs a prolog or epilog, so what
    running them needs (subprocess) is imported once here rather than in every
    supervisor; elsewhere it is not, since a process that imported threading (as
    subprocess does) pays for its fork handlers in every child it forks.
    """
    import select

    sock = socket.socket(fileno=sock_fd)
    try:
        supervisor.confinement_module()
        from gpusched.agent import stepsupervisor  # noqa: F401 - steps start sooner
        if site_programs:
            import subprocess  # noqa: F401 - what each prolog and epilog is run with
    except ImportError:
        pass  # imported by each supervisor that needs it, or its error reported there
    while True:
        _reap_children()
        if not select.select([sock], [], [], 1.0)[0]:
            continue
        try:
            message, fds, _, _ = socket.recv_fds(sock, 4096, 2)
        except OSError:
            return 0
        if not message:
            return 0
        try:
            pid = os.fork() if len(fds) in (1, 2) else -1
        except OSError:
            pid = -1
        if pid == 0:
            sock.close()
            _become_supervisor(message.decode(), fds[0], fds[1] if len(fds) == 2 else None)
        for fd in fds:
            os.close(fd)
        sock.sendall(max(pid, 0).to_bytes(4, "little"))


def _reap_children() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _become_supervisor(jobdir: str, lock_fd: int, tell_fd: int | None) -> None:
    """In a child of the spawner: turn into JOBDIR's supervisor; never returns.
    ``tell_fd``: the agent's end pipe (gpusched.agent.endpipe), kept on TELL_FD."""
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(os.path.join(jobdir, "supervisor.log"),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.dup2(lock_fd, _LOCK_FD)
        fds, kept = {null, log, lock_fd}, {0, 1, 2, _LOCK_FD}
        if tell_fd is not None:  # on TELL_FD, which the job must not hold
            if tell_fd != TELL_FD:
                os.dup2(tell_fd, TELL_FD, inheritable=False)
            else:
                os.set_inheritable(TELL_FD, False)
            fds.add(tell_fd)
            kept.add(TELL_FD)
        for fd in fds - kept:
            os.close(fd)
        if os.path.basename(jobdir).startswith("step-"):  # a job step's part (steps.py)
            from gpusched.agent import stepsupervisor

            code = stepsupervisor.main(["stepsupervisor.py", jobdir, "--lock-fd",
                                        str(_LOCK_FD)])
        else:
            code = supervisor.main(["supervisor.py", jobdir, "--lock-fd", str(_LOCK_FD)],
                                   None if tell_fd is None else TELL_FD)
    except BaseException as exc:  # reported in supervisor.log; the launcher sees no status
        _note_error(2, f"job supervisor failed: {exc!r}")
    finally:
        os._exit(code)
