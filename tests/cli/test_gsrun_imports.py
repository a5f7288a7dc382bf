"""gsrun starts without the standard library's slower modules: its start is part of
every step's launch. Each case runs under ``python -S`` (so that nothing site or an
editable install's finder loads hides a module), with the repository first on sys.path,
and lists the modules loaded beyond the interpreter's own start.

A structural check (which modules get imported), not a timing one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Each costs gsrun's start milliseconds (typing, dataclasses, enum and re most).
FORBIDDEN = frozenset({
    "typing", "dataclasses", "enum", "re", "socket", "selectors", "signal", "hmac",
    "hashlib", "json", "collections", "inspect", "pathlib", "threading",
})
# What gsrun may load beyond the interpreter's start and gpusched's own modules: os
# (and what it stands on), gc, and C modules.
ALLOWED = frozenset({
    "__future__", "os", "os.path", "posixpath", "genericpath", "stat", "_stat",
    "_collections_abc", "gc", "errno", "_json", "_socket", "_signal", "_operator", "select",
    "struct", "_struct", "termios",
})

LEAVE = """
import os, sys
sys.path.insert(0, {root!r})
before = set(sys.modules)
real_exit = os._exit
def leave(code=0):
    sys.stdout.flush()
    sys.stderr.flush()
    os.write({fd}, " ".join(sorted(set(sys.modules) - before)).encode())
    real_exit(code)
os._exit = leave
"""


def run_started(code: str, env: dict[str, str] | None = None,
                ) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """Run ``code`` (after LEAVE) under ``python -S``; the modules it loaded beyond the
    interpreter's start (written to a pipe when it leaves), and the result."""
    read_end, write_end = os.pipe()
    environment = {**os.environ, "GPUSCHED_SOCKET": "/nonexistent/gpusched-test.sock",
                   **(env or {})}
    for name in ("GPUSCHED_CONTROLLERS", "GPUSCHED_CONFIG"):
        environment.pop(name, None)
    try:
        result = subprocess.run(
            [sys.executable, "-S", "-c", LEAVE.format(root=str(ROOT), fd=write_end) + code],
            capture_output=True, text=True, env=environment, timeout=60,
            pass_fds=(write_end,))
        os.close(write_end)
        write_end = -1
        with os.fdopen(read_end, "rb") as reader:
            read_end = -1
            loaded = set(reader.read().decode().split())
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
    return loaded, result


def outside(loaded: set[str]) -> list[str]:
    """What was loaded beyond gpusched and the allowed list."""
    return sorted(n for n in loaded if n.split(".")[0] != "gpusched" and n not in ALLOWED)


def test_gsrun_help_loads_only_the_allowed_list() -> None:
    loaded, result = run_started(
        "sys.argv = ['gsrun', '--help']\nfrom gpusched.cli.gsrun import entry\nentry()\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: gsrun [OPTIONS] COMMAND [ARGS]...")
    assert "gpusched.cli.gsrun" in loaded
    assert sorted(loaded & FORBIDDEN) == [] and outside(loaded) == []


@pytest.mark.parametrize("argv", [["true"], ["-N1", "-n2", "-l", "--export=NONE", "true"],
                                  ["--pty", "bash"]])
def test_a_step_request_loads_only_the_allowed_list(argv: list[str]) -> None:
    """Up to the step's request (here no controller answers, and gsrun says so in one
    line): arguments, the I/O socket, the request checked as the controller checks it."""
    loaded, result = run_started(
        f"sys.argv = ['gsrun', *{argv!r}]\nfrom gpusched.cli.gsrun import entry\nentry()\n",
        env={"SLURM_JOB_ID": "7"})
    assert result.returncode == 1
    assert result.stderr.startswith("gsrun: error: cannot reach the gpusched controller")
    assert result.stderr.count("\n") == 1 and result.stdout == ""
    assert {"gpusched.cli.stepio_server", "gpusched.client.api"} <= loaded
    assert sorted(loaded & FORBIDDEN) == [] and outside(loaded) == []


