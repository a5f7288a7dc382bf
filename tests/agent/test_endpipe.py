"""The pipe on which supervisors tell the agent of their jobs' ends
(gpusched.agent.endpipe)."""

from __future__ import annotations

import fcntl
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpusched.agent.endpipe import EndPipe, tell
from gpusched.agent.spawn import SupervisorSpawner

MakeJob = Callable[..., Path]
WaitFor = Callable[..., Any]


def test_take_gives_whole_ids_and_keeps_a_line_cut_short() -> None:
    pipe = EndPipe()
    try:
        assert pipe.take() == []
        os.write(pipe.write_fd, b"12\n3")
        assert pipe.take() == [12]
        os.write(pipe.write_fd, b"4\nnot-an-id\n-5\n" + b"9" * 30 + b"\n6\n")
        assert pipe.take() == [34, 6]  # the rest is no job id
    finally:
        pipe.close()


def test_telling_never_blocks_nor_fails() -> None:
    pipe = EndPipe()
    try:
        while True:  # fill it
            try:
                os.write(pipe.write_fd, b"1\n" * 1024)
            except BlockingIOError:
                break
        tell(pipe.write_fd, 7)  # full: dropped, the supervisor's exit tells instead
        tell(None, 7)
        tell(pipe.write_fd, "7")
    finally:
        pipe.close()
    reader, writer = os.pipe()
    os.close(reader)
    tell(writer, 7)  # the agent gone
    os.close(writer)


def test_a_spawned_supervisor_tells_once_status_is_written_and_its_job_never_holds_the_pipe(
        make_job: MakeJob, work_dir: Path, wait_for: WaitFor) -> None:
    jobdir = make_job('for fd in /proc/$$/fd/*; do readlink "$fd"; done; true')
    spawner = SupervisorSpawner(sys.executable, work_dir / "spawner.log")
    pipe = EndPipe()
    lock = os.open(jobdir / "supervisor.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        spawner.spawn(jobdir, lock, pipe.write_fd)
        told: list[int] = []

        def taken() -> list[int]:
            told.extend(pipe.take())
            return told

        wait_for(taken, "the supervisor to tell")
        assert told == [1]
        assert json.loads((jobdir / "status.json").read_text())["outcome"] == "completed"
        links = Path(json.loads((jobdir / "spec.json").read_text())["stdout"]).read_text()
        assert f"pipe:[{os.fstat(pipe.write_fd).st_ino}]" not in links.split()
        assert "supervisor.lock" not in links
    finally:
        os.close(lock)
        spawner.close()
        pipe.close()
