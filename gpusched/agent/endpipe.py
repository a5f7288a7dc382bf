"""The pipe on which job supervisors tell their agent that a job has ended.

A supervisor forked by the agent's spawner holds the pipe's write end on TELL_FD. Once
its job's status.json is written it writes the job's id there, and only then makes the
file durable (two fsyncs, milliseconds on some disks) and exits: the agent reads the
status and reports the end meanwhile. A supervisor without the pipe (a fresh
interpreter, one adopted after an agent restart) is seen at its exit as before.
Standard library only: the supervisor imports it.
"""

from __future__ import annotations

import os

TELL_FD = 4  # where a supervisor forked by the spawner holds the pipe's write end


class EndPipe:
    """The agent's end of the pipe, and the write end it hands each supervisor."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()  # close-on-exec
        # Non-blocking for every supervisor too (one open file): a full pipe never holds
        # up a job's end, which is then seen at its supervisor's exit.
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)
        self._partial = b""

    def take(self) -> list[int]:
        """The ids of the jobs told since the last call."""
        lines = (self._partial + read_ready(self.read_fd)).split(b"\n")
        self._partial = lines.pop()[-64:]  # a line cut by the read; ids are short
        return [int(line) for line in lines if line.isdigit() and len(line) < 20]

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)


def read_ready(fd: int) -> bytes:
    """What a non-blocking ``fd`` holds now (b"" when nothing, or at its end)."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def tell(fd: int | None, job_id: object) -> None:
    """In a supervisor: tell the agent on ``fd`` that ``job_id``'s status.json is
    written. One short write (atomic on a pipe); when the agent is gone or its pipe is
    full, nothing: it sees the supervisor's exit."""
    if fd is None or not isinstance(job_id, int) or isinstance(job_id, bool):
        return
    try:
        os.write(fd, b"%d\n" % job_id)
    except OSError:
        pass
