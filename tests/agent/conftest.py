"""Fixtures for the job supervisor and launcher tests: real processes, real users."""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.agent.launcher import Launcher

TEST_USER = "gpusched-test"



def _wait_for(condition: Callable[[], Any], what: str, timeout: float = 15.0,
              seen: Callable[[], Any] | None = None) -> Any:
    """Poll condition until it returns something truthy; fail showing what was seen."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            shown = seen() if seen is not None else result
            pytest.fail(f"timed out after {timeout}s waiting for {what}; saw {shown!r}")
        time.sleep(delay)  # polling with back-off up to a deadline, not a fixed wait
        delay = min(delay * 2, 0.05)


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    """wait_for(condition, what, timeout=15, seen=None): poll until true or fail."""
    return _wait_for


def _process_gone(pid: int) -> bool:
    """True once pid has exited (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(b")") + 2:].split()[0] in (b"Z", b"X")


@pytest.fixture
def process_gone() -> Callable[[int], bool]:
    """process_gone(pid): True once pid has exited (zombies count as gone)."""
    return _process_gone


def _private_dir(mode: int, owner: pwd.struct_passwd | None = None) -> Path:
    # Not under /tmp/pytest-of-root: that is 0700, and the test user must get in.
    path = Path(tempfile.mkdtemp(prefix="gpusched-test-", dir="/tmp"))
    path.chmod(mode)
    if owner is not None:
        os.chown(path, owner.pw_uid, owner.pw_gid)
    return path


@pytest.fixture
def jobs_dir() -> Iterator[Path]:
    """A root-owned 0711 jobs directory, like the real agent's state dir."""
    path = _private_dir(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def work_dir() -> Iterator[Path]:
    """A job working directory (0755) that jobs write their output into."""
    path = _private_dir(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def test_user() -> pwd.struct_passwd:
    """The unprivileged system user gpusched-test, created if missing."""
    assert os.geteuid() == 0, "the test suite runs as root: it runs jobs as another user"
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        pass
    # check=False: a parallel test worker may have created it a moment ago.
    subprocess.run(["useradd", "--system", "--no-create-home",
                    "--shell", "/usr/sbin/nologin", TEST_USER],
                   check=False, capture_output=True)
    return pwd.getpwnam(TEST_USER)


@pytest.fixture
def user_dir(test_user: pwd.struct_passwd) -> Iterator[Path]:
    """A 0755 directory owned by the test user: its job's cwd."""
    path = _private_dir(0o755, test_user)
    yield path
    shutil.rmtree(path, ignore_errors=True)


MakeJob = Callable[..., Path]


@pytest.fixture
def make_job(jobs_dir: Path, work_dir: Path) -> Iterator[MakeJob]:
    """make_job(script_body, args=[], owner=None, **spec) -> a job dir ready to supervise.

    Writes the script and a spec.json (root's job by default, output to one file in
    work_dir); spec keys override the defaults; owner (a passwd entry) owns the script.
    """
    counter = iter(range(1, 1000))

    def make(body: str, args: list[str] | None = None,
             owner: pwd.struct_passwd | None = None, **spec: Any) -> Path:
        job_id = next(counter)
        jobdir = jobs_dir / str(job_id)
        jobdir.mkdir(mode=0o711)
        script = jobdir / "script"
        script.write_text("#!/bin/sh\n" + body + "\n")
        script.chmod(0o700)
        if owner is not None:
            os.chown(script, owner.pw_uid, owner.pw_gid)
        out = str(work_dir / f"job-{job_id}.out")
        full = {
            "job_id": job_id, "uid": 0, "gid": 0, "user": "root",
            "argv": [str(script), *(args or [])], "cwd": str(work_dir),
            "env": {"PATH": "/usr/bin:/bin"}, "stdout": out, "stderr": out,
            "time_limit": None, "kill_grace": 0.5, "min_uid": 0,
        }
        full.update(spec)
        (jobdir / "spec.json").write_text(json.dumps(full))
        return jobdir

    yield make
    kill_leftovers(jobs_dir)


@pytest.fixture
def launcher(jobs_dir: Path) -> Iterator[Launcher]:
    """A Launcher on a fresh jobs dir; leftover jobs are killed afterwards."""
    launcher = Launcher(jobs_dir)
    yield launcher
    launcher.close()
    kill_leftovers(jobs_dir)


def _supervisor_alive(jobdir: Path) -> bool:
    """True while a supervisor holds the job's lock (see gpusched.agent.launcher)."""
    try:
        fd = os.open(jobdir / "supervisor.lock", os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def kill_leftovers(jobs_dir: Path) -> None:
    """SIGKILL the supervisor and job of every unfinished job, so no test leaks processes."""
    for jobdir in jobs_dir.iterdir():
        if (jobdir / "status.json").exists() or not _supervisor_alive(jobdir):
            continue  # ended: its pids may belong to someone else by now
        # A test that failed early may come here before the supervisor wrote it.
        info_path = jobdir / "supervisor.json"
        _wait_for(info_path.exists, f"{info_path} (to clean up)", timeout=10)
        info = json.loads(info_path.read_text())
        for kill, pid in ((os.kill, info["supervisor_pid"]), (os.killpg, info["job_pid"])):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            os.waitpid(info["supervisor_pid"], os.WNOHANG)
        except ChildProcessError:
            pass


@pytest.fixture
def cgroup2(tmp_path: Path) -> Iterator[Path]:
    """A cgroup2 file system mounted for the test (every mount shows the one unified
    hierarchy: tests make a subtree named for their process under it)."""
    mnt = tmp_path / "cgroup2"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "cgroup2", "none", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)
