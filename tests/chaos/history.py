"""What the chaos invariants read (tests/chaos/invariants.py): the jobs, every GPU
allocation by run, the launch commands, and the run files the job scripts wrote, loaded
once from one snapshot of the database."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from sqlalchemy import text
from sqlalchemy.orm import Session

from gpusched.db.usage import ShareOffers


class JobRow(NamedTuple):
    """The columns of one job the rules read (times in unix seconds), as _JOBS reads them."""

    id: int
    state: str
    reason: str
    hold: str | None
    dependency: str | None
    restarts: int
    start_time: float | None
    end_time: float | None
    node_id: int | None
    node_names: list[str]
    exit_code: int | None
    signal: int | None
    gpus: int
    exclusive: bool
    interactive: bool
    stopping: bool  # cancel_requested_at set: a cancel, preemption or requeue under way
    gpu_failure: str | None
    array_job_id: int | None
    account: str  # "" for none
    user: str
    error_message: str | None

    @property
    def owner(self) -> tuple[str, str]:
        """(account, user): a line of gacct's usage report."""
        return self.account, self.user


@dataclass(frozen=True)
class Holding:
    """One allocation row: a GPU held by one run of a job (``units`` None: whole); the
    job's runs are its allocations' distinct ``allocated_at``, in order."""

    job_id: int
    run: int
    gpu_id: int
    node: str
    allocated_at: float
    released_at: float | None
    units: int | None
    parent_id: int | None
    weight: float
    of: int | None  # the units the GPU offers, for a share (None: unknown or whole)

    @property
    def until(self) -> float:
        return math.inf if self.released_at is None else self.released_at


@dataclass
class RunRecord:
    """What one run's script wrote: its ``start`` (node, time) and ``end`` (code, time)."""

    starts: list[tuple[str, float]] = field(default_factory=list)
    ends: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class History:
    """Everything the rules read, loaded once."""

    jobs: dict[int, JobRow]
    holdings: list[Holding]
    launches: Counter[tuple[int, int]]
    node_names: dict[int, str]
    records: dict[tuple[int, int], RunRecord]
    runs_held: dict[int, int] = field(default_factory=dict)  # job -> its runs with GPUs

    def __post_init__(self) -> None:
        for held in self.holdings:
            self.runs_held[held.job_id] = max(self.runs_held.get(held.job_id, 0), held.run + 1)

    @staticmethod
    def where(held: Holding) -> str:
        return f"job {held.job_id} run {held.run}"


_JOBS = text(
    "SELECT id, state, reason, hold, dependency, restarts,"
    " CAST(EXTRACT(EPOCH FROM start_time) AS float8),"
    " CAST(EXTRACT(EPOCH FROM end_time) AS float8), node_id, COALESCE(node_names, '{}'),"
    " exit_code, signal, gpus, exclusive, interactive, cancel_requested_at IS NOT NULL,"
    " gpu_failure, array_job_id, COALESCE(account, ''), user_name, error_message FROM jobs")
_HOLDINGS = text(
    "SELECT a.job_id,"
    " dense_rank() OVER (PARTITION BY a.job_id ORDER BY a.allocated_at) - 1, a.gpu_id, n.name,"
    " CAST(EXTRACT(EPOCH FROM a.allocated_at) AS float8),"
    " CAST(EXTRACT(EPOCH FROM a.released_at) AS float8), a.units, g.parent_id,"
    " COALESCE(b.weight, 1.0), j.partition FROM allocations a JOIN gpus g ON g.id = a.gpu_id"
    " JOIN nodes n ON n.id = a.node_id JOIN jobs j ON j.id = a.job_id"
    " LEFT JOIN gpu_billing b ON b.gpu_type = g.gpu_type")
_LAUNCHES = text("SELECT job_id, run, count(*) FROM node_commands"
                 " WHERE kind = 'launch' AND job_id IS NOT NULL GROUP BY job_id, run")


def load(session: Session, records: Path, problems: list[str]) -> History:
    """Every job, allocation and launch of the database, and the run files of
    ``records`` (a problem noted when the directory is missing)."""
    jobs = {row[0]: JobRow(*row) for row in session.execute(_JOBS)}
    node_names: dict[int, str] = {
        node_id: name for node_id, name in session.execute(text("SELECT id, name FROM nodes"))}
    offers = ShareOffers(session)  # the units a shared GPU offers, as gacct reads them
    holdings = []
    for job_id, run, gpu_id, node, at, until, units, parent, weight, partition in \
            session.execute(_HOLDINGS):
        of = offers.of(units, node, partition)
        holdings.append(Holding(job_id, run, gpu_id, node, at, until, units, parent,
                                float(weight), of))
    launches: Counter[tuple[int, int]] = Counter(
        {(job_id, run): n for job_id, run, n in session.execute(_LAUNCHES)})
    return History(jobs, holdings, launches, node_names, _records(records, problems))


def _records(directory: Path, problems: list[str]) -> dict[tuple[int, int], RunRecord]:
    """The run files of ``directory`` by (job id, run)."""
    if not directory.is_dir():
        problems.append(f"[records] records directory {directory} does not exist")
        return {}
    found: dict[tuple[int, int], RunRecord] = {}
    for path in directory.iterdir():
        job, _, run = path.name.partition(".")
        if not (job.isdigit() and run.isdigit()) or not path.is_file():
            continue
        record = found[(int(job), int(run))] = RunRecord()
        for line in path.read_text(errors="replace").splitlines():
            word = line.split()
            try:
                if len(word) == 3 and word[0] == "start":
                    record.starts.append((word[1], float(word[2])))
                elif len(word) == 3 and word[0] == "end":
                    record.ends.append((int(word[1]), float(word[2])))
            except ValueError:
                continue
    return found
