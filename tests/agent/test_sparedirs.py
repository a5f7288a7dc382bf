"""Reported runs' directories kept for later runs (gpusched.agent.sparedirs): what a
spare keeps and empties, when a directory is removed instead, and a run launched in one,
through a real Launcher and supervisor."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpusched.agent import jobfiles
from gpusched.agent.jobfiles import RESERVE, RESERVE_BYTES
from gpusched.agent.launcher import Launcher
from gpusched.agent.sparedirs import SPARE, SpareDirs
from tests.agent.test_launcher import start, wait_end

WaitFor = Callable[..., Any]
KEPT = {RESERVE, "supervisor.lock", "supervisor.log", "spec.json.tmp", "supervisor.json.tmp",
        "status.json.tmp"}


def _ended_run(jobs_dir: Path, name: str = "7", **extra: bytes) -> Path:
    """A directory as a run leaves it once its end is reported."""
    jobdir = jobs_dir / name
    jobdir.mkdir(mode=0o711)
    jobfiles.make_reserve(str(jobdir))
    files = {"supervisor.lock": b"forked\n", "supervisor.log": b"a line\n",
             "spec.json": b'{"job_id": 7}', "supervisor.json": b"{}",
             "status.json": b'{"outcome": "completed"}', "script": b"#!/bin/sh\n", **extra}
    for file, data in files.items():
        (jobdir / file).write_bytes(data)
    return jobdir


def _inodes(directory: Path) -> dict[str, int]:
    return {entry.name: entry.inode() for entry in os.scandir(directory)}


def test_a_spare_keeps_only_the_agents_files_emptied(jobs_dir: Path) -> None:
    jobdir = _ended_run(jobs_dir, **{"notice-1.json": b"{}", "forking": b""})
    before = _inodes(jobdir)
    spares = SpareDirs(jobs_dir)
    assert spares.keep(jobdir) and len(spares) == 1
    assert os.listdir(jobs_dir) == [f"{SPARE}0"]
    spare = jobs_dir / f"{SPARE}0"
    assert set(os.listdir(spare)) == KEPT  # the script, notices and markers are gone
    for name in ("supervisor.lock", "supervisor.log"):
        assert (spare / name).read_bytes() == b"", name
    after = _inodes(spare)
    for name in ("spec.json", "supervisor.json", "status.json"):
        assert after[f"{name}.tmp"] == before[name], name  # the same file, renamed
    assert after[RESERVE] == before[RESERVE]
    assert os.stat(spare / RESERVE).st_blocks * 512 >= RESERVE_BYTES


def test_a_spare_becomes_the_new_runs_directory(jobs_dir: Path) -> None:
    spares = SpareDirs(jobs_dir)
    assert not spares.take(jobs_dir / "8")  # none yet
    assert spares.keep(_ended_run(jobs_dir))
    (jobs_dir / "9").mkdir()
    assert not spares.take(jobs_dir / "9") and len(spares) == 1  # in the way: not used
    assert spares.take(jobs_dir / "8") and len(spares) == 0
    assert sorted(os.listdir(jobs_dir)) == ["8", "9"]
    assert set(os.listdir(jobs_dir / "8")) == KEPT


def test_what_cannot_be_a_spare_is_removed_or_left_to_the_caller(jobs_dir: Path) -> None:
    spares = SpareDirs(jobs_dir, limit=1)
    no_reserve = _ended_run(jobs_dir, "1")
    os.unlink(no_reserve / RESERVE)  # given up on a full disk
    with_dir = _ended_run(jobs_dir, "2")
    (with_dir / "more").mkdir()
    held = _ended_run(jobs_dir, "3")
    fd = os.open(held / "supervisor.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a supervisor alive in it
        for jobdir in (no_reserve, with_dir, held):
            assert spares.keep(jobdir)  # handled: removed, not kept
            assert not jobdir.exists()
    finally:
        os.close(fd)
    assert len(spares) == 0 and os.listdir(jobs_dir) == []
    assert spares.keep(_ended_run(jobs_dir, "4"))
    full = _ended_run(jobs_dir, "5")
    assert not spares.keep(full)  # over the limit: left as it was for the caller
    assert "script" in os.listdir(full) and len(spares) == 1


def test_a_reserve_set_aside_already_is_kept_and_a_short_one_made_whole(tmp_path: Path) -> None:
    jobfiles.make_reserve(str(tmp_path))
    inode = os.stat(tmp_path / RESERVE).st_ino
    jobfiles.make_reserve(str(tmp_path))
    assert os.stat(tmp_path / RESERVE).st_ino == inode
    (tmp_path / RESERVE).write_bytes(b"short")
    jobfiles.make_reserve(str(tmp_path))
    assert os.stat(tmp_path / RESERVE).st_blocks * 512 >= RESERVE_BYTES


def test_a_run_in_a_spare_runs_and_ends_as_its_own(
        launcher: Launcher, jobs_dir: Path, work_dir: Path, wait_for: WaitFor) -> None:
    first_out = work_dir / "first.out"
    start(launcher, work_dir, "echo first; exit 3", job_id=7, output=str(first_out))
    assert wait_end(launcher, 7, wait_for).exit_code == 3
    before = _inodes(jobs_dir / "7")
    launcher.mark_reported(7)
    assert os.listdir(jobs_dir) == [f"{SPARE}0"]
    second_out = work_dir / "second.out"
    start(launcher, work_dir, "echo second", job_id=8, output=str(second_out))
    assert os.listdir(jobs_dir) == ["8"]  # the spare, renamed
    end = wait_end(launcher, 8, wait_for)
    assert (end.outcome, end.exit_code) == ("completed", 0)
    assert (first_out.read_text(), second_out.read_text()) == ("first\n", "second\n")
    jobdir = jobs_dir / "8"
    after = _inodes(jobdir)
    for name in ("spec.json", "supervisor.json", "status.json", RESERVE, "supervisor.lock"):
        assert after[name] == before[name], name  # the last run's files, written anew
    assert json.loads((jobdir / "spec.json").read_text())["job_id"] == 8
    assert json.loads((jobdir / "status.json").read_text())["exit_code"] == 0
    assert launcher.run_of(8) == 0 and launcher.run_of(7) is None
    assert set(os.listdir(jobdir)) == {"spec.json", "supervisor.json", "status.json", RESERVE,
                                       "supervisor.lock", "supervisor.log", "script"}
