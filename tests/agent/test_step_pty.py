"""A job step with a pseudo-terminal (``gsrun --pty``) on its node: the real step
supervisor, started by the agent's StepRunner, runs the task on a new terminal that
is its controlling terminal; gsrun's side is a real socket that types into it, resizes
it and reads the screen."""

from __future__ import annotations

import pwd
import secrets
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.agent.steps import StepRunner
from gpusched.agent.stepspec import step_spec
from gpusched.messages import stepio
from gpusched.messages.steps import StepIO, StepLaunch, StepTask


class Terminal:
    """gsrun's I/O socket for a one-task step: what task 0 wrote, and its end."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.token = secrets.token_hex(32)
        self.conn: socket.socket | None = None
        self.screen = bytearray()
        self.exits: list[tuple[int | None, int | None]] = []
        self.kinds: list[int] = []
        self.connected = threading.Event()
        self.closed = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        self.conn = conn
        self.connected.set()
        decoder = stepio.Decoder(stepio.FROM_NODE)
        while data := _recv(conn):
            for frame in decoder.feed(data):
                with self._lock:
                    self.kinds.append(frame.kind)
                    if frame.kind in (stepio.STDOUT, stepio.STDERR):
                        self.screen += frame.payload
                    elif frame.kind == stepio.EXIT:
                        self.exits.append(stepio.check_exit(frame))
        self.closed.set()

    def io(self) -> StepIO:
        return StepIO("127.0.0.1", self.listener.getsockname()[1], self.token)

    def send(self, kind: int, payload: bytes) -> None:
        assert self.connected.wait(10) and self.conn is not None
        self.conn.sendall(stepio.encode(kind, 0, payload))

    def type(self, text: bytes) -> None:
        self.send(stepio.STDIN, text)

    def text(self) -> str:
        with self._lock:
            return self.screen.decode(errors="replace")

    def close(self) -> None:
        self.listener.close()
        if self.conn is not None:
            try:
                self.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.conn.close()


def _recv(conn: socket.socket) -> bytes:
    try:
        return conn.recv(65536)
    except OSError:
        return b""


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    fake = Terminal()
    yield fake
    fake.close()


@pytest.fixture
def runner() -> Iterator[StepRunner]:
    path = Path(tempfile.mkdtemp(prefix="gpusched-steppty-", dir="/tmp"))
    runner = StepRunner(path / "steps", "node-a")
    yield runner
    for job_id, step_id in runner.running():
        runner.cancel(job_id, step_id)
    runner.close()
    shutil.rmtree(path, ignore_errors=True)


def pty_launch(io: StepIO, argv: list[str], work_dir: str, user: pwd.struct_passwd | None
               = None, environment: dict[str, str] | None = None) -> StepLaunch:
    who = user or pwd.getpwuid(0)
    return StepLaunch(
        job_id=51, run=0, step_id=2, node="node-a", node_index=0, name="bash",
        job_name="shell", user=who.pw_name, uid=who.pw_uid, gid=who.pw_gid,
        argv=tuple(argv), work_dir=work_dir, tasks=(StepTask(0, 0, ()),), ntasks=1,
        node_names=("node-a",), tasks_per_node=(1,), master_addr="127.0.0.1",
        master_port=29600, io=io, pty=True,
        environment=environment or {"PATH": "/usr/bin:/bin", "TERM": "xterm"})


def start(runner: StepRunner, launch: StepLaunch) -> None:
    assert runner.start(launch, step_spec(launch, kill_grace=5.0, min_uid=0))


def ended(runner: StepRunner, wait_for: Callable[..., Any], terminal: Terminal,
          timeout: float = 15.0) -> Any:
    def find() -> Any:
        return next((d.end for d in runner.wait_ended(0.05)
                     if (d.job_id, d.step_id) == (51, 2)), None)
    end = wait_for(find, "the step to end", timeout=timeout, seen=terminal.text)
    wait_for(terminal.closed.is_set, "the node to close its connection")
    return end


def test_the_task_runs_on_its_own_controlling_terminal(
        runner: StepRunner, terminal: Terminal, user_dir: Path,
        test_user: pwd.struct_passwd, wait_for: Callable[..., Any]) -> None:
    script = ("tty; stty size; test -t 0 && test -t 1 && test -t 2 && echo all-three; "
              "stat -c 'owner=%u mode=%a' $(tty); echo TERM=$TERM; "
              "ps -o tty= -p $$ | sed 's/^/ctty=/'; echo err-line >&2; exit 5")
    start(runner, pty_launch(terminal.io(), ["/bin/sh", "-c", script], str(user_dir),
                             test_user))
    end = ended(runner, wait_for, terminal)
    lines = terminal.text().split("\r\n")  # the terminal writes newlines as CR LF
    assert lines[0].startswith("/dev/pts/"), lines
    pts = lines[0]
    assert lines[1:5] == ["24 80", "all-three", f"owner={test_user.pw_uid} mode=620",
                          "TERM=xterm"], lines
    assert lines[5] == "ctty=" + pts.removeprefix("/dev/"), lines
    assert lines[6] == "err-line", lines  # stderr is the terminal too
    assert terminal.exits == [(5, None)]
    assert stepio.STDERR not in terminal.kinds
    assert (end.outcome, end.exit_code, end.tasks) == ("failed", 5, ((0, 5, None),))


def test_window_size_ctrl_c_and_exit_status_pass_through_a_shell(
        runner: StepRunner, terminal: Terminal, user_dir: Path,
        test_user: pwd.struct_passwd, wait_for: Callable[..., Any]) -> None:
    env = {"PATH": "/usr/bin:/bin", "TERM": "xterm", "PS1": "prompt> "}
    start(runner, pty_launch(terminal.io(), ["bash", "--norc", "--noprofile", "-i"],
                             str(user_dir), test_user, env))
    wait_for(lambda: "prompt> " in terminal.text(), "the shell's prompt",
             seen=terminal.text)
    terminal.send(stepio.WINDOW, stepio.WINSIZE.pack(41, 133))
    terminal.type(b"stty size; echo $SLURM_PROCID-$((6*7))\r")
    wait_for(lambda: "41 133\r\n0-42\r\n" in terminal.text(), "stty to see the new size",
             seen=terminal.text)
    # A Ctrl-C byte interrupts the foreground command, not the shell.
    terminal.type(b"echo sleeping; sleep 100; echo not-interrupted\r")
    wait_for(lambda: "sleeping\r\n" in terminal.text(), "the sleep to start",
             seen=terminal.text)
    time.sleep(0.2)
    typed = time.monotonic()
    terminal.type(b"\x03")
    terminal.type(b"echo back-$((6*7))\r")
    wait_for(lambda: "back-42\r\n" in terminal.text(), "the shell to come back",
             timeout=10, seen=terminal.text)
    assert time.monotonic() - typed < 5
    assert "not-interrupted" not in terminal.text().replace("echo not-interrupted", "")
    assert terminal.exits == []
    terminal.type(b"exit 7\r")
    end = ended(runner, wait_for, terminal)
    assert terminal.exits == [(7, None)]
    assert (end.outcome, end.exit_code, end.signal) == ("failed", 7, None)


def test_the_end_of_gsruns_input_is_the_terminals_end_of_file(
        runner: StepRunner, terminal: Terminal, work_dir: Path,
        wait_for: Callable[..., Any]) -> None:
    start(runner, pty_launch(terminal.io(), ["cat"], str(work_dir)))
    terminal.type(b"one line\n")
    wait_for(lambda: terminal.text().count("one line\r\n") == 2, "the echo and cat's copy",
             seen=terminal.text)
    terminal.type(b"")
    end = ended(runner, wait_for, terminal)
    assert terminal.exits == [(0, None)] and end.outcome == "completed"


def test_cancelling_hangs_up_the_shell_at_once(
        runner: StepRunner, terminal: Terminal, work_dir: Path,
        wait_for: Callable[..., Any]) -> None:
    env = {"PATH": "/usr/bin:/bin", "PS1": "prompt> "}
    start(runner, pty_launch(terminal.io(), ["bash", "--norc", "--noprofile", "-i"],
                             str(work_dir), environment=env))
    wait_for(lambda: "prompt> " in terminal.text(), "the shell's prompt",
             seen=terminal.text)
    cancelled = time.monotonic()
    assert runner.cancel(51, 2)
    end = ended(runner, wait_for, terminal)
    # An interactive shell ignores SIGTERM: the hangup ends it, well before the kill
    # grace (5 s) would have.
    assert time.monotonic() - cancelled < 4
    assert terminal.exits == [(None, int(signal.SIGHUP))]
    assert end.outcome == "cancelled"

