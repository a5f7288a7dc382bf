"""gsrun: its output and exit status rules, its I/O socket, and the whole
command against a stand-in step side of real sockets speaking stepio frames
(tests/cli/stepside.py); its flags are in tests/cli/test_gsrun_args.py, the real
controller and agents in tests/e2e/test_steps.py."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.cli import gsrun, stepio_server
from gpusched.cli.stepio_server import ServeOptions, StepIOServer, StepPlan, StepState
from gpusched.cli.stepoutput import ExitTally, OutputSink
from gpusched.messages import stepio
from tests.cli.stepside import FakeController, FakeNode, created
from tests.e2e.cluster import wait_for

BIN = Path(sys.executable).parent
IO = {"host": "127.0.0.1", "port": 4000, "token": "ab" * 32}


# -- output and exit status -----------------------------------------------------------
def test_labels_hold_partial_lines_per_task_and_stream() -> None:
    out, err = io.BytesIO(), io.BytesIO()
    sink = OutputSink(out, err, label=True)
    sink.write(0, 0, b"hel")
    sink.write(0, 1, b"one\ntw")
    sink.write(0, 0, b"lo\nworld\n")
    sink.write(1, 0, b"oops\n")
    sink.task_ended(1)
    assert out.getvalue() == b"1: one\n0: hello\n0: world\n1: tw\n"
    assert err.getvalue() == b"0: oops\n"
    # Without labels too, the lines of tasks do not mix; -u shows bytes as they come.
    plain_out = io.BytesIO()
    plain = OutputSink(plain_out, io.BytesIO(), label=False)
    plain.write(0, 3, b"three ")
    plain.write(0, 2, b"two\nand")
    plain.write(0, 3, b"more\n")
    plain.task_ended(2)
    assert plain_out.getvalue() == b"two\nthree more\nand"
    raw_out = io.BytesIO()
    raw = OutputSink(raw_out, io.BytesIO(), label=False, unbuffered=True)
    raw.write(0, 3, b"as ")
    raw.write(0, 2, b"it comes")
    assert raw_out.getvalue() == b"as it comes"


def test_exit_status_is_the_worst_task() -> None:
    tally = ExitTally([0, 1, 2])
    assert not tally.record(0, 0, None) and not tally.record(1, 3, None)
    assert not tally.complete and tally.missing == [2]
    tally.record(2, None, 9)
    assert tally.complete and tally.status() == 137
    lost = ExitTally([0, 1])
    lost.record(0, 0, None)
    lost.lost(1)
    assert lost.status() == 1
    assert ExitTally([0]).status() == 1  # an end that never came counts as lost


def test_kill_on_bad_exit_keeps_the_bad_tasks_status() -> None:
    tally = ExitTally([0, 1, 2], kill_on_bad_exit=True)
    assert not tally.record(0, 0, None)
    assert tally.record(2, 3, None)  # the first bad end: kill the step
    assert not tally.record(1, None, 15)  # ended by the kill: not counted
    assert tally.status() == 3
    without = ExitTally([0, 1])
    assert not without.record(0, 3, None)  # without -K nothing is killed
    without.record(1, None, 15)
    assert without.status() == 143


# -- the I/O socket --------------------------------------------------------------------
class Served:
    """StepIOServer.serve running in a thread on a step of ``layout``."""

    def __init__(self, layout: dict[str, list[int]], label: bool = False,
                 kill_on_bad_exit: bool = False, stdin_fd: int | None = None,
                 poll: Any = None) -> None:
        self.server = StepIOServer("127.0.0.1")
        self.plan = StepPlan(7, 3, tuple(layout), {k: tuple(v) for k, v in layout.items()})
        self.out, self.err = io.BytesIO(), io.BytesIO()
        self.said: list[str] = []
        self.bad: list[int] = []
        self.tally = ExitTally(self.plan.tasks, kill_on_bad_exit)
        self.signal_r, self.signal_w = socket.socketpair()
        self.signal_r.setblocking(False)
        options = ServeOptions(stdin_fd=stdin_fd, signal_fd=self.signal_r.fileno(),
                               on_bad_exit=self.bad.append, poll=poll, say=self.said.append)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(options,), daemon=True)
        self.thread.start()

    def _run(self, options: ServeOptions) -> None:
        try:
            self.server.serve(self.plan, OutputSink(self.out, self.err, False), self.tally,
                              options)
        except BaseException as exc:  # shown by finish()
            self.error = exc

    def node(self, index: int, token: str | None = None) -> FakeNode:
        node = FakeNode("127.0.0.1", self.server.port)
        name = self.plan.node_names[index]
        node.hello(token or self.server.token, 7, 3, index, list(self.plan.layout[name]))
        return node

    def finish(self, timeout: float = 15.0) -> int:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "serve() did not return"
        assert self.error is None, self.error
        self.server.close()
        return self.tally.status()


def test_two_nodes_stream_output_and_their_ends() -> None:
    served = Served({"n1": [0, 1], "n2": [2]})
    a, b = served.node(0), served.node(1)
    a.send(stepio.STDOUT, 0, b"zero\n")
    b.send(stepio.STDERR, 2, b"two err\n")
    a.send(stepio.STDOUT, 1, b"one\n")
    a.exit(0, 0)
    a.exit(1, 0)
    b.exit(2, 4)
    a.close()
    b.close()
    assert served.finish() == 4
    assert sorted(served.out.getvalue().splitlines()) == [b"one", b"zero"]
    assert served.err.getvalue() == b"two err\n"
    assert served.said == ["gsrun: error: n2: task 2: Exited with exit code 4"]


def test_a_wrong_token_a_second_hello_and_junk_are_closed() -> None:
    served = Served({"n1": [0], "n2": [1]})
    liar = served.node(0, token="cd" * 32)
    assert liar.closed_by_peer()
    a = served.node(0)
    again = served.node(0)  # the node is already connected: a copy is refused
    assert again.closed_by_peer()
    other = served.node(1)
    other.send(stepio.STDOUT, 0, b"not my task")  # task 0 runs on n1
    assert other.closed_by_peer()  # ... so the connection goes, and task 1 is lost
    a.send(stepio.STDOUT, 0, b"ok\n")
    a.exit(0, 0)
    a.close()
    assert served.finish() == 1
    assert served.out.getvalue() == b"ok\n"
    assert served.said == ["gsrun: error: n2: task 1: lost (no exit status)"]


def test_silence_after_connecting_and_oversized_frames_are_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stepio_server, "HELLO_TIMEOUT", 0.3)
    served = Served({"n1": [0]})
    silent = FakeNode("127.0.0.1", served.server.port)
    assert silent.closed_by_peer(timeout=5)
    big = FakeNode("127.0.0.1", served.server.port)
    big.sock.sendall(stepio.HEADER.pack(stepio.HELLO, 0, stepio.MAX_PAYLOAD + 1))
    assert big.closed_by_peer(timeout=5)
    a = served.node(0)
    a.exit(0, 0)
    a.close()
    assert served.finish() == 0


def test_stdin_goes_to_task_0_and_signals_to_every_node() -> None:
    read_end, write_end = os.pipe()
    served = Served({"n1": [0], "n2": [1]}, stdin_fd=read_end)
    a, b = served.node(0), served.node(1)
    os.write(write_end, b"line one\n")
    a.wait_for(lambda frames: any(f.kind == stepio.STDIN and f.payload for f in frames))
    os.close(write_end)
    frames = a.wait_for(lambda frames: any(f.kind == stepio.STDIN and not f.payload
                                           for f in frames))
    assert b"".join(f.payload for f in frames if f.kind == stepio.STDIN) == b"line one\n"
    assert all(f.task == 0 for f in frames)
    served.signal_w.send(bytes([signal.SIGINT]))
    for node in (a, b):
        got = node.wait_for(lambda frames: any(f.kind == stepio.SIGNAL for f in frames))
        assert [f.payload for f in got if f.kind == stepio.SIGNAL] == [b"2"]
    assert not any(f.kind == stepio.STDIN for f in b.received)
    a.exit(0, None, 2)
    b.exit(1, 0)
    a.close()
    b.close()
    assert served.finish() == 130
    os.close(read_end)


def test_kill_on_bad_exit_asks_once_and_keeps_the_bad_status() -> None:
    served = Served({"n1": [0, 1], "n2": [2, 3]}, kill_on_bad_exit=True)
    a, b = served.node(0), served.node(1)
    a.exit(1, 5)
    # The kill comes after gsrun heard the bad end (it asks the controller): the ends
    # it causes must not reach gsrun before that end, on the other node's socket.
    wait_for(lambda: served.bad, timeout=10, what="gsrun to hear the bad end")
    assert served.bad == [1]
    a.exit(0, None, 15)
    b.exit(2, None, 15)
    b.exit(3, 6)  # a real exit code after the kill still counts
    a.close()
    b.close()
    assert served.finish() == 6
    assert served.bad == [1]


def test_a_node_that_never_connects_ends_with_the_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stepio_server, "POLL_MISSING", 0.05)
    monkeypatch.setattr(stepio_server, "FINAL_GRACE", 0.2)
    states = [StepState("RUNNING"), StepState("FAILED", "cannot reach gsrun at 10.0.0.9")]
    served = Served({"n1": [0], "n2": [1], "n3": [2]},
                    poll=lambda: states.pop(0) if len(states) > 1 else states[0])
    a = served.node(0)
    a.send(stepio.ERROR, 0, b"node said\x1b[2J this")
    a.exit(0, 0)
    a.close()
    silent = served.node(2)  # connected, then its host went quiet
    assert served.finish() == 1
    assert served.said == [
        "gsrun: error: node n1: node said\\x1b[2J this",
        "gsrun: error: n3: task 2: lost (no exit status)",
        "gsrun: error: node n2: its tasks did not start: cannot reach gsrun at 10.0.0.9"]
    assert silent.closed_by_peer()


# -- the whole command against the stand-in step side ---------------------------------
@pytest.fixture
def side_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="gsrun-"))
    yield root
    for path in root.iterdir():
        path.unlink()
    root.rmdir()


def gsrun_process(socket_path: Path, argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPUSCHED_CONTROLLERS", "GPUSCHED_CONFIG")}
    env.update(GPUSCHED_SOCKET=str(socket_path), SLURM_JOB_ID="7", MY_VAR="mine")
    return subprocess.Popen([str(BIN / "gsrun"), *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kw)


def test_gsrun_runs_a_step_and_exits_with_the_worst_task(side_dir: Path) -> None:
    nodes: list[threading.Thread] = []

    def run_nodes(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        def node(index: int, tasks: list[int]) -> None:
            link = FakeNode(body["io"]["host"], body["io"]["port"])
            link.hello(body["io"]["token"], 7, 0, index, tasks)
            for task in tasks:
                link.send(stepio.STDOUT, task, f"rank {task} of 3\n".encode())
                link.exit(task, 0 if task != 2 else 9)
            link.close()
        nodes.extend(threading.Thread(target=node, args=a) for a in ((0, [0, 1]), (1, [2])))
        for thread in nodes:
            thread.start()
        return 201, created(0, {"node1": [0, 1], "node2": [2]})

    controller = FakeController(side_dir / "c.sock", run_nodes)
    proc = gsrun_process(controller.path, ["-l", "-N2", "-n3", "python3", "x.py"],
                         stdin=subprocess.DEVNULL)
    out, err = proc.communicate(timeout=30)
    controller.close()
    assert proc.returncode == 9, err
    assert sorted(out.decode().splitlines()) == ["0: rank 0 of 3", "1: rank 1 of 3",
                                                 "2: rank 2 of 3"]
    assert err.decode() == "gsrun: error: node2: task 2: Exited with exit code 9\n"
    method, path, body = controller.requests[0]
    assert (method, path) == ("POST", "/v1/jobs/7/steps")
    assert body["argv"] == ["python3", "x.py"] and (body["nodes"], body["ntasks"]) == (2, 3)
    assert body["environment"]["MY_VAR"] == "mine" and body["io"]["host"] == "127.0.0.1"


def test_gsrun_waits_while_the_step_is_busy_and_forwards_ctrl_c(side_dir: Path) -> None:
    asks: list[float] = []
    links: list[FakeNode] = []
    ready = threading.Event()

    def busy_then_run(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        asks.append(time.monotonic())
        if asks[-1] - asks[0] < 0.8:  # long enough for gsrun to say that it waits
            return 409, {"error": {"code": "step_busy", "message": "the job's GPUs are held"}}
        link = FakeNode(body["io"]["host"], body["io"]["port"])
        link.hello(body["io"]["token"], 7, 1, 0, [0])
        links.append(link)
        ready.set()
        return 201, created(1, {"node1": [0]})

    controller = FakeController(side_dir / "c.sock", busy_then_run)
    proc = gsrun_process(controller.path, ["--jobid", "7", "-K", "sleep", "100"],
                         stdin=subprocess.DEVNULL)
    assert ready.wait(20)
    link = links[0]
    # gsrun may still be taking the answer in: Ctrl-C until the node hears of it.
    deadline = time.monotonic() + 20
    while not any(f.kind == stepio.SIGNAL for f in link.received):
        assert time.monotonic() < deadline, link.received
        proc.send_signal(signal.SIGINT)
        try:
            link.wait_for(lambda frames: any(f.kind == stepio.SIGNAL for f in frames), 0.5)
        except (AssertionError, TimeoutError):
            pass
    assert proc.poll() is None  # still serving the step: the signal went to the task
    link.exit(0, None, signal.SIGINT)
    link.close()
    out, err = proc.communicate(timeout=30)
    controller.close()
    assert proc.returncode == 130, err
    lines = err.decode().splitlines()
    assert lines[0] == "gsrun: step creation temporarily disabled, retrying"
    assert lines.count("gsrun: step creation temporarily disabled, retrying") == 1
    assert lines[1] == "gsrun: step created for job 7, step 1"
    # The pause grows from 10 ms, doubling: a few asks, not one per 10 ms.
    gaps = [b - a for a, b in zip(asks, asks[1:])]
    assert gaps[0] >= 0.01 and gaps[1] >= 0.02 and gaps[-1] >= 0.16, gaps
    assert 6 <= len(asks) <= 9, gaps
    # -K: the task's end by a signal was bad: gsrun asked for the step's end.
    assert ("POST", "/v1/jobs/7/steps/1/cancel", {"bad_exit": True}) in controller.requests


def test_a_short_wait_for_room_is_quiet(side_dir: Path) -> None:
    """A step that fits after a moment (the one before it not yet recorded as ended)
    starts without gsrun saying that it waited."""
    asks: list[float] = []

    def busy_twice(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        asks.append(time.monotonic())
        if len(asks) < 3:
            return 409, {"error": {"code": "step_busy", "message": "held by step 7.0"}}

        def node() -> None:
            link = FakeNode(body["io"]["host"], body["io"]["port"])
            link.hello(body["io"]["token"], 7, 1, 0, [0])
            link.exit(0, 0)
            link.close()
        threading.Thread(target=node).start()
        return 201, created(1, {"node1": [0]})

    controller = FakeController(side_dir / "c.sock", busy_twice)
    proc = gsrun_process(controller.path, ["true"], stdin=subprocess.DEVNULL)
    out, err = proc.communicate(timeout=30)
    controller.close()
    assert proc.returncode == 0 and out == b"" and err == b"", err
    assert len(asks) == 3 and asks[2] - asks[0] < 0.4, asks


def test_gsrun_reports_the_controllers_refusal(side_dir: Path) -> None:
    controller = FakeController(side_dir / "c.sock", lambda body: (409, {"error": {
        "code": "conflict", "message": "job 7 is not running (COMPLETED)"}}))
    proc = gsrun_process(controller.path, ["true"], stdin=subprocess.DEVNULL)
    out, err = proc.communicate(timeout=30)
    controller.close()
    assert proc.returncode == 1 and out == b""
    assert err.decode() == "gsrun: error: job 7 is not running (COMPLETED)\n"


def test_gsrun_passes_its_stdin_to_task_0(side_dir: Path) -> None:
    got: list[bytes] = []

    def echo_node(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        def node() -> None:
            link = FakeNode(body["io"]["host"], body["io"]["port"])
            link.hello(body["io"]["token"], 7, 0, 0, [0])
            frames = link.wait_for(lambda fs: any(f.kind == stepio.STDIN and not f.payload
                                                  for f in fs))
            data = b"".join(f.payload for f in frames if f.kind == stepio.STDIN)
            got.append(data)
            link.send(stepio.STDOUT, 0, data.upper())
            link.exit(0, 0)
            link.close()
        threading.Thread(target=node).start()
        return 201, created(0, {"node1": [0]})

    controller = FakeController(side_dir / "c.sock", echo_node)
    proc = gsrun_process(controller.path, ["cat"], stdin=subprocess.PIPE)
    out, err = proc.communicate(b"some input\n" * 1000, timeout=30)
    controller.close()
    assert proc.returncode == 0, err
    assert got == [b"some input\n" * 1000] and out == b"SOME INPUT\n" * 1000
    assert json.loads(json.dumps(controller.requests[0][2]))["input"] is None


def test_ctrl_c_while_waiting_for_room_ends_gsrun_with_nothing_started(
        side_dir: Path) -> None:
    controller = FakeController(side_dir / "c.sock", lambda body: (409, {"error": {
        "code": "step_busy", "message": "the job's GPUs are held by step 7.0"}}))
    proc = gsrun_process(controller.path, ["true"], stdin=subprocess.DEVNULL)
    assert proc.stderr is not None
    first = proc.stderr.readline()
    assert first == b"gsrun: step creation temporarily disabled, retrying\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    controller.close()
    assert proc.returncode == 1 and out == b""
    assert err == (b"gsrun: error: interrupted while waiting for the step to fit; nothing "
                   b"was started\n")
    assert all(path == "/v1/jobs/7/steps" for _, path, _ in controller.requests)


def test_gsrun_starts_without_typer_rich_or_the_database_layer() -> None:
    env = {**os.environ, "GPUSCHED_SOCKET": "/nonexistent/gpusched-test.sock",
           "SLURM_JOB_ID": "7"}
    env.pop("GPUSCHED_CONTROLLERS", None)
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c",
         "import sys; from gpusched.cli import gsrun; sys.exit(gsrun.main(['-N1', 'true']))"],
        capture_output=True, text=True, env=env, timeout=60)
    names = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
             if line.startswith("import time:")}
    assert "gpusched.cli.stepio_server" in names and "gpusched.client.api" in names
    heavy = ("typer", "click", "rich", "pydantic", "sqlalchemy", "psycopg", "http.client",
             "gpusched.db", "gpusched.controller", "gpusched.messages.jobs",
             "gpusched.core.model", "gpusched.core.dependency")
    assert sorted(n for n in names if n.split(".")[0] in heavy or any(
        n == h or n.startswith(h + ".") for h in heavy)) == []
    assert result.returncode == 1
    assert "gsrun: error: cannot reach the gpusched controller" in result.stderr


def test_the_steps_state_as_the_controller_has_it(side_dir: Path) -> None:
    from gpusched.client import ApiClient

    controller = FakeController(side_dir / "c.sock", lambda body: (201, created(0, {})))
    controller.steps = [{"step_id": 0, "state": "RUNNING", "error": None},
                        {"step_id": 1, "state": "FAILED", "error": "node2: no such user"}]
    with ApiClient(controller.path, timeout=5) as client:
        assert gsrun.step_state(client, 7, 0) == StepState("RUNNING")
        assert gsrun.step_state(client, 7, 1) == StepState("FAILED", "node2: no such user")
        gone = gsrun.step_state(client, 7, 2)
        assert gone is not None and not gone.running and gone.state == "GONE"
    controller.close()
    with ApiClient(side_dir / "nothing.sock", timeout=1) as client:
        assert gsrun.step_state(client, 7, 0) is None  # no answer: unknown, not ended
