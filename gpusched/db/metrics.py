"""What the controller's metrics and ``gpusched diag`` read from the database: one
statement per scrape, each part driven by an index (the active jobs by
``ix_jobs_active``, their GPUs by the allocations' primary key), so that a scrape
costs the same on a database with years of finished jobs as on a new one.

A GPU's state, first that holds: ``down`` (its node is DOWN), ``unhealthy`` (taken
out of service by a fault), ``allocated`` (held by a running job, whole or a share),
``drained`` (drained by an administrator, or on a DRAIN node), ``idle``. Only GPUs
that can be handed out are counted: a MIG slice, not the GPU it is cut from; a GPU
no longer present is left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

__all__ = ["ClusterCounts", "read_counts"]

# The running jobs' GPUs: every allocation still held belongs to a RUNNING job.
_HELD = """
    SELECT a.gpu_id, j.account, j.partition, a.units
      FROM jobs j JOIN allocations a ON a.job_id = j.id AND a.released_at IS NULL
     WHERE j.state = 'RUNNING'
"""

_COUNTS = text(f"""
WITH held AS ({_HELD})
SELECT
  (SELECT coalesce(json_agg(json_build_array(state, partition, reason, n)), '[]')
     FROM (SELECT state, partition, reason, count(*) AS n FROM jobs
            WHERE state IN ('PENDING', 'RUNNING')
            GROUP BY state, partition, reason) AS jobs) AS jobs,
  (SELECT coalesce(json_agg(json_build_array(state, gpu_type, profile, n)), '[]')
     FROM (SELECT CASE WHEN n.state = 'DOWN' THEN 'down'
                       WHEN NOT g.healthy AND coalesce(g.health_reason, '') NOT LIKE 'drained:%'
                         THEN 'unhealthy'
                       WHEN EXISTS (SELECT 1 FROM held h WHERE h.gpu_id = g.id) THEN 'allocated'
                       WHEN NOT g.healthy OR n.state = 'DRAIN' THEN 'drained'
                       ELSE 'idle' END AS state,
                  coalesce(g.gpu_type, '') AS gpu_type, coalesce(g.mig_profile, '') AS profile,
                  count(*) AS n
             FROM gpus g JOIN nodes n ON n.id = g.node_id
            WHERE g.present
              AND NOT EXISTS (SELECT 1 FROM gpus c WHERE c.parent_id = g.id AND c.present)
            GROUP BY 1, 2, 3) AS gpus) AS gpus,
  -- A heartbeat stamped (by its controller's clock) after this transaction began is
  -- age 0, not a negative one.
  (SELECT coalesce(json_agg(json_build_array(
            name, state, greatest(0, extract(epoch FROM now() - last_seen))) ORDER BY name),
            '[]')
     FROM nodes) AS nodes,
  (SELECT coalesce(json_agg(json_build_array(account, held)), '[]')
     FROM (SELECT coalesce(h.account, '') AS account,
                  sum(CASE WHEN h.units IS NULL THEN 1.0
                           ELSE h.units::float8 / greatest(coalesce(p.shares, h.units), 1)
                      END) AS held
             FROM held h LEFT JOIN partitions p ON p.name = h.partition
            GROUP BY 1) AS accounts) AS accounts,
  extract(epoch FROM now()) AS now
""")


@dataclass(frozen=True)
class ClusterCounts:
    """The cluster as one scrape sees it."""

    # (state, partition, reason, jobs) of the pending and running jobs (an array's
    # pending record counts once, however many tasks it still holds)
    jobs: tuple[tuple[str, str, str, int], ...]
    gpus: tuple[tuple[str, str, str, int], ...]  # (state, type, MIG profile or "", GPUs)
    # (node, state, seconds since its agent was last heard, None if never)
    nodes: tuple[tuple[str, str, float | None], ...]
    accounts: tuple[tuple[str, float], ...]  # (account or "", GPUs its running jobs hold)
    now: float  # the database's clock, epoch seconds


def read_counts(session: Session) -> ClusterCounts:
    """Jobs, GPUs, nodes and the GPUs each account holds, in one statement."""
    row = session.execute(_COUNTS).one()
    return ClusterCounts(
        jobs=tuple((str(s), str(p), str(r), int(n)) for s, p, r, n in _json(row.jobs)),
        gpus=tuple((str(s), str(t), str(m), int(n)) for s, t, m, n in _json(row.gpus)),
        nodes=tuple((str(name), str(state), None if age is None else float(age))
                    for name, state, age in _json(row.nodes)),
        accounts=tuple((str(a), float(h)) for a, h in _json(row.accounts)),
        now=float(row.now))


def _json(value: Any) -> list[Any]:
    """A json column as psycopg returns it (parsed already), or its text."""
    return json.loads(value) if isinstance(value, str) else list(value or [])
