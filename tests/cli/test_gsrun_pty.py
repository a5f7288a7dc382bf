"""gsrun --pty: one task only, its terminal the task's input and output; under a real
local pseudo-terminal gsrun puts it in raw mode (keys, Ctrl-C included, go to the task
as typed), sends its window size at the start and on SIGWINCH, shows the task's bytes
as they come, exits with the task's status and leaves the terminal as it found it, on
a normal end and on a signal that kills it. Against the stand-in step side of
tests/cli/stepside.py; the real nodes are in tests/e2e/test_step_pty.py."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.cli import gsrun
from gpusched.cli.gsrunargs import parse_args
from gpusched.messages import stepio
from gpusched.messages.steps import StepRequest
from tests.cli.stepside import FakeController, FakeNode, created

BIN = Path(sys.executable).parent
IO = {"host": "127.0.0.1", "port": 4000, "token": "ab" * 32}


@pytest.mark.parametrize("argv, message", [
    (["--pty", "-n2", "bash"], "--pty runs one task (got 2)"),
    (["--pty", "-N", "3", "bash"], "--pty runs one task (got 3)"),
    (["--pty", "--ntasks-per-node=2", "bash"], "--pty runs one task (got 2)"),
    (["--pty", "-o", "out.txt", "bash"], "--pty: the terminal is the task's input and "
                                         "output; -o, -e and -i do not apply"),
    (["--pty", "-i", "none", "bash"], "-o, -e and -i do not apply"),
])
def test_more_than_one_task_or_files_with_pty_are_refused(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert gsrun.main(argv, {"SLURM_JOB_ID": "7"}) == 2
    err = capsys.readouterr().err
    assert err.startswith("gsrun: error: --pty") and err.endswith(f"{message}\n")
    assert err.count("\n") == 1


def test_a_pty_request_keeps_the_terminals_kind() -> None:
    args = parse_args(["--pty", "--export=NONE", "-N1", "-n1", "bash"])
    body = StepRequest.parse(gsrun.step_request(args, {"TERM": "xterm-256color", "A": "1"},
                                                IO, cwd="/w"))
    assert body.pty and body.environment == {"TERM": "xterm-256color"}
    assert (body.nodes, body.ntasks) == (1, 1)
    plain = parse_args(["--export=NONE", "bash"])
    assert StepRequest.parse(gsrun.step_request(plain, {"TERM": "xterm"}, IO, cwd="/w")
                             ).environment == {}


@pytest.fixture
def side_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="gsrun-pty-"))
    yield root
    for path in root.iterdir():
        path.unlink()
    root.rmdir()


class Node:
    """Task 0's node, served from a thread once gsrun asks for the step."""

    def __init__(self) -> None:
        self.link: FakeNode | None = None
        self.ready = threading.Event()
        self.body: dict[str, Any] = {}

    def create(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.body = body
        self.link = FakeNode(body["io"]["host"], body["io"]["port"])
        self.link.hello(body["io"]["token"], 7, 0, 0, [0])
        self.ready.set()
        return 201, created(0, {"node1": [0]})

    def frames(self, kind: int) -> list[stepio.Frame]:
        assert self.link is not None
        return [f for f in self.link.received if f.kind == kind]

    def wait(self, kind: int, count: int = 1) -> list[stepio.Frame]:
        assert self.link is not None
        self.link.wait_for(lambda fs: sum(f.kind == kind for f in fs) >= count)
        return self.frames(kind)


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _read_until(fd: int, wanted: bytes, timeout: float = 10.0) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while wanted not in seen:
        left = deadline - time.monotonic()
        assert left > 0, seen
        if select.select([fd], [], [], left)[0]:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                break
    return seen


def _gsrun_on_terminal(socket_path: Path, slave: int,
                       argv: list[str]) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPUSCHED_CONTROLLERS", "GPUSCHED_CONFIG")}
    env.update(GPUSCHED_SOCKET=str(socket_path), SLURM_JOB_ID="7", TERM="vt100")

    def controlling_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # SIGWINCH comes from the kernel

    return subprocess.Popen([str(BIN / "gsrun"), *argv], env=env, stdin=slave,
                            stdout=slave, stderr=slave, start_new_session=True,
                            preexec_fn=controlling_terminal)


def test_the_terminal_is_raw_passes_keys_and_sizes_and_is_restored(side_dir: Path) -> None:
    master, slave = os.openpty()
    _set_size(master, 30, 100)
    before = termios.tcgetattr(slave)
    node = Node()
    controller = FakeController(side_dir / "c.sock", node.create)
    proc = _gsrun_on_terminal(controller.path, slave, ["--pty", "bash"])
    try:
        assert node.ready.wait(20)
        sizes = node.wait(stepio.WINDOW)
        assert stepio.WINSIZE.unpack(sizes[0].payload) == (30, 100)
        assert node.body["pty"] and node.body["environment"]["TERM"] == "vt100"
        # Raw: a Ctrl-C byte and plain keys go to the task as typed, nothing echoed here.
        mode = termios.tcgetattr(slave)
        assert not mode[3] & (termios.ICANON | termios.ECHO | termios.ISIG), mode
        os.write(master, b"\x03ab")
        frames = node.wait(stepio.STDIN)
        while b"".join(f.payload for f in frames) != b"\x03ab":
            frames = node.wait(stepio.STDIN, len(frames) + 1)
        assert proc.poll() is None and node.frames(stepio.SIGNAL) == []
        # The window changes: the kernel's SIGWINCH makes gsrun send the new size.
        _set_size(master, 50, 132)
        sizes = node.wait(stepio.WINDOW, 2)
        assert stepio.WINSIZE.unpack(sizes[1].payload) == (50, 132)
        # The task's bytes show at once, no line held, no label.
        assert node.link is not None
        node.link.send(stepio.STDOUT, 0, b"prompt$ ")
        assert _read_until(master, b"prompt$ ").endswith(b"prompt$ ")
        node.link.exit(0, 7)
        node.link.close()
        assert proc.wait(30) == 7
        tail = _read_until(master, b"exit code 7\r\n")
        assert b"gsrun: error: node1: task 0: Exited with exit code 7\r\n" in tail
        assert termios.tcgetattr(slave) == before
    finally:
        if proc.poll() is None:
            proc.kill()
        controller.close()
        os.close(master)
        os.close(slave)


def test_a_signal_that_kills_gsrun_leaves_the_terminal_as_it_was(side_dir: Path) -> None:
    master, slave = os.openpty()
    before = termios.tcgetattr(slave)
    node = Node()
    controller = FakeController(side_dir / "c.sock", node.create)
    proc = _gsrun_on_terminal(controller.path, slave, ["--pty", "bash"])
    try:
        assert node.ready.wait(20)
        node.wait(stepio.WINDOW)
        assert termios.tcgetattr(slave) != before  # raw now
        proc.send_signal(signal.SIGUSR1)
        assert proc.wait(30) == -signal.SIGUSR1
        assert termios.tcgetattr(slave) == before
    finally:
        if proc.poll() is None:
            proc.kill()
        controller.close()
        os.close(master)
        os.close(slave)


def test_without_a_terminal_the_task_still_gets_its_input_and_output_as_it_comes(
        side_dir: Path) -> None:
    node = Node()
    controller = FakeController(side_dir / "c.sock", node.create)
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPUSCHED_CONTROLLERS", "GPUSCHED_CONFIG")}
    env.update(GPUSCHED_SOCKET=str(controller.path), SLURM_JOB_ID="7")
    proc = subprocess.Popen([str(BIN / "gsrun"), "-l", "--pty", "cat"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"typed\n")
        proc.stdin.close()
        assert node.ready.wait(20)
        assert node.link is not None
        stdin = node.link.wait_for(lambda fs: any(f.kind == stepio.STDIN and not f.payload
                                                  for f in fs))
        assert b"".join(f.payload for f in stdin if f.kind == stepio.STDIN) == b"typed\n"
        node.link.send(stepio.STDOUT, 0, b"partial")
        assert os.read(proc.stdout.fileno(), 100) == b"partial"  # not held, unlabelled
        node.link.exit(0, 0)
        node.link.close()
        assert proc.wait(30) == 0
        assert node.frames(stepio.WINDOW) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        controller.close()
