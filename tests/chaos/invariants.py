"""What must hold after a chaos run, checked from the database history and the job
scripts' records alone. The harness calls, at the end of a run:

    check(Evidence(url, records, node_deaths=(), finished=True)) -> list[str]

one line per violation, ``[rule] job/run/GPU ...``; [] when all hold. ``url``: the
cluster database's SQLAlchemy URL. ``records``: the directory where each run of a job
script leaves one file, ``<job_id>.<restart>`` ($SLURM_JOB_ID, $SLURM_RESTART_COUNT);
its batch script (on the job's first node only) appends, one ``printf ... >> file``
each, ``start <node> <unix time>`` first and ``end <exit code> <unix time>`` last, before
``exit <code>``; lines that do not parse (a torn write) are ignored; a missing
directory is itself reported (``[records]``). ``node_deaths``: (node, unix time) of each
whole-node kill. ``finished``: the run was drained.

Rules, by tag:

- ``state`` (with ``finished``): nothing RUNNING; a PENDING job is held (reason
  JobHeldUser/JobHeldAdmin), or its dependency can never be met (reason
  DependencyNeverSatisfied, which comes before a hold's, as in the pass), or it waits
  (reason Dependency) only on such jobs.
- ``fields``: PENDING: no start or end time, node or open allocation. RUNNING: a start
  time and a node, no end time, open allocations (if it has GPUs) all made at its
  start time, on its nodes, as many as its GPUs (at least, with --exclusive). Ended:
  an end time, no open allocation. No allocation released before it was made.
- ``runs`` (runs = requeues + 1): a job started ``restarts`` runs, one more when its
  current run started (``start_time``, which a requeue clears); each run of a job with
  GPUs is one ``allocated_at`` of its allocations, each run of a batch job one
  ``launch`` command for (job, run), runs 0..n-1 exactly (an allocation, none); a
  records file names a run the database started.
- ``double-start``: two ``start`` lines in one records file; two launch commands for
  one (job, run).
- ``gpu-overlap``: a GPU held whole by one run while another holds it (whole or a
  share): in the allocations' [allocated_at, released_at) intervals, and between the
  ``start`` and ``end`` lines of the runs' scripts (a run that outlived its allocation).
- ``mig-overlap``: a MIG slice held while its parent GPU is (the same two ways).
- ``share-overcommit``: more units of a shared GPU held at one instant than it offers
  (as gacct reads it, db/usage.py ``ShareOffers``; unknown: unchecked).
- ``exit-status``: when the last run of an ended job wrote ``end C`` and no node of the
  run was killed between its ``start`` line and the job's end time (the batch node
  after the line, or another node of a multi-node job, may take the status with it),
  the job's exit_code is C and its state COMPLETED (C = 0) or FAILED/OUT_OF_MEMORY
  (C > 0); or, for a stop that came after the line, TIMEOUT, CANCELLED (being
  stopped) or FAILED (a GPU failure), with a signal instead of C only for the first two.
- ``accounting``: gacct's GPU-hours and billed GPU-hours (db/accounting.py) equal the
  sum over the runs of each allocation's seconds times its fraction of the GPU (and
  its type's billing weight): per job listed (``job_records``), and per account and
  user over every run of their jobs, one back in the queue too (``usage_report``);
  jobs and users still holding GPUs are left out.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy.orm import Session

from gpusched.core import dependency
from gpusched.core.model import JobState, Reason
from gpusched.core.usage import gpu_fraction
from gpusched.db.accounting import job_records, usage_report
from gpusched.db.dependency_states import array_state
from gpusched.db.engine import make_engine
from tests.chaos.history import History, Holding, JobRow, RunRecord, load

ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
HELD_REASONS = {"user": "JobHeldUser", "admin": "JobHeldAdmin"}
DEATH_SLACK = 1.0  # seconds a node death may be noted before the line it cut off
SECONDS_SLACK = 1e-3  # GPU-seconds accounting may differ by (float sums)


@dataclass(frozen=True)
class Evidence:
    """What a chaos run leaves to check (see the module's docstring)."""

    url: str  # SQLAlchemy URL of the cluster's database
    records: Path  # the records directory of the job scripts
    node_deaths: Sequence[tuple[str, float]] = ()  # (node, unix time) of each whole-node kill
    finished: bool = True  # the run was drained: nothing should still run or be queued


def check(evidence: Evidence) -> list[str]:
    """Every invariant violated, one line each naming the job/run/GPU and the rule;
    [] when all hold."""
    problems: list[str] = []
    engine = make_engine(evidence.url, pool_size=1)
    try:
        # One snapshot for every read: the rules compare its parts.
        with Session(engine.execution_options(isolation_level="REPEATABLE READ")) as session, \
                session.begin():
            history = load(session, evidence.records, problems)
            problems += _accounting(session, history)
    finally:
        engine.dispose()
    for rule in (_state, _fields, _runs, _double_starts, _overlaps, _share_overcommit,
                 _exit_status):
        problems += rule(history, evidence)
    return problems


# -- job states and fields ------------------------------------------------------------

def _state(history: History, evidence: Evidence) -> list[str]:
    """With ``finished``: nothing running, nothing pending but held jobs and jobs whose
    dependency can never be met (and jobs waiting only on those), with their reasons."""
    if not evidence.finished:
        return []
    jobs = history.jobs
    problems = [f"[state] job {j.id} is RUNNING after the run was drained"
                for j in jobs.values() if j.state == "RUNNING"]
    groups: dict[int, list[JobRow]] = defaultdict(list)  # a job, or an array's tasks
    for job in jobs.values():
        groups[job.id].append(job)
        if job.array_job_id is not None and job.array_job_id != job.id:
            groups[job.array_job_id].append(job)
    pending = {j.id: j for j in jobs.values() if j.state == "PENDING"}
    judged = {job_id: _dependency(job, groups) for job_id, job in pending.items()}
    expected: dict[int, str] = {}  # legitimately pending job -> the reason it must show
    for job_id, job in pending.items():
        if judged[job_id][0] is Reason.DEPENDENCY_NEVER_SATISFIED:
            expected[job_id] = Reason.DEPENDENCY_NEVER_SATISFIED.value
        elif job.hold is not None:
            expected[job_id] = HELD_REASONS.get(job.hold, "JobHeldUser")
    grew = True
    while grew:  # waiting on jobs that are themselves legitimately pending
        grew = False
        for job_id, (reason, waits_on) in judged.items():
            if job_id not in expected and reason is Reason.DEPENDENCY \
                    and waits_on <= expected.keys():
                expected[job_id], grew = Reason.DEPENDENCY.value, True
    for job_id, job in sorted(pending.items()):
        if job_id not in expected:
            problems.append(f"[state] job {job_id} is PENDING (reason {job.reason}) after "
                            "the run was drained: neither held nor waiting on a dependency "
                            "that can never be met")
        elif job.reason != expected[job_id]:
            problems.append(f"[state] job {job_id} is PENDING with reason {job.reason}, "
                            f"expected {expected[job_id]}")
    return problems


def _dependency(job: JobRow, groups: dict[int, list[JobRow]]) -> tuple[Reason | None, set[int]]:
    """Why ``job``'s dependency holds it back (None: it does not, or it has none or one
    that does not parse), as the pass judges it with nothing of its name running, and
    the unended jobs it names (every task of an array it names)."""
    if not job.dependency:
        return None, set()
    try:
        clauses = dependency.dependency_clauses(job.dependency)
    except dependency.DependencyError:
        return None, set()
    states: dict[int, JobState] = {}
    waits_on: set[int] = set()
    for named in {j for clause in clauses for j in clause.job_ids}:
        group = groups.get(named, [])
        if group:
            states[named] = array_state([JobState(j.state) for j in group])
        waits_on |= {j.id for j in group if j.state not in ENDED} if group else {named}
    return dependency.dependency_reason(clauses, states, False), waits_on


def _fields(history: History, evidence: Evidence) -> list[str]:
    """A job's columns and its open allocations agree with its state."""
    open_of: dict[int, list[Holding]] = defaultdict(list)
    for holding in history.holdings:
        if holding.released_at is None:
            open_of[holding.job_id].append(holding)
    problems = [f"[fields] {History.where(h)}: GPU {h.gpu_id} released before it was "
                "allocated" for h in history.holdings if h.until < h.allocated_at]
    for job in sorted(history.jobs.values(), key=lambda j: j.id):
        held = open_of.get(job.id, [])
        where = f"[fields] job {job.id} ({job.state})"
        if job.state == "PENDING":
            wrong = [name for name, value in (("a start time", job.start_time),
                                              ("an end time", job.end_time),
                                              ("a node", job.node_id)) if value is not None]
            if held:
                wrong.append(f"{len(held)} open allocation(s)")
            if wrong:
                problems.append(f"{where} has {', '.join(wrong)}")
        elif job.state in ENDED:
            if job.end_time is None:
                problems.append(f"{where} has ended but has no end time")
            if held:
                problems.append(f"{where} has ended but still holds GPUs "
                                f"{sorted(h.gpu_id for h in held)}")
        else:
            problems += _running_fields(history, job, held, where)
    return problems


def _running_fields(history: History, job: JobRow, held: list[Holding], where: str
                    ) -> list[str]:
    problems = []
    if job.start_time is None or job.node_id is None or job.end_time is not None:
        problems.append(f"{where} lacks a start time or a node, or has an end time")
    if job.gpus == 0 and not held:
        return problems
    nodes = set(job.node_names) or {history.node_names.get(job.node_id or 0, "")}
    if len(held) < job.gpus or (len(held) > job.gpus and not job.exclusive):
        problems.append(f"{where} holds {len(held)} GPU(s) open, not its {job.gpus}")
    if any(h.allocated_at != job.start_time for h in held):
        problems.append(f"{where}: open allocations not made at its start time")
    if any(h.node not in nodes for h in held):
        problems.append(f"{where}: open allocations on nodes "
                        f"{sorted({h.node for h in held} - nodes)} it does not run on")
    return problems


# -- runs -----------------------------------------------------------------------------

def _runs(history: History, evidence: Evidence) -> list[str]:
    """runs = requeues + 1, counted in allocations, launch commands and records."""
    launched: dict[int, set[int]] = defaultdict(set)
    for job_id, run in history.launches:
        launched[job_id].add(run)
    problems = []
    for job in sorted(history.jobs.values(), key=lambda j: j.id):
        runs = job.restarts + (job.start_time is not None)
        where = f"[runs] job {job.id} (restarts {job.restarts}, {job.state})"
        allocated = history.runs_held.get(job.id, 0)
        if (job.gpus > 0 or allocated) and allocated != runs:
            problems.append(f"{where}: {allocated} run(s) in its allocations, expected {runs}")
        expected = set() if job.interactive else set(range(runs))
        if launched.get(job.id, set()) != expected:
            problems.append(f"{where}: launch commands for runs "
                            f"{sorted(launched.get(job.id, ()))}, expected {sorted(expected)}")
    for job_id, run in sorted(history.records):
        row = history.jobs.get(job_id)
        if row is None or run >= row.restarts + (row.start_time is not None):
            problems.append(f"[runs] job {job_id} run {run} ran (records file "
                            f"{job_id}.{run}) but the database never started that run")
    return problems


def _double_starts(history: History, evidence: Evidence) -> list[str]:
    problems = [f"[double-start] job {job_id} run {run} started {len(record.starts)} times "
                f"({', '.join(node for node, _ in record.starts)})"
                for (job_id, run), record in sorted(history.records.items())
                if len(record.starts) > 1]
    problems += [f"[double-start] job {job_id} run {run} has {n} launch commands"
                 for (job_id, run), n in sorted(history.launches.items()) if n > 1]
    return problems


# -- GPUs -------------------------------------------------------------------------------

def _overlapping(holdings: Iterable[Holding]) -> Iterable[tuple[Holding, Holding]]:
    """Each pair of ``holdings`` of different runs whose intervals overlap."""
    ordered = sorted(holdings, key=lambda h: (h.allocated_at, h.job_id))
    for i, first in enumerate(ordered):
        for second in ordered[i + 1:]:
            if second.allocated_at >= first.until:
                break
            if (second.job_id, second.run) != (first.job_id, first.run):
                yield first, second


def _overlaps(history: History, evidence: Evidence) -> list[str]:
    """No GPU held whole by one run while another run holds it; no MIG slice held while
    its parent GPU is: in the allocations, and between the start and end lines of the
    scripts that wrote both (a run that outlived its allocation, unfenced)."""
    scripts = [replace(held, allocated_at=record.starts[0][1], released_at=record.ends[-1][1])
               for held in history.holdings
               if (record := history.records.get((held.job_id, held.run))) is not None
               and record.starts and record.ends]
    return (_held_twice(history.holdings, "held by")
            + _held_twice(scripts, "in use by the scripts (start to end line) of"))


def _held_twice(holdings: list[Holding], how: str) -> list[str]:
    by_gpu: dict[int, list[Holding]] = defaultdict(list)
    for held in holdings:
        by_gpu[held.gpu_id].append(held)
    problems = []
    for gpu_id, held_on in sorted(by_gpu.items()):
        for a, b in _overlapping(held_on):
            if a.units is None or b.units is None:
                problems.append(f"[gpu-overlap] GPU {gpu_id} on {a.node} {how} "
                                f"{History.where(a)} and {History.where(b)} at once "
                                f"(from {b.allocated_at:.3f})")
    for gpu_id, held_on in sorted(by_gpu.items()):
        parent = held_on[0].parent_id
        if parent is None or parent not in by_gpu:
            continue
        for a, b in _overlapping(held_on + by_gpu[parent]):
            if {a.gpu_id, b.gpu_id} == {gpu_id, parent}:
                problems.append(f"[mig-overlap] MIG slice {gpu_id} and its parent GPU "
                                f"{parent} {how} {History.where(a)} and "
                                f"{History.where(b)} at once")
    return problems


def _share_overcommit(history: History, evidence: Evidence) -> list[str]:
    """At no instant do a shared GPU's holders hold more units than it offers."""
    events: dict[int, list[tuple[float, int, int, Holding]]] = defaultdict(list)
    for held in history.holdings:
        if held.units is not None and held.of is not None:
            events[held.gpu_id].append((held.allocated_at, held.units, held.of, held))
            if held.released_at is not None:
                events[held.gpu_id].append((held.released_at, -held.units, held.of, held))
    problems = []
    for gpu_id, moments in sorted(events.items()):
        used, worst = 0, None
        for at, change, offered, held in sorted(moments, key=lambda e: (e[0], e[1])):
            used += change  # at one instant, releases come first
            if used > offered and (worst is None or used > worst[0]):
                worst = (used, at, offered, held)
        if worst is not None:
            used, at, offered, held = worst
            problems.append(f"[share-overcommit] GPU {gpu_id} on {held.node}: {used} units "
                            f"held at {at:.3f} (when {History.where(held)} took "
                            f"{held.units}), it offers {offered}")
    return problems


# -- exit statuses ----------------------------------------------------------------------

def _exit_status(history: History, evidence: Evidence) -> list[str]:
    """The exit status the last run of an ended job wrote is the job's in the database."""
    problems = []
    for job in sorted(history.jobs.values(), key=lambda j: j.id):
        record = history.records.get((job.id, job.restarts))
        if job.state not in ENDED or record is None or not record.ends \
                or job.start_time is None:
            continue
        code = record.ends[-1][0]
        node = record.starts[0][0] if record.starts else None
        if _died_under(history, job, record, evidence.node_deaths):
            continue  # its status may have died with a node before it was reported
        states = {"COMPLETED"} if code == 0 else {"FAILED", "OUT_OF_MEMORY"}
        states.add("TIMEOUT")
        if job.stopping:
            states.add("CANCELLED")
        if job.gpu_failure is not None:
            states.add("FAILED")
        killed_after_line = job.signal is not None and job.state in ("TIMEOUT", "CANCELLED")
        if job.state not in states or (job.exit_code != code and not killed_after_line):
            why = f" ({job.error_message})" if job.error_message else ""
            problems.append(f"[exit-status] job {job.id} run {job.restarts} exited {code} "
                            f"(on {node}) but the database has {job.state} with exit code "
                            f"{job.exit_code}, signal {job.signal}{why}")
    return problems


def _died_under(history: History, job: JobRow, record: RunRecord,
                deaths: Sequence[tuple[str, float]]) -> bool:
    """Whether a node of the job's last run was killed between the run's start (its
    end line when it has no start line) and the job's end in the database."""
    nodes = {node for node, _ in record.starts} | set(job.node_names)
    nodes.add(history.node_names.get(job.node_id or 0, ""))
    began = min([at for _, at in record.starts] or [record.ends[-1][1]]) - DEATH_SLACK
    ended = math.inf if job.end_time is None else job.end_time
    return any(node in nodes and began <= at <= ended for node, at in deaths)


# -- accounting ---------------------------------------------------------------------------

def _run_seconds(history: History) -> dict[int, tuple[float, float]]:
    """GPU-seconds and billed GPU-seconds of each job with no open allocation, summed
    over its runs."""
    totals: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    still_held = {h.job_id for h in history.holdings if h.released_at is None}
    for held in history.holdings:
        if held.job_id in still_held or held.released_at is None:
            continue
        seconds = max(0.0, held.released_at - held.allocated_at) * gpu_fraction(held.units,
                                                                                 held.of)
        totals[held.job_id][0] += seconds
        totals[held.job_id][1] += seconds * held.weight
    return {job_id: (a, b) for job_id, (a, b) in totals.items()}


def _accounting(session: Session, history: History) -> list[str]:
    """gacct's GPU-hours per job, and per (account, user) over all of their jobs'
    runs (a job back in the queue too), equal the sums over the runs."""
    runs = _run_seconds(history)
    still_held = {h.job_id for h in history.holdings if h.released_at is None}
    busy = {history.jobs[job_id].owner for job_id in still_held if job_id in history.jobs}
    problems = []
    for record in job_records(session):
        job_id = record["job_id"]
        if job_id in still_held:
            continue
        gpu_s, billed_s = runs.get(job_id, (0.0, 0.0))
        reported = (record["gpu_hours"] * 3600, record["billed_gpu_hours"] * 3600)
        if not _close(reported, (gpu_s, billed_s)):
            problems.append(f"[accounting] job {job_id}: gacct reports {reported[0]:.3f} "
                            f"GPU-s ({reported[1]:.3f} billed), its runs sum to "
                            f"{gpu_s:.3f} ({billed_s:.3f})")
    expected: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for job_id, (gpu_s, billed_s) in runs.items():
        if job_id in history.jobs:
            total = expected[history.jobs[job_id].owner]
            total[0] += gpu_s
            total[1] += billed_s
    now = datetime.now(UTC)
    report = {(row["account"] or "", row["user"]):
              (row["gpu_hours"] * 3600, row["billed_gpu_hours"] * 3600)
              for row in usage_report(session, datetime(1970, 1, 2, tzinfo=UTC),
                                      now + timedelta(days=1))}
    for owner in sorted((report.keys() | expected.keys()) - busy):
        reported = report.get(owner, (0.0, 0.0))
        gpu_s, billed_s = expected.get(owner, [0.0, 0.0])
        if not _close(reported, (gpu_s, billed_s)):
            problems.append(f"[accounting] account {owner[0] or '-'} user {owner[1]}: "
                            f"gacct's usage report has {reported[0]:.3f} GPU-s "
                            f"({reported[1]:.3f} billed), the runs of their jobs sum to "
                            f"{gpu_s:.3f} ({billed_s:.3f})")
    return problems


def _close(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return all(math.isclose(x, y, rel_tol=1e-9, abs_tol=SECONDS_SLACK) for x, y in zip(a, b))

