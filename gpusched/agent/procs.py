"""Process plumbing for the launcher: pidfds, lock holders, /proc, process groups."""

from __future__ import annotations

import fcntl
import os
import select
import signal
from pathlib import Path

from gpusched.agent.spawn import LOCK_FD_IN_SUPERVISOR
from gpusched.agent.supervisor import proc_starttime


def pidfd_exited(pidfd: int, timeout: float = 0.0) -> bool:
    """Whether the pidfd's process has exited, waiting up to ``timeout`` seconds."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(timeout * 1000))


def lock_is_held(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False  # the supervisor was never spawned
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the lock if it was ours
    return False


def open_pidfd(pid: int, starttime: int) -> int | None:
    """A pidfd of pid if it is still the process that started at starttime."""
    try:
        pidfd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return None
    # Checked after opening, so the pidfd refers to the very process we verified.
    try:
        same = proc_starttime(pid) == starttime
    except (OSError, ValueError, IndexError):
        same = False
    if not same:
        os.close(pidfd)
        return None
    return pidfd


def open_lock_holder(lock: Path) -> int | None:
    """A pidfd of the supervisor holding lock on its fd 3 (found through /proc)."""
    try:
        lock_stat = os.stat(lock)
    except FileNotFoundError:
        return None
    holders: dict[int, int] = {}  # pid -> parent pid
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.path.samestat(os.stat(f"/proc/{name}/fd/{LOCK_FD_IN_SUPERVISOR}"), lock_stat):
                holders[int(name)] = proc_stat(name)[0]
        except (OSError, ValueError, IndexError):
            continue
    # A job child between fork and exec shares the fd; the supervisor is its parent.
    for pid, ppid in holders.items():
        if ppid not in holders:
            try:
                return open_pidfd(pid, proc_starttime(pid))
            except (OSError, ValueError, IndexError):
                return None
    return None


def proc_stat(pid: int | str) -> tuple[int, int, int]:
    """(ppid, pgrp, starttime) of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2:].split()
    return int(fields[1]), int(fields[2]), int(fields[19])


def reap_pidfd(pidfd: int) -> None:
    try:
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
    except ChildProcessError:
        pass  # adopted from an earlier agent: not our child; init reaps it


def reap_if_child(pid: int, starttime: int) -> None:
    pidfd = open_pidfd(pid, starttime)
    if pidfd is not None:
        reap_pidfd(pidfd)
        os.close(pidfd)


def kill_process_group(pgid: int, leader_starttime: int | None, uid: int,
                       not_before: int) -> int:
    """SIGKILL what is left of a job's process group; return how many were signalled.

    ``pgid`` is the job's first process (a session leader), started at
    ``leader_starttime``. The kernel hands out no pid still used as a group id, so:
    while a process ``pgid`` lives that started at another time, the group is a
    stranger's that reused the number and nothing is touched; while the leader
    lives, the whole group is the job's. With the leader gone, each member of
    ``uid`` started no earlier than ``not_before`` is signalled through a pidfd
    opened and checked first, so no process that reused a pid meanwhile is hit, and
    no process of another user ever is.
    """
    members: list[tuple[int, int]] = []  # (pid, starttime)
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            _, pgrp, started = proc_stat(name)
            if pgrp == pgid:
                members.append((int(name), started))
        except (OSError, ValueError, IndexError):
            continue
    leader = next((started for pid, started in members if pid == pgid), None)
    if leader is not None:
        if leader_starttime is None or leader != leader_starttime:
            return 0
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return 0
        return len(members)
    signalled = 0
    for pid, started in members:
        if started < not_before or proc_uid(pid) != uid:
            continue
        pidfd = open_pidfd(pid, started)
        if pidfd is None:
            continue
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            signalled += 1
        except ProcessLookupError:
            pass
        finally:
            os.close(pidfd)
    return signalled


def proc_uid(pid: int) -> int | None:
    """The real uid of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None
