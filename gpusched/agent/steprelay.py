"""The step supervisor's relay between its tasks and gsrun's I/O socket: what the tasks
write goes out as STDOUT and STDERR frames, gsrun's STDIN, SIGNAL and WINSIZE frames
come in, all on one selector, each side read only as fast as the other takes it. Stdlib
only, like the step supervisor that imports it."""

from __future__ import annotations

import os
import selectors
import signal
import time
from collections.abc import Callable
from typing import Any

from gpusched.agent.steplink import READ_SIZE, GsrunLink
from gpusched.agent.steptask import StepTask
from gpusched.messages import stepio

MAX_BUFFERED = 4 << 20  # bytes of output held for gsrun before tasks' pipes are left unread
MAX_STDIN_BUFFERED = 1 << 20  # bytes of gsrun's input held for task 0
_WAKE = "wake"  # the selector's data for the signal wakeup pipe
_GSRUN = "io"  # the selector's data for gsrun's socket


class StepRelay:
    """Carries one node's step I/O between its tasks' pipes (or terminal) and gsrun.

    ``signal_tasks(number)`` is called for each SIGNAL frame gsrun sends, and
    ``lost(why)`` once gsrun's connection is gone (closed, failed or sent a bad frame).
    """

    def __init__(self, tasks: list[StepTask], signal_tasks: Callable[[int], None],
                 lost: Callable[[str], None]) -> None:
        self.tasks = tasks
        self.link = GsrunLink()
        self.selector = selectors.DefaultSelector()
        self._signal_tasks = signal_tasks
        self._lost = lost

    def watch_wakeup(self, fd: int) -> None:
        """End a wait when ``fd`` turns readable (what it holds is for the caller)."""
        self.selector.register(fd, selectors.EVENT_READ, _WAKE)

    def watch_tasks(self) -> None:
        """Start reading the started tasks' output."""
        for task in self.tasks:
            for fd in task.streams:
                self.selector.register(fd, selectors.EVENT_READ, task)

    def wait(self, until: float | None) -> None:
        """Move what is ready either way, waiting for something until ``until``
        (monotonic; None: no limit)."""
        self._update_interest()
        timeout = None if until is None else max(0.0, until - time.monotonic())
        for key, events in self.selector.select(timeout):
            self._ready(key, events)

    def send_exit(self, task: StepTask) -> None:
        """Send what an exited task left in its pipes, then its EXIT frame."""
        for fd in task.streams:
            while len(self.link.outbox) < MAX_BUFFERED and self._read_stream(task, fd):
                pass
        self.link.send(stepio.exit_frame(task.task_id, task.exit_code, task.signal))

    def finish(self, end: float) -> None:
        """Every task has exited: send the rest of their output and flush it to gsrun,
        until ``end`` (monotonic) at the latest; then close the connection."""
        while any(t.streams for t in self.tasks) and time.monotonic() < end:
            for key, events in self.selector.select(max(0.0, end - time.monotonic())):
                if isinstance(key.data, StepTask):
                    self._read_stream(key.data, int(key.fd))
                elif key.data == _GSRUN and events & selectors.EVENT_WRITE:
                    self.flush_some()
            self._update_interest()
        self.link.flush(end)

    def flush_some(self) -> None:
        """Send what gsrun's socket takes now."""
        failure = self.link.flush_some()
        if failure is not None:
            self._lost_gsrun(failure)

    # ------------------------------------------------------------ the selector

    def _update_interest(self) -> None:
        """Read tasks' output only while gsrun keeps up; write to gsrun while there is
        something to send; take gsrun's input while task 0 keeps up."""
        reading = len(self.link.outbox) < MAX_BUFFERED
        for task in self.tasks:
            for fd in task.streams:
                self._interest(fd, selectors.EVENT_READ if reading else 0, task)
            if task.in_fd is not None:
                self._interest(task.in_fd, selectors.EVENT_WRITE if task.stdin_buffer
                               else 0, ("stdin", task))
        if self.link.sock is not None:
            stdin_full = any(len(t.stdin_buffer) >= MAX_STDIN_BUFFERED for t in self.tasks)
            events = (0 if stdin_full else selectors.EVENT_READ) | (
                selectors.EVENT_WRITE if self.link.outbox else 0)
            self._interest(self.link.sock, events, _GSRUN)

    def _interest(self, fd: Any, events: int, data: Any) -> None:
        try:
            key = self.selector.get_key(fd)
        except KeyError:
            if events:
                self.selector.register(fd, events, data)
            return
        if not events:
            self.selector.unregister(fd)
        elif key.events != events:
            self.selector.modify(fd, events, data)

    def _ready(self, key: selectors.SelectorKey, events: int) -> None:
        if key.data == _WAKE:
            return  # the caller takes the signals after the wait
        if key.data == _GSRUN:
            if events & selectors.EVENT_WRITE:
                self.flush_some()
            if events & selectors.EVENT_READ and self.link.sock is not None:
                self._from_gsrun()
        elif isinstance(key.data, tuple):
            self._feed_stdin(key.data[1])
        else:
            self._read_stream(key.data, int(key.fd))

    # ------------------------------------------------------------ the tasks' side

    def _read_stream(self, task: StepTask, fd: int) -> bool:
        """Send what a task wrote; close its pipe at end of file. Whether it read any."""
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        kind = stepio.STDOUT if fd == task.out_fd else stepio.STDERR
        if data:
            self.link.send_output(task.task_id, kind, data)
            return True
        self._interest(fd, 0, task)
        os.close(fd)
        if fd == task.out_fd:
            task.out_fd = None
        else:
            task.err_fd = None
        return False

    def _feed_stdin(self, task: StepTask) -> None:
        if task.in_fd is None:
            return
        if task.stdin_buffer:
            try:
                sent = os.write(task.in_fd, task.stdin_buffer)
            except BlockingIOError:
                return
            except OSError:  # the task closed its stdin or ended
                self._interest(task.in_fd, 0, None)
                task.close_stdin()
                return
            del task.stdin_buffer[:sent]
        if not task.stdin_buffer and task.stdin_closing:
            self._interest(task.in_fd, 0, None)
            task.close_stdin()

    # ------------------------------------------------------------ gsrun's side

    def _from_gsrun(self) -> None:
        frames, lost = self.link.receive()
        if lost is not None:
            self._lost_gsrun(lost)
        for frame in frames:
            if frame.kind == stepio.SIGNAL:
                number = _signal_number(frame.payload)
                if number is not None:
                    self._signal_tasks(number)
            elif frame.kind == stepio.STDIN:
                for task in self.tasks:
                    if task.in_fd is not None and not task.stdin_closing:
                        if frame.payload:
                            task.stdin_buffer += frame.payload
                        else:
                            task.end_input()
                        self._feed_stdin(task)
            elif frame.kind == stepio.WINDOW and len(frame.payload) == stepio.WINSIZE.size:
                for task in self.tasks:
                    task.set_window(*stepio.WINSIZE.unpack(frame.payload))

    def _lost_gsrun(self, why: str) -> None:
        """gsrun is gone: nobody takes the output any more."""
        if self.link.sock is not None:
            self._interest(self.link.sock, 0, None)
        self.link.close()
        self._lost(why)


def _signal_number(payload: bytes) -> int | None:
    """A SIGNAL frame's signal (ASCII digits), if it is one."""
    if not payload.isdigit() or len(payload) > 3:
        return None
    number = int(payload)
    return number if 0 < number < signal.NSIG else None
