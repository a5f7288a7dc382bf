"""gsrun's I/O socket: where the step's nodes connect to stream their tasks' output
and ends, and through which gsrun passes its standard input and signals to the tasks
(frames: gpusched.messages.stepio).

The socket listens before the step is asked for (a node may connect as soon as the
controller has sent it the step) and is served once the step is known. A connection
must send a HELLO with the step's token, for a node of the step not yet connected,
listing that node's tasks, within HELLO_TIMEOUT; anything else closes it. One event
loop (poll) serves every connection, gsrun's stdin and the signals it forwards.

Written on the C modules _socket, select (gpusched.cli.steppoll) and _signal: socket.py,
selectors and signal.py load enum (and socket.py selectors) on every gsrun start, a few
milliseconds each (tests/cli/test_gsrun_imports.py).
"""

from __future__ import annotations

import _socket
import errno
import os
import time

from gpusched.cli.output import one_line
from gpusched.cli.stepoutput import ExitTally, OutputSink, describe_end
from gpusched.cli.steppoll import EVENT_READ, EVENT_WRITE, Poller, accept
from gpusched.messages import stepio
from gpusched.messages.stepio import FrameError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from signal import SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGWINCH  # the same, typed
    from socket import socket as Socket

    Say = Callable[[str], None]
else:
    from _signal import SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGWINCH

HELLO_TIMEOUT = 5.0  # seconds a new connection has to prove it is the step's
RECV_BYTES = 256 * 1024
STDIN_BYTES = 60 * 1024
MAX_QUEUED = 1024 * 1024  # bytes queued to a node before gsrun stops reading its stdin
EXTRA_PENDING = 64  # connections not yet past HELLO, beyond one per node
CLOSE_GRACE = 2.0  # seconds to let nodes close after every task's end came
POLL_MISSING = 1.0  # seconds between asks for the step's state while a node is missing
POLL_RUNNING = 10.0  # the same, once every node is connected
FINAL_GRACE = 3.0  # seconds nodes still have after the controller says the step ended
# Signals gsrun passes on to every task; SIGWINCH sends the terminal's size (--pty).
FORWARDED = frozenset({SIGINT, SIGTERM, SIGHUP, SIGQUIT})


class StepState:
    """The step as the controller has it: its state and its error (None: none)."""

    __slots__ = ("state", "error")

    def __init__(self, state: str, error: str | None = None) -> None:
        self.state = state
        self.error = error

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepState) and (self.state, self.error) == (
            other.state, other.error)

    def __hash__(self) -> int:
        return hash((self.state, self.error))

    def __repr__(self) -> str:
        return f"StepState({self.state!r}, {self.error!r})"


class StepPlan:
    """The step gsrun serves: ids, nodes in order and each node's task ids."""

    __slots__ = ("job_id", "step_id", "node_names", "layout")

    def __init__(self, job_id: int, step_id: int, node_names: tuple[str, ...],
                 layout: dict[str, tuple[int, ...]]) -> None:
        self.job_id = job_id
        self.step_id = step_id
        self.node_names = node_names
        self.layout = layout

    @property
    def tasks(self) -> list[int]:
        return sorted(t for tasks in self.layout.values() for t in tasks)


