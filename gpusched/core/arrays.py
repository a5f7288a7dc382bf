"""Job arrays, as sbatch's ``--array``: task-id sets, their text form, and the task cap.

``0-99``, ``1,3,5-9``, ``0-30:10`` (a step) name the task ids; a ``%N`` suffix caps how
many tasks may run at once. A set is kept as its canonical text (sorted, each id once,
runs folded into ``a-b`` or ``a-b:s``), which is what the database stores for an array's
still-pending tasks. Taking the next tasks of a set costs in proportion to the number of
runs in its text, never to the number of tasks, so a 10,000-task array is as cheap to
look at as a one-task job.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache

MAX_TASK_ID = 999_999
MAX_TASKS = 100_000


class ArrayError(ValueError):
    """The ``--array`` text is malformed or too large."""


@dataclass(frozen=True, slots=True)
class Run:
    """Task ids ``first, first+step, ..., last`` (inclusive)."""

    first: int
    last: int
    step: int = 1

    def __len__(self) -> int:
        return (self.last - self.first) // self.step + 1

    def ids(self) -> range:
        """The ids of this run, in order."""
        return range(self.first, self.last + 1, self.step)

    def text(self) -> str:
        """``7``, ``1-9`` or ``0-30:10``."""
        if self.first == self.last:
            return str(self.first)
        base = f"{self.first}-{self.last}"
        return base if self.step == 1 else f"{base}:{self.step}"


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """A parsed ``--array`` value: its task ids (canonical text) and its cap."""

    tasks: str
    max_running: int | None = None

    def text(self) -> str:
        """The value as sbatch would take it back, ``0-99%8``."""
        return self.tasks if self.max_running is None else f"{self.tasks}%{self.max_running}"


def _number(token: str, whole: str) -> int:
    if not token.isascii() or not token.isdigit():
        raise ArrayError(f"invalid array {whole!r}: {token!r} is not a task id "
                         f"(expected a whole number)")
    digits = token.lstrip("0") or "0"  # int() refuses more than 4300 digits
    if len(digits) > len(str(MAX_TASK_ID)) or int(digits) > MAX_TASK_ID:
        shown = digits if len(digits) <= 20 else digits[:17] + "..."
        raise ArrayError(f"invalid array {whole!r}: task id {shown} is above the largest "
                         f"allowed, {MAX_TASK_ID}")
    return int(digits)


def _parse_run(token: str, whole: str) -> Run:
    span, colon, step_text = token.partition(":")
    step = _number(step_text, whole) if colon else 1
    if step == 0:
        raise ArrayError(f"invalid array {whole!r}: the step in {token!r} must be at least 1")
    first_text, dash, last_text = span.partition("-")
    first = _number(first_text, whole)
    last = _number(last_text, whole) if dash else first
    if colon and not dash:
        raise ArrayError(f"invalid array {whole!r}: a step needs a range, as in 0-30:10")
    if last < first:
        raise ArrayError(f"invalid array {whole!r}: range {span!r} ends before it starts")
    return Run(first, first + (last - first) // step * step, step)


def parse_array(text: str) -> ArraySpec:
    """Parse ``--array``: ``LIST[%CAP]`` where LIST is ids, ranges and stepped ranges."""
    whole = text.strip()
    body, percent, cap_text = whole.partition("%")
    if not body:
        raise ArrayError(f"invalid array {text!r}: expected task ids such as 0-99 or 1,3,5-9")
    cap: int | None = None
    if percent:
        # At most MAX_TASKS (more says nothing more), and int() reads at most 4300 digits.
        digits = cap_text.lstrip("0")
        if (not cap_text.isascii() or not cap_text.isdigit() or not digits
                or len(digits) > len(str(MAX_TASKS)) or int(digits) > MAX_TASKS):
            raise ArrayError(f"invalid array {text!r}: the limit after % must be a whole "
                             f"number of at least 1 and at most {MAX_TASKS}")
        cap = int(cap_text)
    runs = [_parse_run(token.strip(), whole) for token in body.split(",")]
    if sum(len(run) for run in runs) > 4 * MAX_TASKS:  # before building the set
        raise ArrayError(f"invalid array {text!r}: more than {MAX_TASKS} tasks")
    ids = sorted({i for run in runs for i in run.ids()})
    if len(ids) > MAX_TASKS:
        raise ArrayError(f"invalid array {text!r}: {len(ids)} tasks, more than {MAX_TASKS}")
    return ArraySpec(fold(ids), cap)


def fold(ids: Iterable[int]) -> str:
    """Canonical text of sorted, distinct ids: runs of equal steps folded."""
    ordered = list(ids)
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        first = ordered[i]
        if i + 1 == len(ordered):
            parts.append(str(first))
            break
        step = ordered[i + 1] - first
        j = i + 1
        while j + 1 < len(ordered) and ordered[j + 1] - ordered[j] == step:
            j += 1
        if step > 1 and j + 1 < len(ordered) and ordered[j + 1] - ordered[j] == 1:
            j -= 1  # leave the id to the consecutive run it starts: 1,3,5-9
        if step == 1 or j - i >= 2:  # 1-2 is a run; 1,3 is not worth "1-3:2"
            parts.append(Run(first, ordered[j], step).text())
            i = j + 1
        else:
            parts.append(str(first))
            i += 1
    return ",".join(parts)


@lru_cache(maxsize=4096)
def runs(tasks: str) -> tuple[Run, ...]:
    """The runs of a canonical task text (cached: every pass reads the same texts)."""
    if not tasks:
        return ()
    return tuple(_parse_run(token, tasks) for token in tasks.split(","))


def task_count(tasks: str) -> int:
    """How many ids a canonical task text holds."""
    return sum(len(run) for run in runs(tasks))


def iter_tasks(tasks: str) -> Iterator[int]:
    """The ids of a canonical task text, lowest first, produced lazily."""
    for run in runs(tasks):
        yield from run.ids()


def drop_first(tasks: str, count: int) -> str | None:
    """The text left after taking the lowest ``count`` ids; None when none are left."""
    left: list[str] = []
    for run in runs(tasks):
        if count >= len(run):
            count -= len(run)
            continue
        if count:
            run = Run(run.first + count * run.step, run.last, run.step)
            count = 0
        left.append(run.text())
    return ",".join(left) or None


def remove(tasks: str, ids: Iterable[int]) -> str | None:
    """The text without ``ids``; None when none are left."""
    gone = set(ids)
    return fold(i for i in iter_tasks(tasks) if i not in gone) or None


def task_bounds(tasks: str) -> tuple[int, int, int]:
    """Count, lowest and highest id of a non-empty canonical task text."""
    parts = runs(tasks)
    return sum(len(run) for run in parts), parts[0].first, parts[-1].last