SERVE = """
from gpusched.cli import gsrun
from gpusched.cli.stepio_server import ServeOptions, StepIOServer, StepPlan
from gpusched.cli.stepoutput import ExitTally, OutputSink
from gpusched.cli.stepterminal import LocalTerminal
from gpusched.messages import stepio

server = StepIOServer("127.0.0.1")
plan = StepPlan(7, 3, ("n1",), {"n1": (0, 1)})
tally = ExitTally(plan.tasks)
primary, secondary = os.openpty()
terminal = LocalTerminal(secondary)
assert terminal.raw()
with gsrun.SignalForwarding() as signal_fd:
    if os.fork() == 0:  # the node: its modules are not the ones listed
        import _socket
        sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(stepio.hello(server.token, 7, 3, 0, [0, 1])
                     + stepio.encode(stepio.STDOUT, 0, b"zero\\n")
                     + stepio.encode(stepio.STDOUT, 1, b"one\\n")
                     + stepio.exit_frame(0, 0, None) + stepio.exit_frame(1, 3, None))
        sock.recv(1)  # gsrun closes at the end
        real_exit(0)  # not leave(): the node lists nothing
    server.serve(plan, OutputSink(sys.stdout.buffer, sys.stderr.buffer, True), tally,
                 ServeOptions(signal_fd=signal_fd, say=print, winsize=terminal.size))
terminal.restore()
server.close()
os.wait()
os._exit(tally.status())
"""


def test_serving_a_step_loads_only_the_allowed_list() -> None:
    """The I/O server serving a node's tasks, with gsrun's signals forwarded and a
    terminal in raw mode (--pty): the same short list."""
    loaded, result = run_started(SERVE)
    assert result.returncode == 3, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        "0: zero", "1: one", "gsrun: error: n1: task 1: Exited with exit code 3"]
    assert {"gpusched.cli.stepio_server", "gpusched.cli.stepterminal", "termios"} <= loaded
    assert sorted(loaded & FORBIDDEN) == [] and outside(loaded) == []


def test_a_token_no_utf8_can_carry_is_a_wrong_token() -> None:
    """The token is compared as bytes in constant time (no hmac): a lone surrogate in
    a HELLO's token is a wrong token, not a crash of gsrun's loop."""
    from gpusched.messages import stepio

    body = b'{"token": "\\ud800", "job_id": 7, "step_id": 3, "node_index": 0, "tasks": [0]}'
    with pytest.raises(stepio.FrameError, match="wrong token"):
        stepio.check_hello(stepio.Frame(stepio.HELLO, 0, body), "ab" * 32, 7, 3)
    right = stepio.Decoder().feed(stepio.hello("ab" * 32, 7, 3, 0, [0]))[0]
    assert stepio.check_hello(right, "ab" * 32, 7, 3) == stepio.Hello(7, 3, 0, (0,))


def test_the_step_requests_bounds_are_the_steps() -> None:
    """messages/steprequest.py keeps core.steps's bounds (whose dataclasses gsrun does
    not load): the same numbers, and StepRequest and StepCreated check with it."""
    from gpusched.core import steps as layout_rules
    from gpusched.messages import steprequest, steps

    assert steprequest.MAX_TASKS_PER_STEP == layout_rules.MAX_TASKS_PER_STEP
    assert steprequest.MAX_STEP_ID == layout_rules.MAX_STEP_ID
    io = {"host": "127.0.0.1", "port": 4000, "token": "ab" * 32}
    request = {"argv": ["hostname"], "work_dir": "/tmp", "io": io, "ntasks": 4}
    assert steps.StepRequest.parse(request).to_json() == steprequest.check_request(request)
    answer = {"step_id": 2, "node_names": ["n0"], "layout": {"n0": [0, 1]}, "ntasks": 2,
              "master_addr": "n0", "master_port": 29_600}
    assert steps.StepCreated(**steprequest.check_created(answer)).to_json() == answer
