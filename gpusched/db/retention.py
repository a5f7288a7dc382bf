"""Purging finished jobs (Slurm's PurgeJobAfter): which rows may go, what an archive
keeps of them, and their deletion (the files themselves: controller/retention.py).

A job may be purged once it ended (a terminal state) before the horizon, and:
- no pending or running job's dependency names it, or the array it belongs to (a
  missing job counts as not ended, so its dependent would wait for ever);
- every row of its array may be purged too (an array goes as a whole);
- nothing of it is still held or in flight: no unreleased allocation, no running step,
  no node command its agent has not done.

and it did not end within the current period of a GPU-hour budget that covers it: a
budget's usage is read from the allocations of its period (``db/budgets.py``), so its
jobs stay until the period is over (for ever under a budget without a period).

Fair-share usage is not derived from these rows: ``db/usage.py`` accrues what running
jobs hold into ``fairshare_usage``, which a purge leaves alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import Table, func, select, text
from sqlalchemy.orm import Session

from gpusched.core.budgets import ancestors, period_start
from gpusched.core.dependency import DependencyError, dependency_clauses
from gpusched.core.usage import gpu_fraction
from gpusched.db.accounting import job_records
from gpusched.db.budgets import BUDGETS, budget_rows
from gpusched.db.models import Allocation, Gpu, GpuBilling, Job, JobStep, Node
from gpusched.db.usage import ShareOffers

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "DEADLINE")
_TERMINAL_SQL = ", ".join(f"'{s}'" for s in TERMINAL)

# The purgeable jobs (see the module's docstring), oldest ids first, locked (a job
# another transaction holds is left to the next batch). ``only``: among these ids.
_PURGEABLE = text(f"""
SELECT j.id FROM jobs j
WHERE j.state IN ({_TERMINAL_SQL}) AND j.end_time < :horizon
  AND (CAST(:only AS bigint[]) IS NULL OR j.id = ANY(CAST(:only AS bigint[])))
  AND j.id <> ALL(CAST(:kept AS bigint[]))
  AND coalesce(j.array_job_id, j.id) <> ALL(CAST(:kept AS bigint[]))
  AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.job_id = j.id AND a.released_at IS NULL)
  AND NOT EXISTS (SELECT 1 FROM job_steps s WHERE s.job_id = j.id AND s.state = 'RUNNING')
  AND NOT EXISTS (SELECT 1 FROM node_commands c WHERE c.job_id = j.id AND c.done_at IS NULL)
  AND NOT EXISTS (SELECT 1 FROM unnest(CAST(:budget_accounts AS text[]),
                                       CAST(:budget_users AS text[]),
                                       CAST(:budget_floors AS timestamptz[])) AS b(account, u, floor)
                  WHERE b.account = j.account AND (b.u IS NULL OR b.u = j.user_name)
                    AND j.end_time > b.floor)
  AND (j.array_job_id IS NULL OR NOT EXISTS (
        SELECT 1 FROM jobs o WHERE o.array_job_id = j.array_job_id
          AND NOT (o.state IN ({_TERMINAL_SQL}) AND o.end_time < :horizon)))
ORDER BY j.id LIMIT :limit
FOR UPDATE OF j SKIP LOCKED""")

_BUDGETS = text("SELECT " + BUDGETS)
_TREE = text("SELECT name, parent FROM accounts")
_EVER = datetime(1970, 1, 1, tzinfo=UTC)  # the floor of a budget without a period

_DELETE_JOBS = text("DELETE FROM jobs WHERE id = ANY(CAST(:ids AS bigint[])) RETURNING script_id")
# The scripts of the deleted jobs that no job (an array's other tasks) still runs.
_DELETE_SCRIPTS = text(
    "DELETE FROM job_scripts s WHERE s.id = ANY(CAST(:ids AS bigint[])) "
    "AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.script_id = s.id) RETURNING s.id")
_PRESENT = text("SELECT id FROM jobs WHERE id = ANY(CAST(:ids AS bigint[]))")


def kept_by_dependencies(session: Session) -> list[int]:
    """The jobs (or arrays) a pending or running job's dependency names."""
    named: set[int] = set()
    for (dependency,) in session.execute(
            select(Job.dependency).where(Job.state.in_(("PENDING", "RUNNING")),
                                         Job.dependency.is_not(None))):
        try:
            clauses = dependency_clauses(dependency)
        except DependencyError:  # stored texts were parsed at submit; keep going
            continue
        for clause in clauses:
            named.update(clause.job_ids)
    return sorted(named)


def budget_floors(session: Session, now: datetime) -> list[tuple[str, str | None, datetime]]:
    """(account, user or None for all its users, floor): a job of that account (and
    user) that ended after the floor is counted by a budget in force (its period began
    then; for ever, the earliest time, for a budget without a period). An account's
    budget covers every account under it."""
    found = budget_rows(session.execute(_BUDGETS).scalar_one())
    if not found:
        return []
    parents: dict[str, str | None] = {name: parent for name, parent in session.execute(_TREE)}
    floors: dict[tuple[str, str | None], datetime] = {}
    for account, user, _, period in found:
        began = period_start(period, now.timestamp())
        floor = _EVER if began is None else datetime.fromtimestamp(began, UTC)
        covered = [account] if user is not None else [
            name for name in {*parents, account} if account in ancestors(parents, name)]
        for name in covered:
            key = (name, user)
            floors[key] = min(floor, floors.get(key, floor))
    return [(account, user, floor) for (account, user), floor in sorted(
        floors.items(), key=lambda item: (item[0][0], item[0][1] or ""))]


