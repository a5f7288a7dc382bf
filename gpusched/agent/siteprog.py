"""Running a site's program on a node: the prolog, the epilog, the health check.

Stdlib only: the per-job supervisor runs the prolog and epilog. A program runs as the
caller (root on a node), in a session of its own, with the environment it is given,
standard input from /dev/null and its working directory at ``/``. Its output is read
only to find the reason it gives; a program that runs past its timeout is killed with
everything it started in its session.
"""

from __future__ import annotations

import os
import select
import signal
import time

MAX_OUTPUT = 4096  # bytes of output kept to find the first line
MAX_REASON = 200  # characters of the reason a failing program gives
MAX_SHOWN_PATH = 100  # characters of the program's path shown in a reason
KILLED_WAIT = 5.0  # seconds to wait for a program killed past its timeout to go


def first_line(output: bytes) -> str:
    """The first non-blank line of ``output``, as printable text of at most MAX_REASON
    characters (control characters become spaces)."""
    for raw in output.splitlines():
        line = "".join(c if c.isprintable() else " " for c in raw.decode("utf-8", "replace"))
        line = " ".join(line.split())
        if line:
            return line if len(line) <= MAX_REASON else line[:MAX_REASON - 3] + "..."
    return ""


def run_site_program(path: str, env: dict[str, str], timeout: float,
                     what: str = "program") -> str | None:
    """Run ``path``; None when it exits 0 within ``timeout`` seconds, else why not: its
    first line of output, or how it failed (``what`` names it in the message)."""
    # Imported here: subprocess brings threading, whose fork handlers would cost every
    # job supervisor forked from a spawner that had imported it (gpusched.agent.spawner).
    import subprocess

    try:
        proc = subprocess.Popen(
            [path], env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    except OSError as exc:
        return f"{_named(what, path)} cannot run: {exc.strerror or exc}"[:MAX_REASON]
    assert proc.stdout is not None
    output = bytearray()
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    deadline = time.monotonic() + timeout
    status: int | None = None
    try:
        # Until it exits: a child it left running may hold the pipe open for ever.
        while status is None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            select.select([fd], [], [], min(left, 0.05))
            _read_into(fd, output)
            status = proc.poll()
        _read_into(fd, output)
    finally:
        if status is None:
            _kill_session(proc.pid)
            try:
                proc.wait(KILLED_WAIT)
            except subprocess.TimeoutExpired:
                # Asleep in the kernel (a hung file system): it dies when it wakes, and
                # is reaped then (subprocess keeps it); the caller must not hang on it.
                pass
        proc.stdout.close()
    if status is None:
        return f"{_named(what, path)} timed out after {timeout:g} s"
    if status == 0:
        return None
    line = first_line(bytes(output))
    if line:
        return line
    if status < 0:
        return f"{_named(what, path)} killed by signal {-status}"
    return f"{_named(what, path)} exited with status {status}"


def _named(what: str, path: str) -> str:
    """``what`` and the program's path, printable and short enough that the reason it
    starts stays within MAX_REASON (a long path keeps its end, which names the program)."""
    shown = "".join(c if c.isprintable() else "?" for c in path)
    if len(shown) > MAX_SHOWN_PATH:
        shown = "..." + shown[-(MAX_SHOWN_PATH - 3):]
    return f"{what[:40]} {shown}"


def _read_into(fd: int, output: bytearray) -> None:
    """Read what the pipe holds now, keeping the first MAX_OUTPUT bytes."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not chunk:
            return
        if len(output) < MAX_OUTPUT:
            output += chunk[:MAX_OUTPUT - len(output)]


def _kill_session(pid: int) -> None:
    """Kill the program's process group (its session's leader is the program)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
