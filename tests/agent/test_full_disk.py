"""A node's state disk filling up: a job that ran still has how it ended recorded, and a
job that could not be prepared is reported as never started (so it goes back to the
queue), with real supervisors on a small tmpfs of their own."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusched.agent.jobends import node_fault
from gpusched.agent.jobfiles import RESERVE, RESERVE_BYTES, write_job_file
from gpusched.agent.launcher import Launcher
from tests.agent.conftest import kill_leftovers
from tests.agent.test_launcher import WaitFor, start, supervisor_info, wait_end

DISK = 2 * 1024 * 1024  # the tmpfs: room for a few job directories


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A root-owned 0711 directory on a tmpfs of DISK bytes, unmounted afterwards."""
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="gpusched-disk-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK},mode=0711", "tmpfs",
                    str(path)], check=True, capture_output=True)
    try:
        yield path
    finally:
        for entry in path.iterdir():  # fillers and probes; job directories stay
            if not entry.is_dir():
                entry.unlink()
        kill_leftovers(path)
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)
        os.rmdir(path)


def fill(directory: Path, leave: int = 0) -> Path:
    """Fill the file system of ``directory`` with one file, then give ``leave`` bytes
    back; the file."""
    filler = directory / "filler"
    chunk = bytes(64 * 1024)
    with open(filler, "wb", buffering=0) as f:
        for _ in range(DISK // len(chunk) + 1):  # bounded: the disk holds fewer
            try:
                f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        else:
            pytest.fail("the disk never filled")
    size = filler.stat().st_size
    os.truncate(filler, max(0, size - leave))
    return filler


def test_a_job_ending_on_a_full_disk_still_records_its_exit_status(
        small_disk: Path, work_dir: Path, wait_for: WaitFor) -> None:
    launcher = Launcher(small_disk)
    try:
        start(launcher, work_dir, f"while [ ! -e {work_dir}/go ]; do sleep 0.02; done; exit 3",
              job_id=5)
        assert (small_disk / "5" / RESERVE).stat().st_size == RESERVE_BYTES
        supervisor_info(small_disk / "5", wait_for)  # the job runs
        filler = fill(small_disk)
        with pytest.raises(OSError):  # truly full: nothing more fits
            (small_disk / "probe").write_bytes(b"x" * 8192)
        (work_dir / "go").touch()
        end = wait_end(launcher, 5, wait_for)
        assert (end.outcome, end.exit_code) == ("failed", 3)
        assert not (small_disk / "5" / RESERVE).exists()  # given up for status.json
        filler.unlink()
    finally:
        launcher.close()


def test_a_job_the_full_disk_cannot_prepare_leaves_nothing_and_runs_once_there_is_room(
        small_disk: Path, work_dir: Path, wait_for: WaitFor) -> None:
    launcher = Launcher(small_disk)
    try:
        # Room for a status but not for the reserve, then no room at all: the launch
        # raises the disk's error (the agent reports the run as never started) and
        # leaves no directory behind that a later launch of the job would stumble on.
        for leave in (RESERVE_BYTES // 4, 0):
            filler = fill(small_disk, leave=leave)
            with pytest.raises(OSError) as raised:
                start(launcher, work_dir, f"touch {work_dir}/ran", job_id=6)
            assert node_fault(raised.value) and raised.value.errno == errno.ENOSPC
            assert not (small_disk / "6").exists() and not (work_dir / "ran").exists()
        filler.unlink()
        start(launcher, work_dir, f"touch {work_dir}/ran", job_id=6)  # room again
        assert wait_end(launcher, 6, wait_for).outcome == "completed"
        assert (work_dir / "ran").exists()
    finally:
        launcher.close()


def test_a_directory_a_launch_left_without_its_spec_is_removed_on_adopt(
        small_disk: Path) -> None:
    (small_disk / "12").mkdir()  # the agent died between mkdir and the spec
    (small_disk / "12" / "script").write_text("#!/bin/sh\ntrue\n")
    launcher = Launcher(small_disk)
    try:
        assert launcher.adopt() == []
        assert not (small_disk / "12").exists()
        assert launcher.wait_ended(timeout=0.1) == []  # nothing ran: nothing to report
    finally:
        launcher.close()


def test_a_job_file_waits_for_room_within_its_patience(small_disk: Path) -> None:
    jobdir = small_disk / "9"
    jobdir.mkdir()
    filler = fill(small_disk)
    with pytest.raises(OSError) as raised:  # no reserve, no patience
        write_job_file(str(jobdir / "status.json"), {"outcome": "completed"}, patience=0.0)
    assert raised.value.errno == errno.ENOSPC
    assert list(jobdir.iterdir()) == []  # no temporary file left behind
    filler.unlink()
    write_job_file(str(jobdir / "status.json"), {"outcome": "completed"}, patience=0.0)
    assert (jobdir / "status.json").read_text() == '{"outcome":"completed"}'


def test_a_lost_supervisor_on_a_full_disk_is_recorded_once_there_is_room(
        small_disk: Path, work_dir: Path, wait_for: WaitFor) -> None:
    launcher = Launcher(small_disk)
    try:
        start(launcher, work_dir, "sleep 300", job_id=13)
        info = supervisor_info(small_disk / "13", wait_for)
        filler = fill(small_disk)
        (small_disk / "13" / RESERVE).unlink(missing_ok=True)  # not even the reserve
        filler.unlink()
        filler = fill(small_disk)
        os.kill(info["supervisor_pid"], signal.SIGKILL)  # its end cannot be written now
        assert launcher.wait_ended(timeout=1.0) == []
        assert not (small_disk / "13" / "status.json").exists()
        filler.unlink()  # room again: the next look records it
        end = wait_end(launcher, 13, wait_for)
        assert end.outcome == "failed" and end.error == "job supervisor lost"
    finally:
        launcher.close()