def lock_purgeable(session: Session, horizon: datetime, limit: int,
                   only: Sequence[int] | None = None) -> list[int]:
    """Up to ``limit`` jobs that may be purged (ended before ``horizon``), locked for
    the rest of the transaction; ``only``: among these ids."""
    kept = kept_by_dependencies(session)
    floors = budget_floors(session, datetime.now(UTC))
    rows = session.execute(_PURGEABLE, {
        "horizon": horizon, "kept": kept, "limit": limit,
        "only": None if only is None else list(only),
        "budget_accounts": [a for a, _, _ in floors], "budget_users": [u for _, u, _ in floors],
        "budget_floors": [f for _, _, f in floors]})
    return [job_id for (job_id,) in rows]


def present(session: Session, ids: Sequence[int]) -> set[int]:
    """Which of ``ids`` are still stored."""
    return {job_id for (job_id,) in session.execute(_PRESENT, {"ids": list(ids)})}


def archive_entries(session: Session, ids: Sequence[int]) -> list[dict[str, Any]]:
    """What an archive keeps of each of ``ids``, by id: ``record``, what gacct shows
    (``db.accounting.job_records``), and the rows themselves: ``job`` (every column but
    the script's), ``allocations`` (with the GPU, its node, the fraction of the GPU
    held and the billing weight) and ``steps``."""
    wanted = set(ids)
    records = {r["job_id"]: r for r in job_records(session, ids=sorted(wanted))
               if r["job_id"] in wanted}
    jobs = {row["id"]: row for row in _rows(session, Job.__table__, Job.id, wanted)}
    steps: dict[int, list[dict[str, Any]]] = {}
    for row in _rows(session, JobStep.__table__, JobStep.job_id, wanted):
        steps.setdefault(row["job_id"], []).append(row)
    held = _allocations(session, wanted)
    return [{"record": records[job_id], "job": jobs[job_id],
             "allocations": held.get(job_id, []),
             "steps": sorted(steps.get(job_id, []), key=lambda s: s["step_id"])}
            for job_id in sorted(jobs)]


def _rows(session: Session, table: Any, key: Any, ids: set[int]) -> list[dict[str, Any]]:
    assert isinstance(table, Table)
    return [{name: _plain(value) for name, value in row.items()}
            for row in session.execute(select(table).where(key.in_(sorted(ids)))).mappings()]


def _allocations(session: Session, ids: set[int]) -> dict[int, list[dict[str, Any]]]:
    offers = ShareOffers(session)
    found: dict[int, list[dict[str, Any]]] = {}
    rows = session.execute(
        select(Allocation.job_id, Allocation.gpu_id, Allocation.allocated_at,
               Allocation.released_at, Allocation.units, Allocation.mem_mb, Node.name,
               Gpu.index, Gpu.uuid, Gpu.gpu_type, Gpu.mig_profile, Job.partition,
               func.coalesce(GpuBilling.weight, 1.0))
        .join(Job, Job.id == Allocation.job_id)
        .join(Gpu, Gpu.id == Allocation.gpu_id)
        .outerjoin(Node, Node.id == Allocation.node_id)
        .outerjoin(GpuBilling, GpuBilling.gpu_type == Gpu.gpu_type)
        .where(Allocation.job_id.in_(sorted(ids)))
        .order_by(Allocation.job_id, Allocation.allocated_at, Gpu.index))
    for (job_id, gpu_id, held_from, held_to, units, mem, node, index, uuid, gpu_type,
         profile, partition, weight) in rows:
        of = offers.of(units, node or "", partition)
        found.setdefault(job_id, []).append({
            "gpu_id": gpu_id, "node": node, "gpu_index": index, "gpu_uuid": uuid,
            "gpu_type": gpu_type, "mig_profile": profile, "allocated_at": _plain(held_from),
            "released_at": _plain(held_to), "units": units, "of": of, "mem_mb": mem,
            "fraction": gpu_fraction(units, of), "weight": float(weight)})
    return found


def _plain(value: Any) -> Any:
    """A column's value as JSON holds it (times in ISO 8601)."""
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return value


def delete_jobs(session: Session, ids: Sequence[int]) -> tuple[int, int]:
    """Delete ``ids`` (their allocations, steps and node commands go with them) and
    the scripts no other job runs; the jobs and scripts deleted."""
    if not ids:
        return 0, 0
    deleted = [script for (script,) in session.execute(_DELETE_JOBS, {"ids": list(ids)})]
    scripts = sorted(set(deleted))
    gone = session.execute(_DELETE_SCRIPTS, {"ids": scripts}).all() if scripts else []
    return len(deleted), len(gone)
