"""Becoming the job, in the job supervisor's forked child: join the job's cgroup, take
the job user's identity and umask, open its output files as that user, and exec its
command; a failure goes up the supervisor's pipe as the message the user reads. Stdlib
only, like the supervisor that imports it (gpusched.agent.supervisor)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from typing import Any

_OUTPUT_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
_LAUNCH_FAILED_EXIT = 127
# Listed once, as plain numbers: signal.valid_signals() makes an enum of each number,
# which costs a forked child more than the rest of its way to exec.
_CATCHABLE = tuple(int(s) for s in signal.valid_signals()
                   if s not in (signal.SIGKILL, signal.SIGSTOP))


class LaunchError(Exception):
    """The job could not be started; the message is for the user."""


def _drop_privileges(spec: dict[str, Any]) -> None:
    uid, gid, user = spec["uid"], spec["gid"], spec["user"]
    min_uid = int(spec.get("min_uid", 1))
    if uid < min_uid:
        raise LaunchError(f"refusing to run a job as uid {uid}: this node runs no job of a "
                          f"uid below {min_uid} (its agent's min_job_uid)")
    if os.geteuid() == 0:
        if uid == 0:
            return
        try:
            os.setgid(gid)
            os.initgroups(user, gid)
            os.setuid(uid)
        except OSError as exc:
            raise LaunchError(f"cannot switch to user {user} (uid {uid}, gid {gid}): "
                              f"{exc.strerror}") from None
    elif uid != os.getuid():
        raise LaunchError(f"cannot start a job as uid {uid}: the supervisor runs as "
                          f"uid {os.getuid()}, not root")


def _open_outputs(spec: dict[str, Any]) -> tuple[int, int]:
    """Open stdout and stderr (once when they are the same file), as the job user."""
    fds: dict[str, int] = {}
    error = None
    flags = _OUTPUT_FLAGS | (os.O_TRUNC if spec.get("open_mode") == "truncate" else 0)
    for path in dict.fromkeys([spec["stdout"], spec["stderr"]]):
        try:
            fds[path] = os.open(path, flags, 0o666)  # less the job's umask
        except OSError as exc:
            error = error or f"cannot open output file {path}: {exc.strerror}"
    if error is not None:
        # Tell the user where they will look, if that file at least could be opened.
        if spec["stderr"] in fds:
            _note_error(fds[spec["stderr"]], error)
        raise LaunchError(error)
    return fds[spec["stdout"]], fds[spec["stderr"]]


def _note_error(fd: int, message: str) -> None:
    try:
        os.write(fd, f"gpusched: error: {message}\n".encode())
    except OSError:
        pass


def _exec_job(spec: dict[str, Any], changed: Sequence[int] | None = None) -> None:
    """In the forked child: become the job. Returns only by raising LaunchError.

    Privileges are dropped before the output files are opened, so a user cannot
    have the job write where only root may.
    """
    os.setsid()  # own process group: the whole job can be signalled at once
    _drop_privileges(spec)
    # The submitter's umask, as their shell had it: private output stays private.
    os.umask(int(spec.get("umask", 0o022)) & 0o777)
    out_fd, err_fd = _open_outputs(spec)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    try:
        os.chdir(spec["cwd"])
    except OSError as exc:
        _fail_in_output(f"cannot change to working directory {spec['cwd']}: {exc.strerror}")
    default_signals(changed)
    argv, env = spec["argv"], spec["env"]
    container = spec.get("container")
    if container:  # its runtime runs the script, as the user, after their own checks
        _check_readable(container["check_paths"])
        argv, env = container["argv"], {**env, **container["env"]}
    try:
        os.execve(argv[0], argv, env) if "/" in argv[0] else os.execvpe(argv[0], argv, env)
    except OSError as exc:
        _fail_in_output(f"cannot execute {argv[0]}: {exc.strerror}")


def _check_readable(paths: list[str]) -> None:
    """A container's bind sources, as the job's user: each must exist and be readable
    (a directory also searchable), or the job fails before its runtime starts."""
    for path in paths:
        mode = os.R_OK | (os.X_OK if os.path.isdir(path) else 0)
        if not os.path.exists(path) or not os.access(path, mode):
            _fail_in_output(f"--container-mounts: {path}: not found or not readable by "
                            f"the job's user")


def _fail_in_output(message: str) -> None:
    """Raise LaunchError, noting it first in the job's stderr file (now on fd 2)."""
    _note_error(2, message)
    raise LaunchError(message)


def _child_main(spec: dict[str, Any], report_fd: int, cgroup: Any = None,
                changed: Sequence[int] | None = None) -> None:
    """Run in the fork; never returns. Failures go up the CLOEXEC pipe. ``changed``:
    the parent's changed_signals() (found before the fork, each page a forked child
    touches being copied)."""
    try:
        if cgroup is not None:
            try:
                cgroup.enter()  # as root, before anything of the job runs
            except OSError as exc:
                raise LaunchError(f"cannot join the job's cgroup: {exc.strerror}") from None
        _exec_job(spec, changed)
        message = "exec returned"
    except LaunchError as exc:
        message = str(exc)
    except BaseException as exc:  # anything at all must reach the parent, not a traceback
        message = f"cannot start the job: {exc!r}"
    try:
        os.write(report_fd, message.encode()[:4000])
    finally:
        os._exit(_LAUNCH_FAILED_EXIT)


def changed_signals() -> tuple[int, ...]:
    """The signals whose action is not the default here (signal.getsignal knows every
    one, inherited ones included)."""
    return tuple(sig for sig in _CATCHABLE if signal.getsignal(sig) is not signal.SIG_DFL)


def default_signals(changed: Sequence[int] | None = None) -> None:
    """Every signal's default action, none blocked: what a job's process starts with,
    whatever its supervisor had set. ``changed``: changed_signals(), when the caller
    (a parent, before its fork) already knows them."""
    for sig in changed_signals() if changed is None else changed:
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def run_as_job_user(spec: dict[str, Any], argv: list[str], timeout: float = 30.0) -> None:
    """Run ``argv`` as the job's user, with its variables and no input or output, for at
    most ``timeout`` seconds: what a container runtime keeps of the job's container is
    removed with it after the job (gpusched.agent.containers). Failures are ignored."""
    try:
        pid = os.fork()
    except OSError:
        return
    if pid == 0:
        try:
            os.setsid()
            _drop_privileges(spec)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            default_signals()
            os.execve(argv[0], argv, {**spec["env"], **spec["container"]["env"]})
        finally:
            os._exit(_LAUNCH_FAILED_EXIT)
    deadline = time.monotonic() + timeout
    while os.waitpid(pid, os.WNOHANG)[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return
        time.sleep(0.02)
