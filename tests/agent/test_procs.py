"""The leftovers of a job whose supervisor died are killed, and never a stranger's
processes that reused the job's pid as their group id."""

from __future__ import annotations

import os
import pwd
import subprocess
import time

from gpusched.agent import procs
from gpusched.agent.supervisor import proc_starttime


def _alive(pid: int) -> bool:
    try:
        _, _, _ = procs.proc_stat(pid)
    except OSError:
        return False
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"


def _wait_gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _group_members(pgid: int) -> list[int]:
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if procs.proc_stat(name)[1] == pgid and _alive(int(name)):
                found.append(int(name))
        except OSError:
            continue
    return found


def test_a_live_leader_of_another_start_time_is_a_stranger() -> None:
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        started = proc_starttime(stranger.pid)
        # The job's leader started at another time: this group reused the number.
        assert procs.kill_process_group(stranger.pid, started - 1, os.getuid(), 0) == 0
        assert procs.kill_process_group(stranger.pid, None, os.getuid(), 0) == 0
        time.sleep(0.1)
        assert stranger.poll() is None
        # The very process that led the job: its whole group goes.
        assert procs.kill_process_group(stranger.pid, started, os.getuid(), 0) == 1
        assert stranger.wait(timeout=10) == -9
    finally:
        stranger.kill()
        stranger.wait()


def test_leftovers_of_a_gone_leader_are_killed_when_they_are_the_jobs_users() -> None:
    # The leader forks a leftover and exits; reaped here, it leaves the group leaderless.
    leader = subprocess.Popen(["sh", "-c", "sleep 30 & exit 0"], start_new_session=True)
    leader.wait(timeout=10)
    deadline = time.monotonic() + 10
    while not (members := _group_members(leader.pid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(members) == 1
    leftover = members[0]
    other_uid = pwd.getpwnam("nobody").pw_uid
    # Another user's job would never take this user's processes with it...
    assert procs.kill_process_group(leader.pid, 1, other_uid, 0) == 0
    # ...nor would a job that started after them.
    assert procs.kill_process_group(leader.pid, 1, os.getuid(),
                                    proc_starttime(leftover) + 1) == 0
    assert _alive(leftover)
    assert procs.kill_process_group(leader.pid, 1, os.getuid(), 0) == 1
    assert _wait_gone(leftover)