class _Link:
    """One node's connection."""

    def __init__(self, sock: Socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline  # for its HELLO
        self.decoder = stepio.Decoder(stepio.FROM_NODE)
        self.node: str | None = None  # set by its HELLO
        self.tasks: frozenset[int] = frozenset()
        self.queued = bytearray()


def _say_nothing(line: str) -> None:
    """The default ``say``."""


class ServeOptions:
    """How gsrun serves the step: what it forwards and whom it asks.

    ``stdin_fd`` is forwarded to task 0 (None: the tasks read elsewhere); ``signal_fd``
    carries signal numbers, one byte each (signal.set_wakeup_fd); ``on_bad_exit`` gets
    the first bad task, with -K; ``poll`` gives the step's state (None: unknown);
    ``say`` writes one line on gsrun's stderr; ``winsize`` gives the (rows, columns) of
    gsrun's terminal, sent to task 0's node when it connects and on each SIGWINCH
    (None: no terminal)."""

    def __init__(self, stdin_fd: int | None = None, signal_fd: int | None = None,
                 on_bad_exit: Callable[[int], None] | None = None,
                 poll: Callable[[], StepState | None] | None = None,
                 say: Say = _say_nothing,
                 winsize: Callable[[], tuple[int, int] | None] | None = None) -> None:
        self.stdin_fd = stdin_fd
        self.signal_fd = signal_fd
        self.on_bad_exit = on_bad_exit
        self.poll = poll
        self.say = say
        self.winsize = winsize


class StepIOServer:
    """The listening socket, bound to ``host`` (port chosen by the kernel)."""

    def __init__(self, host: str, token: str | None = None) -> None:
        family = _socket.AF_INET6 if ":" in host else _socket.AF_INET
        self.listener: Socket = _socket.socket(family, _socket.SOCK_STREAM)  # type: ignore[assignment]
        try:
            self.listener.bind((host, 0))
            self.listener.listen(_socket.SOMAXCONN)
        except OSError:
            self.listener.close()
            raise
        self.listener.setblocking(False)
        self.host = host
        self.port: int = self.listener.getsockname()[1]
        self.token = token if token is not None else os.urandom(32).hex()
        self._links: list[_Link] = []

    def close(self) -> None:
        """Close the socket and every connection."""
        for link in self._links:
            link.sock.close()
        self._links.clear()
        self.listener.close()

    def serve(self, plan: StepPlan, sink: OutputSink, tally: ExitTally,
              options: ServeOptions) -> None:
        """Serve the step until every task's end is known (and its nodes closed, or
        CLOSE_GRACE passed)."""
        _Session(self, plan, sink, tally, options).run()


class _Session:
    """One step served: the event loop's state."""

    def __init__(self, server: StepIOServer, plan: StepPlan, sink: OutputSink,
                 tally: ExitTally, options: ServeOptions) -> None:
        self.server, self.plan, self.sink, self.tally = server, plan, sink, tally
        self.options = options
        self.selector = Poller()
        self.connected: dict[str, _Link] = {}  # node -> its link, once past HELLO
        self.ended_nodes: set[str] = set()
        self.signals: list[int] = []  # forwarded so far (a node connecting later gets them)
        self.stdin_open = options.stdin_fd is not None
        self.stdin_watched = False
        self.first_node = next((n for n, tasks in plan.layout.items() if 0 in tasks), None)
        now = time.monotonic()
        self.next_poll = now + POLL_MISSING
        self.final_seen: float | None = None
        self.final_error: str | None = None
        self.done_at: float | None = None

    # -- the loop --------------------------------------------------------------------
    def run(self) -> None:
        self.selector.register(self.server.listener, EVENT_READ, "listen")
        if self.options.signal_fd is not None:
            self.selector.register(self.options.signal_fd, EVENT_READ, "signal")
        try:
            while not self._finished():
                for data, events in self.selector.select(self._timeout()):
                    self._event(data, events)
                self._timers()
                self.sink.flush()
        finally:
            self.selector.close()
            self.sink.flush()

    def _finished(self) -> bool:
        if not self.tally.complete:
            return False
        now = time.monotonic()
        if self.done_at is None:
            self.done_at = now
        open_nodes = [link for link in self.server._links if link.node is not None]
        return not open_nodes or now - self.done_at >= CLOSE_GRACE

    def _timeout(self) -> float:
        now = time.monotonic()
        due = [self.next_poll] if self.options.poll is not None else []
        due += [link.deadline for link in self.server._links if link.node is None]
        if self.done_at is not None:
            due.append(self.done_at + CLOSE_GRACE)
        if self.final_seen is not None:
            due.append(self.final_seen + FINAL_GRACE)
        return max(0.0, min([now + 1.0, *due]) - now)

    def _event(self, what: object, events: int) -> None:
        if what == "listen":
            self._accept()
        elif what == "signal":
            self._signals()
        elif what == "stdin":
            self._stdin()
        elif isinstance(what, _Link):
            if events & EVENT_WRITE:
                self._drain(what)
            if events & EVENT_READ and what in self.server._links:
                self._receive(what)

    def _timers(self) -> None:
        now = time.monotonic()
        for link in list(self.server._links):
            if link.node is None and now >= link.deadline:
                self._close(link)  # no HELLO in time
        poll = self.options.poll
        if poll is not None and now >= self.next_poll:
            missing = len(self.connected) + len(self.ended_nodes) < len(self.plan.node_names)
            self.next_poll = now + (POLL_MISSING if missing else POLL_RUNNING)
            state = poll()
            if state is not None and not state.running and self.final_seen is None:
                self.final_seen = now
                self.final_error = state.error
        if self.final_seen is not None and now - self.final_seen >= FINAL_GRACE:
            self._give_up_on_missing()

    # -- connections -----------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                sock = accept(self.server.listener)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ECONNABORTED):
                    return
                raise
            pending = sum(1 for link in self.server._links if link.node is None)
            if pending >= len(self.plan.node_names) + EXTRA_PENDING:
                sock.close()
                continue
            sock.setblocking(False)
            link = _Link(sock, time.monotonic() + HELLO_TIMEOUT)
            self.server._links.append(link)
            self.selector.register(sock, EVENT_READ, link)

    def _receive(self, link: _Link) -> None:
        try:
            data = link.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(link)
            return
        try:
            for frame in link.decoder.feed(data):
                if link.node is None:
                    self._hello(link, frame)
                else:
                    self._frame(link, frame)
        except FrameError:
            self._close(link)

    def _hello(self, link: _Link, frame: stepio.Frame) -> None:
        hello = stepio.check_hello(frame, self.server.token, self.plan.job_id,
                                   self.plan.step_id)
        if hello.node_index >= len(self.plan.node_names):
            raise FrameError("HELLO: no such node in the step")
        node = self.plan.node_names[hello.node_index]
        if node in self.connected or node in self.ended_nodes:
            raise FrameError("HELLO: that node is already connected")
        if sorted(hello.tasks) != sorted(self.plan.layout.get(node, ())):
            raise FrameError("HELLO: not that node's tasks")
        link.node, link.tasks = node, frozenset(hello.tasks)
        self.connected[node] = link
        for signum in self.signals:
            self._send(link, stepio.encode(stepio.SIGNAL, 0, str(signum).encode()))
        if node == self.first_node:
            self._send_window()
        if node == self.first_node and self.stdin_open:
            self._watch_stdin()

    def _frame(self, link: _Link, frame: stepio.Frame) -> None:
        if frame.kind == stepio.ERROR:
            text = frame.payload.decode("utf-8", "replace")
            self.options.say(f"gsrun: error: node {link.node}: {one_line(text)}")
            return
        if frame.kind == stepio.HELLO or frame.task not in link.tasks:
            raise FrameError("a frame for no task of this node")
        if frame.kind in (stepio.STDOUT, stepio.STDERR):
            self.sink.write(0 if frame.kind == stepio.STDOUT else 1, frame.task, frame.payload)
        elif frame.kind == stepio.EXIT:
            exit_code, signum = stepio.check_exit(frame)
            self._task_end(link.node or "", frame.task, exit_code, signum)

    def _task_end(self, node: str, task: int, exit_code: int | None,
                  signum: int | None) -> None:
        """A task's end (``exit_code`` and ``signum`` both None: lost with its node)."""
        if task in self.tally.ends:
            return
        self.sink.task_ended(task)
        if exit_code is None and signum is None:
            self.options.say(f"gsrun: error: {node}: task {task}: lost (no exit status)")
            bad = self.tally.lost(task)
        else:
            if exit_code or signum:
                self.sink.flush()
                self.options.say(f"gsrun: error: {node}: task {task}: "
                                 f"{describe_end(exit_code, signum)}")
            bad = self.tally.record(task, exit_code, signum)
        if bad and self.options.on_bad_exit is not None:
            self.options.on_bad_exit(task)

    def _close(self, link: _Link) -> None:
        """Drop a connection; tasks of its node whose end did not come are lost."""
        try:
            self.selector.unregister(link.sock)
        except (KeyError, ValueError):
            pass
        link.sock.close()
        if link in self.server._links:
            self.server._links.remove(link)
        if link.node is None:
            return
        self.connected.pop(link.node, None)
        self.ended_nodes.add(link.node)
        if link.node == self.first_node and self.stdin_watched:
            self._unwatch_stdin()
        for task in sorted(link.tasks - self.tally.ends.keys()):
            self._task_end(link.node, task, None, None)

    def _give_up_on_missing(self) -> None:
        """The controller says the step ended (FINAL_GRACE ago): nodes that never
        connected will not, and a node still connected is gone without closing."""
        for link in list(self.connected.values()):
            self._close(link)
        for node in self.plan.node_names:
            if node in self.ended_nodes:
                continue
            self.ended_nodes.add(node)
            reason = self.final_error or "the step ended first"
            self.options.say(f"gsrun: error: node {node}: its tasks did not start: "
                             f"{one_line(reason)}")
            for task in self.plan.layout.get(node, ()):
                if task not in self.tally.ends:
                    self.sink.task_ended(task)
                    if self.tally.lost(task) and self.options.on_bad_exit is not None:
                        self.options.on_bad_exit(task)
        self.final_seen = None

    # -- what gsrun sends ------------------------------------------------------------
    def _send(self, link: _Link, data: bytes) -> None:
        link.queued += data
        self._drain(link)

    def _drain(self, link: _Link) -> None:
        if link.queued:
            try:
                sent = link.sock.send(link.queued)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                link.queued.clear()  # the node went away: its reading side will notice
                sent = 0
            del link.queued[:sent]
        events = EVENT_READ | (EVENT_WRITE if link.queued else 0)
        try:
            self.selector.modify(link.sock, events, link)
        except (KeyError, ValueError):
            return
        if self.stdin_open and link.node == self.first_node:
            if len(link.queued) > MAX_QUEUED:
                self._unwatch_stdin()
            elif not self.stdin_watched:
                self._watch_stdin()

    def _signals(self) -> None:
        fd = self.options.signal_fd
        assert fd is not None
        try:
            data = os.read(fd, 64)
        except (BlockingIOError, InterruptedError):
            return
        for signum in data:
            if signum == SIGWINCH:
                self._send_window()
            if signum not in FORWARDED:
                continue
            self.signals.append(signum)
            for link in list(self.connected.values()):
                self._send(link, stepio.encode(stepio.SIGNAL, 0, str(signum).encode()))

    def _send_window(self) -> None:
        """Tell task 0's node the size of gsrun's terminal, if it has one."""
        size = self.options.winsize() if self.options.winsize is not None else None
        link = self.connected.get(self.first_node or "")
        if size is not None and link is not None:
            self._send(link, stepio.encode(stepio.WINDOW, 0, stepio.WINSIZE.pack(*size)))

    def _watch_stdin(self) -> None:
        fd = self.options.stdin_fd
        if fd is None or self.stdin_watched:
            return
        try:
            self.selector.register(fd, EVENT_READ, "stdin")
            self.stdin_watched = True
        except (OSError, ValueError):
            self._stdin_eof()

    def _unwatch_stdin(self) -> None:
        if self.stdin_watched and self.options.stdin_fd is not None:
            self.selector.unregister(self.options.stdin_fd)
        self.stdin_watched = False

    def _stdin(self) -> None:
        assert self.options.stdin_fd is not None
        try:
            data = os.read(self.options.stdin_fd, STDIN_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._stdin_eof()
            return
        link = self.connected.get(self.first_node or "")
        if link is not None:
            self._send(link, stepio.encode(stepio.STDIN, 0, data))

    def _stdin_eof(self) -> None:
        self._unwatch_stdin()
        self.stdin_open = False
        link = self.connected.get(self.first_node or "")
        if link is not None:
            self._send(link, stepio.encode(stepio.STDIN, 0, b""))

