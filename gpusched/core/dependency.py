"""Job dependencies, as sbatch's ``--dependency``: parse them, and judge them (pure).

``afterok:ID[:ID...]`` waits for those jobs to complete successfully; ``afternotok``
for them to end unsuccessfully; ``afterany`` for them to end at all; ``singleton`` for
no other job of the same name and user to be running. Several, comma-separated, must all
be satisfied. A dependency that can no longer be met (afterok on a failed job) leaves
the job pending with reason ``DependencyNeverSatisfied``, as Slurm does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

from gpusched.core.model import JobState, Reason


class DependencyError(ValueError):
    """The dependency text is malformed."""


@dataclass(frozen=True, slots=True)
class Dependency:
    """One clause: a kind and the jobs it names (none for singleton)."""

    kind: str
    job_ids: tuple[int, ...] = ()


KINDS = ("afterok", "afternotok", "afterany", "singleton")
MAX_DEPENDENCY_IDS = 1000  # distinct jobs one dependency may name
MAX_DEPENDENCY_TEXT = 64 * 1024  # characters, before parsing
_MAX_ID = 2**63 - 1  # jobs.id is a BIGINT


class Verdict(Enum):
    """How a clause stands right now."""

    MET = 1
    WAITING = 2
    NEVER = 3


def parse_dependency(text: str) -> tuple[Dependency, ...]:
    """Clauses of a ``--dependency`` value such as ``afterok:12:13,singleton``.

    A job named twice in a clause counts once; a dependency names at most
    MAX_DEPENDENCY_IDS distinct jobs (every pass judges each of them)."""
    if len(text) > MAX_DEPENDENCY_TEXT:
        raise DependencyError(f"invalid dependency: {len(text)} characters, more than the "
                              f"{MAX_DEPENDENCY_TEXT} allowed")
    clauses: list[Dependency] = []
    named: set[int] = set()
    for raw in text.split(","):
        if not raw.strip():
            raise DependencyError(f"invalid dependency {text!r}: an empty item")
        kind, _, rest = raw.strip().partition(":")
        if kind not in KINDS:
            raise DependencyError(f"invalid dependency {raw.strip()[:80]!r}: expected one of "
                                  f"{', '.join(KINDS)}")
        if kind == "singleton":
            if rest:
                raise DependencyError("invalid dependency: singleton takes no job ids")
            clauses.append(Dependency(kind))
            continue
        ids = rest.split(":") if rest else []
        if not ids or not all(i.isascii() and i.isdigit() and len(i) <= 19
                              and 0 < int(i) <= _MAX_ID for i in ids):
            shown = raw.strip() if len(raw) <= 80 else raw.strip()[:77] + "..."
            raise DependencyError(f"invalid dependency {shown!r}: expected {kind}:ID[:ID...] "
                                  f"with job ids from 1 to {_MAX_ID}")
        unique = tuple(dict.fromkeys(int(i) for i in ids))
        named.update(unique)
        if len(named) > MAX_DEPENDENCY_IDS:
            raise DependencyError(f"invalid dependency: it names more than "
                                  f"{MAX_DEPENDENCY_IDS} jobs")
        clauses.append(Dependency(kind, unique))
    return tuple(clauses)


@lru_cache(maxsize=4096)
def dependency_clauses(text: str) -> tuple[Dependency, ...]:
    """``parse_dependency``, cached: every pass sees the same stored texts again."""
    return parse_dependency(text)


def _clause(dep: Dependency, states: Mapping[int, JobState]) -> Verdict:
    ended = [states[j] for j in dep.job_ids if j in states and states[j].terminal]
    if dep.kind == "afterok" and any(s is not JobState.COMPLETED for s in ended):
        return Verdict.NEVER
    if dep.kind == "afternotok" and any(s is JobState.COMPLETED for s in ended):
        return Verdict.NEVER
    return Verdict.MET if len(ended) == len(dep.job_ids) else Verdict.WAITING


def dependency_reason(deps: tuple[Dependency, ...], states: Mapping[int, JobState],
                      singleton_busy: bool) -> Reason | None:
    """Why the dependencies hold the job back now, or None when all are met.

    ``states`` has the state of every job the clauses name (a missing one counts as not
    ended); ``singleton_busy`` says whether a same-named job of the user runs.
    """
    verdicts = [Verdict.WAITING if d.kind == "singleton" and singleton_busy
                else Verdict.MET if d.kind == "singleton" else _clause(d, states) for d in deps]
    if Verdict.NEVER in verdicts:
        return Reason.DEPENDENCY_NEVER_SATISFIED
    if Verdict.WAITING in verdicts:
        return Reason.DEPENDENCY
    return None
