"""Where started jobs run: each one's node and the GPUs of its current run."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpusched.db.models import Allocation, Gpu, Node


def latest_gpus_sql(job: str, node: str | None = None) -> str:
    """SQL for the UUIDs, in index order, of the GPUs of the latest run of job ``job``
    (a column or expression): those allocated last, as job_placements reads them; with
    ``node`` (a node id column or expression), only those on that node."""
    on_node = "" if node is None else f" AND g.node_id = {node}"
    return ("ARRAY(SELECT g.uuid FROM allocations AS a JOIN gpus AS g ON g.id = a.gpu_id"
            f" WHERE a.job_id = {job}{on_node} AND a.allocated_at = (SELECT max(b.allocated_at)"
            f" FROM allocations AS b WHERE b.job_id = {job}) ORDER BY g.index, g.id)")


def latest_share_sql(job: str) -> str:
    """SQL for the share of a GPU that the latest run of job ``job`` holds, as a JSON
    array [GPU UUID, units, GPU memory MB] (NULL: none)."""
    return ("(SELECT json_build_array(g.uuid, a.units, a.mem_mb) FROM allocations AS a"
            f" JOIN gpus AS g ON g.id = a.gpu_id WHERE a.job_id = {job} AND a.units IS NOT NULL"
            " ORDER BY a.allocated_at DESC LIMIT 1)")


def job_placements(session: Session, jobs: Iterable[tuple[int, int | None]]
                   ) -> dict[int, tuple[str, list[str]]]:
    """Node name and GPU UUIDs (in index order) of each started job of ``jobs``, given
    as (job id, node id) pairs."""
    started = {job_id: node_id for job_id, node_id in jobs if node_id is not None}
    if not started:
        return {}
    names: dict[int, str] = dict(session.execute(select(Node.id, Node.name).where(
        Node.id.in_(set(started.values())))).all())
    placed: dict[int, tuple[str, list[str]]] = {
        job_id: (names[node_id], []) for job_id, node_id in started.items()}
    # A requeued job keeps the allocations of its earlier runs: show its latest run's.
    latest: dict[int, datetime] = {}
    rows = session.execute(
        select(Allocation.job_id, Gpu.uuid, Allocation.allocated_at)
        .join(Gpu, Gpu.id == Allocation.gpu_id)
        .where(Allocation.job_id.in_(list(placed))).order_by(Allocation.job_id, Gpu.index, Gpu.id)
    ).all()
    for job_id, _, at in rows:
        latest[job_id] = max(at, latest.get(job_id, at))
    for job_id, uuid, at in rows:
        if at == latest[job_id]:
            placed[job_id][1].append(uuid)
    return placed
