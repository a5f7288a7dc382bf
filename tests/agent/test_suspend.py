"""The agent's suspend without a cgroup: SIGSTOP to each process group of the job that
is still the process it was (a pid reused since is left alone), SIGCONT on resume."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from gpusched.agent.supervisor import proc_starttime
from gpusched.agent.suspend import _stop_groups, freeze_part


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rindex(b")") + 2:].split()[0].decode()


def _wait_state(pid: int, wanted: set[str]) -> str:
    deadline = time.monotonic() + 5
    while (state := _state(pid)) not in wanted and time.monotonic() < deadline:
        time.sleep(0.01)
    return state


@pytest.fixture
def group() -> Iterator[subprocess.Popen[bytes]]:
    """A shell leading its own process group, with a child of its own."""
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & wait"], start_new_session=True)
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_group_is_stopped_and_continued(group: subprocess.Popen[bytes]) -> None:
    pid = group.pid
    start = proc_starttime(pid)
    deadline = time.monotonic() + 5
    while not (children := [int(p) for p in os.listdir("/proc")
                            if p.isdigit() and _is_child(int(p), pid)]):
        assert time.monotonic() < deadline, "the shell started no child"
        time.sleep(0.01)
    assert _stop_groups([pid], [start], signal.SIGSTOP) == 1
    assert _wait_state(pid, {"T"}) == "T"
    assert _wait_state(children[0], {"T"}) == "T"  # the whole group, not its leader alone
    assert _stop_groups([pid], [start], signal.SIGCONT) == 1
    assert _wait_state(pid, {"S", "R"}) in ("S", "R")


def test_a_reused_pid_or_a_missing_start_is_left_alone(group: subprocess.Popen[bytes]) -> None:
    pid = group.pid
    assert _stop_groups([pid], [proc_starttime(pid) + 1], signal.SIGSTOP) == 0
    assert _stop_groups([pid], [None], signal.SIGSTOP) == 0
    time.sleep(0.05)
    assert _state(pid) != "T"


def test_parts_without_a_cgroup_are_signalled(group: subprocess.Popen[bytes]) -> None:
    info = {"pids": [group.pid], "starts": [proc_starttime(group.pid)]}
    assert freeze_part({"cgroup": None}, info, True)
    assert _wait_state(group.pid, {"T"}) == "T"
    assert freeze_part({}, info, False)
    assert _wait_state(group.pid, {"S", "R"}) in ("S", "R")


def _is_child(pid: int, parent: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return int(stat[stat.rindex(b")") + 2:].split()[1]) == parent
