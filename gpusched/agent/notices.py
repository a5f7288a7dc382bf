"""Notices for a running job's output file (the idle-GPU policy's warnings), written
as the job's user.

The agent drops each line into the job's directory as ``notice-<seq>.json`` and wakes
the supervisor (the same signal as a new time limit); the supervisor takes the files
and forks a child that becomes the job's user (as the job itself did) before it opens
the output file, so a link or a path the user controls never has root write
anywhere. The child appends and exits; the supervisor does not wait for it (a slow
file system stalls only the child, which an alarm ends). Stdlib only, like the
supervisor.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from gpusched.agent.jobexec import _drop_privileges

NOTICE_PREFIX = "notice-"
# An output file is opened as the job did, plus: never as a controlling terminal, and
# without blocking (a FIFO with no reader is skipped, not waited on).
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
WRITE_TIMEOUT = 10  # seconds the writing child may take
MAX_NOTICE_BYTES = 4096
NOTICE_SIGNAL = signal.SIGUSR2  # the supervisor's LIMIT_SIGNAL: it takes notices on it too


def notice_name(seq: int) -> str:
    """The file name of the notice of command ``seq``."""
    return f"{NOTICE_PREFIX}{seq:020d}.json"


def post_notice(jobdir: str, seq: int, text: str, supervisor_pid: int) -> None:
    """The agent's side: leave the line of command ``seq`` for the supervisor (written
    whole, then renamed into place) and wake it."""
    path = os.path.join(jobdir, notice_name(seq))
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                 | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"text": text}, f)
    os.rename(path + ".tmp", path)
    os.kill(supervisor_pid, NOTICE_SIGNAL)


def take_notices(jobdir: str) -> list[str]:
    """The lines waiting in ``jobdir``, oldest first; their files are removed."""
    try:
        names = sorted(n for n in os.listdir(jobdir)
                       if n.startswith(NOTICE_PREFIX) and n.endswith(".json"))
    except OSError:
        return []
    lines = []
    for name in names:
        path = os.path.join(jobdir, name)
        try:
            with open(path, encoding="utf-8") as f:
                text = json.load(f).get("text")
            os.unlink(path)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(text, str) and text:
            lines.append(text.replace("\n", " ")[:MAX_NOTICE_BYTES])
    return lines


def write_as_job_user(spec: dict[str, Any], lines: list[str]) -> int:
    """Fork a child that appends ``lines`` to the job's output file as the job's user;
    its pid (the caller reaps it), or 0 when there is nothing to write."""
    if not lines:
        return 0
    data = "".join(line + "\n" for line in lines).encode(errors="replace")
    pid = os.fork()
    if pid != 0:
        return pid
    code = 1
    try:
        _close_inherited()  # the supervisor's lock above all: it says "alive"
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
        signal.alarm(WRITE_TIMEOUT)
        _drop_privileges(spec)
        os.umask(int(spec.get("umask", 0o022)) & 0o777)
        fd = os.open(spec["stdout"], _FLAGS, 0o666)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        code = 0
    except BaseException:  # noqa: BLE001 - the child only ever exits
        pass
    os._exit(code)


def _close_inherited() -> None:
    """Close every descriptor but 0-2, in the forked writer."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            try:
                os.close(int(name))
            except OSError:
                pass


def reap(pids: list[int]) -> list[int]:
    """The writers of ``pids`` still running (the ended ones reaped)."""
    left = []
    for pid in pids:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if done == 0:
            left.append(pid)
    return left
