"""Job dependencies, as sbatch's ``--dependency``: parse them, and judge them (pure).

``after:ID[+MIN]`` waits for those jobs to begin (or be cancelled before they began),
and MIN minutes more; ``afterok:ID[:ID...]`` waits for those jobs to complete
successfully; ``afternotok`` for them to end unsuccessfully; ``afterany`` for them to
end at all; ``aftercorr`` (between arrays) lets each task wait for the task of the same
id of the other array to complete successfully; ``singleton`` for no other job of the
same name and user to be running. An id may name an array task (``afterok:12_3``).
Several clauses joined by commas must all be satisfied; joined by ``?``, any one of
them. A dependency that can no longer be met (afterok on a failed job) leaves the job
pending with reason ``DependencyNeverSatisfied``, as Slurm does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

from gpusched.core.model import JobState, PendingJob, Reason, Snapshot

# What a clause names: a job (or a whole array) by id, or one task of an array as
# (array id, task id).
Key = int | tuple[int, int]


class DependencyError(ValueError):
    """The dependency text is malformed."""


@dataclass(frozen=True, slots=True)
class Dependency:
    """One clause: a kind and the jobs it names (none for singleton). ``tasks`` gives,
    for each of ``job_ids``, the array task named (``12_3``) or None, and ``minutes``
    the delay of ``after:ID+MIN``; both are empty when no id has one. ``any_of``: the
    clauses were joined by ``?``."""

    kind: str
    job_ids: tuple[int, ...] = ()
    tasks: tuple[int | None, ...] = ()
    minutes: tuple[int, ...] = ()
    any_of: bool = False

    def targets(self) -> list[tuple[Key, int]]:
        """Each job or task named, with its delay in minutes."""
        found: list[tuple[Key, int]] = []
        for i, job_id in enumerate(self.job_ids):
            task = self.tasks[i] if self.tasks else None
            found.append((job_id if task is None else (job_id, task),
                          self.minutes[i] if self.minutes else 0))
        return found


KINDS = ("after", "afterok", "afternotok", "afterany", "aftercorr", "singleton")
MAX_DEPENDENCY_IDS = 1000  # distinct jobs one dependency may name
MAX_DEPENDENCY_TEXT = 64 * 1024  # characters, before parsing
MAX_AFTER_MINUTES = 366 * 24 * 60  # after:ID+MIN: at most a year
MAX_TASK_ID = 999_999  # as gpusched.core.arrays
_MAX_ID = 2**63 - 1  # jobs.id is a BIGINT
_REFUSED = {"afterburstbuffer": "there are no burst buffers here"}


class Verdict(Enum):
    """How a clause stands right now."""

    MET = 1
    WAITING = 2
    NEVER = 3


def _number(text: str, low: int, high: int) -> int | None:
    if text.isascii() and text.isdigit() and len(text) <= 19 and low <= int(text) <= high:
        return int(text)
    return None


def _target(text: str, kind: str) -> tuple[int, int | None, int] | None:
    """``ID``, ``ID_TASK`` or (after only) ``ID+MIN``; None when malformed."""
    ident, plus, delay = text.partition("+")
    minutes = _number(delay, 0, MAX_AFTER_MINUTES) if plus else 0
    if minutes is None or (plus and kind != "after"):
        return None
    job, underscore, task_text = ident.partition("_")
    job_id = _number(job, 1, _MAX_ID)
    task = _number(task_text, 0, MAX_TASK_ID) if underscore else None
    if job_id is None or (underscore and (task is None or kind == "aftercorr")):
        return None
    return job_id, task, minutes


def parse_dependency(text: str) -> tuple[Dependency, ...]:
    """Clauses of a ``--dependency`` value such as ``afterok:12:13,singleton`` or
    ``afterok:12_3?after:14+10``.

    A job named twice in a clause counts once; a dependency names at most
    MAX_DEPENDENCY_IDS distinct jobs (every pass judges each of them)."""
    if len(text) > MAX_DEPENDENCY_TEXT:
        raise DependencyError(f"invalid dependency: {len(text)} characters, more than the "
                              f"{MAX_DEPENDENCY_TEXT} allowed")
    any_of = "?" in text
    if any_of and "," in text:
        raise DependencyError(f"invalid dependency {text[:80]!r}: join clauses with ',' "
                              "(all must hold) or '?' (any may), not both")
    clauses: list[Dependency] = []
    named: set[int] = set()
    for raw in text.split("?" if any_of else ","):
        if not raw.strip():
            raise DependencyError(f"invalid dependency {text[:80]!r}: an empty item")
        kind, _, rest = raw.strip().partition(":")
        if kind in _REFUSED:
            raise DependencyError(f"dependency {kind}: not supported: {_REFUSED[kind]}")
        if kind not in KINDS:
            raise DependencyError(f"invalid dependency {raw.strip()[:80]!r}: expected one of "
                                  f"{', '.join(KINDS)}")
        if kind == "singleton":
            if rest:
                raise DependencyError("invalid dependency: singleton takes no job ids")
            clauses.append(Dependency(kind, any_of=any_of))
            continue
        found = [_target(item, kind) for item in rest.split(":")] if rest else []
        if not found or None in found:
            shown = raw.strip() if len(raw) <= 80 else raw.strip()[:77] + "..."
            form = {"after": "after:ID[+MIN][:ID[+MIN]...]",
                    "aftercorr": "aftercorr:ID[:ID...]"}.get(kind, f"{kind}:ID[_TASK][:...]")
            raise DependencyError(f"invalid dependency {shown!r}: expected {form} with job "
                                  f"ids from 1 to {_MAX_ID}, task ids from 0 to "
                                  f"{MAX_TASK_ID} and minutes from 0 to {MAX_AFTER_MINUTES}")
        unique = list(dict.fromkeys(t for t in found if t is not None))
        named.update(t[0] for t in unique)
        if len(named) > MAX_DEPENDENCY_IDS:
            raise DependencyError(f"invalid dependency: it names more than "
                                  f"{MAX_DEPENDENCY_IDS} jobs")
        tasks = tuple(t[1] for t in unique)
        minutes = tuple(t[2] for t in unique)
        clauses.append(Dependency(
            kind, tuple(t[0] for t in unique),
            tasks if any(t is not None for t in tasks) else (),
            minutes if any(minutes) else (), any_of))
    return tuple(clauses)


def format_dependency(clauses: tuple[Dependency, ...]) -> str:
    """The canonical text of parsed clauses (``parse_dependency`` reads it back)."""
    parts = []
    for clause in clauses:
        items = [f"{k}" if isinstance(k, int) else f"{k[0]}_{k[1]}" for k, _ in clause.targets()]
        items = [item + (f"+{m}" if m else "") for item, (_, m) in zip(items, clause.targets())]
        parts.append(clause.kind + "".join(f":{item}" for item in items))
    return ("?" if clauses and clauses[0].any_of else ",").join(parts)


@lru_cache(maxsize=4096)
def dependency_clauses(text: str) -> tuple[Dependency, ...]:
    """``parse_dependency``, cached: every pass sees the same stored texts again."""
    return parse_dependency(text)


def _ended_verdict(kind: str, ended: list[JobState], named: int) -> Verdict:
    """afterok, afternotok and afterany over ``named`` jobs, ``ended`` of them over."""
    if kind in ("afterok", "aftercorr") and any(s is not JobState.COMPLETED for s in ended):
        return Verdict.NEVER
    if kind == "afternotok" and any(s is JobState.COMPLETED for s in ended):
        return Verdict.NEVER
    return Verdict.MET if len(ended) == named else Verdict.WAITING


def _clause(dep: Dependency, states: Mapping[Key, JobState], began: Mapping[Key, float],
            now: float, task: int | None) -> Verdict:
    if dep.kind == "after":  # begun (or ended without beginning), and MIN minutes since
        for key, minutes in dep.targets():
            state, at = states.get(key), began.get(key)
            if state is None or not state.terminal and at is None:
                return Verdict.WAITING  # not begun (an array: not all of its tasks)
            if minutes and now < (now if at is None else at) + 60 * minutes:
                return Verdict.WAITING
        return Verdict.MET
    keys = [key for key, _ in dep.targets()]
    if dep.kind == "aftercorr" and task is not None:
        # The task of the same id, where the other array has one; else the whole job.
        keys = [(k, task) if (k, task) in states else k for k in keys if isinstance(k, int)]
    ended = [states[k] for k in keys if k in states and states[k].terminal]
    return _ended_verdict(dep.kind, ended, len(keys))


def dependency_reason(deps: tuple[Dependency, ...], states: Mapping[Key, JobState],
                      singleton_busy: bool, *, began: Mapping[Key, float] | None = None,
                      now: float = 0.0, task: int | None = None) -> Reason | None:
    """Why the dependencies hold the job back now, or None when they are met (all of
    them, or with ``?`` any one).

    ``states`` has the state of every job or task the clauses name (a missing one counts
    as not begun); ``began`` when each began (or ended without beginning; an array: its
    last task, absent while one has not begun), for ``after``; ``singleton_busy`` says whether a same-named job of the user runs;
    ``task`` is the array task judged, for ``aftercorr`` (None: not an array task).
    """
    seen = began or {}
    verdicts = [Verdict.WAITING if d.kind == "singleton" and singleton_busy
                else Verdict.MET if d.kind == "singleton"
                else _clause(d, states, seen, now, task) for d in deps]
    if deps and deps[0].any_of:
        if Verdict.MET in verdicts:
            return None
        return (Reason.DEPENDENCY_NEVER_SATISFIED if all(v is Verdict.NEVER for v in verdicts)
                else Reason.DEPENDENCY)
    if Verdict.NEVER in verdicts:
        return Reason.DEPENDENCY_NEVER_SATISFIED
    if Verdict.WAITING in verdicts:
        return Reason.DEPENDENCY
    return None


def waiting_reason(job: PendingJob, snapshot: Snapshot, singleton_busy: bool,
                   now: float) -> Reason | None:
    """``dependency_reason`` of a pending job (an array record: of its next task)."""
    task = None
    if job.array_tasks is not None and "aftercorr" in (job.dependency or ""):
        from gpusched.core.arrays import iter_tasks

        task = next(iter_tasks(job.array_tasks), None)
    return dependency_reason(dependency_clauses(job.dependency or ""), snapshot.job_states,
                             singleton_busy, began=snapshot.job_began, now=now, task=task)


def task_reason(job: PendingJob, task: int, snapshot: Snapshot, now: float) -> Reason | None:
    """Why task ``task`` of an array record waits for its ``aftercorr`` counterpart (a
    pass starting several tasks of one record asks for each); None: it need not."""
    if not job.dependency or "aftercorr" not in job.dependency:
        return None
    # singleton was judged for the record already (the pass asks again after each start)
    return dependency_reason(dependency_clauses(job.dependency), snapshot.job_states, False,
                             began=snapshot.job_began, now=now, task=task)
