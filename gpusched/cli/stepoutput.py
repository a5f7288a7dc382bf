"""What gsrun makes of its step's tasks: their output on its own streams (labelled
with ``-l``), and its exit status from how each task ended.

Exit status (srun's): the worst task's, the highest; a task a signal killed counts as
128 + the signal; a task whose node went away without its end counts as 1. With
``--kill-on-bad-exit`` the first task to end badly decides, and tasks that end by a
signal after gsrun asked for the step to be killed do not count.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO

MAX_PARTIAL = 64 * 1024  # bytes of a line held for its end before it is shown anyway
LOST = 1  # the status of a task whose end never came


def task_status(exit_code: int | None, signal: int | None) -> int:
    """A task's end as a shell shows it: its exit code, or 128 + the killing signal."""
    if signal:
        return 128 + signal
    return exit_code if exit_code is not None else LOST


def describe_end(exit_code: int | None, signal: int | None) -> str:
    """How a task ended badly, in srun's words."""
    if signal:
        return f"Killed by signal {signal}"
    return f"Exited with exit code {exit_code}"


class OutputSink:
    """Writes the tasks' output to gsrun's stdout and stderr, a line at a time so that
    the tasks' lines do not mix (as slurmstepd buffers them): a line is shown once
    whole, or when its task ends. With ``label`` each line is prefixed ``TASK: ``;
    ``unbuffered`` shows output as it comes (srun -u), lines of tasks may then mix."""

    def __init__(self, out: BinaryIO, err: BinaryIO, label: bool,
                 unbuffered: bool = False) -> None:
        self._streams = (out, err)
        self._label = label
        self._unbuffered = unbuffered and not label
        self._partial: dict[tuple[int, int], bytes] = {}  # (stream, task) -> held bytes
        self._gone = [False, False]  # a reader of that stream went away

    def write(self, stream: int, task: int, data: bytes) -> None:
        """Output of ``task`` on ``stream`` (0: stdout, 1: stderr)."""
        if self._unbuffered:
            self._emit(stream, data)
            return
        key = (stream, task)
        held = self._partial.pop(key, b"") + data
        end = held.rfind(b"\n")
        if end >= 0:
            if self._label:
                prefix = f"{task}: ".encode()
                lines = held[:end].split(b"\n")
                self._emit(stream, b"".join(prefix + line + b"\n" for line in lines))
            else:
                self._emit(stream, held[:end + 1])
            held = held[end + 1:]
        if len(held) > MAX_PARTIAL:
            self._emit(stream, self._prefix(task) + held + b"\n")
            held = b""
        if held:
            self._partial[key] = held

    def task_ended(self, task: int) -> None:
        """Show what ``task`` left without a final newline (labelled: with one)."""
        for stream in (0, 1):
            held = self._partial.pop((stream, task), b"")
            if held:
                self._emit(stream, self._prefix(task) + held
                           + (b"\n" if self._label else b""))

    def _prefix(self, task: int) -> bytes:
        return f"{task}: ".encode() if self._label else b""

    def flush(self) -> None:
        """Push what was written to the readers."""
        for index, stream in enumerate(self._streams):
            if not self._gone[index]:
                try:
                    stream.flush()
                except (BrokenPipeError, ValueError):
                    self._gone[index] = True

    def _emit(self, stream: int, data: bytes) -> None:
        if self._gone[stream]:
            return
        try:
            self._streams[stream].write(data)
        except (BrokenPipeError, ValueError):
            self._gone[stream] = True  # output nobody reads any more is dropped


class ExitTally:
    """How each task of the step ended, and gsrun's exit status from it."""

    def __init__(self, tasks: list[int], kill_on_bad_exit: bool = False) -> None:
        self.expected = frozenset(tasks)
        self.kill_on_bad_exit = kill_on_bad_exit
        self.ends: dict[int, int] = {}  # task -> status
        self.first_bad: int | None = None  # the task whose end asked for the kill
        self._killed_after: set[int] = set()

    def record(self, task: int, exit_code: int | None, signal: int | None) -> bool:
        """Note ``task``'s end (a second end of a task is ignored); True when this is
        the first bad end and the step is to be killed for it."""
        if task not in self.expected or task in self.ends:
            return False
        status = task_status(exit_code, signal)
        self.ends[task] = status
        if status == 0:
            return False
        if self.first_bad is None:
            self.first_bad = task
            return self.kill_on_bad_exit
        if self.kill_on_bad_exit and signal:
            self._killed_after.add(task)
        return False

    def lost(self, task: int) -> bool:
        """``task``'s end will never come; as ``record``."""
        return self.record(task, LOST, None)

    @property
    def missing(self) -> list[int]:
        """Tasks whose end has not come, in order."""
        return sorted(self.expected - self.ends.keys())

    @property
    def complete(self) -> bool:
        return not self.expected - self.ends.keys()

    def status(self) -> int:
        """gsrun's exit status (tasks still missing count as lost)."""
        counted = [s for t, s in self.ends.items() if t not in self._killed_after]
        counted += [LOST] * len(self.expected - self.ends.keys())
        return min(max(counted, default=0), 255)
