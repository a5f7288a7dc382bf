"""Scheduling-quality figures of a simulation.

Wait = start - submit; run = the time it actually ran; JCT = end - submit. Bounded
slowdown is max(1, (wait + run) / max(run, 10 s)), which keeps very short jobs from
dominating the mean. Utilisation is busy GPU-seconds over the cluster's GPU-seconds
from the first submit to the last end. Percentiles interpolate linearly between the
two nearest ranks (numpy's default).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpusched.sim.replay import JobRecord

KEYS = ("jobs", "makespan_s", "utilization", "avg_wait_s", "p50_wait_s", "p95_wait_s",
        "avg_bounded_slowdown", "avg_jct_s", "max_wait_s")
BOUND_S = 10.0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of sorted ``values``, linearly interpolated."""
    if not values:
        return 0.0
    rank = (len(values) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (rank - low)


def metrics(records: Sequence[JobRecord], cluster_gpus: int) -> dict[str, float | int]:
    """The figures of one simulation, keyed as ``KEYS``."""
    if not records:
        return {key: 0 for key in KEYS}
    first = min(r.submit for r in records)
    last = max(r.end for r in records)
    span = last - first
    waits = sorted(r.wait for r in records)
    busy = sum(r.gpus * r.run for r in records)
    count = len(records)
    return {
        "jobs": count,
        "makespan_s": span,
        "utilization": busy / (cluster_gpus * span) if span > 0 and cluster_gpus else 0.0,
        "avg_wait_s": sum(waits) / count,
        "p50_wait_s": percentile(waits, 50),
        "p95_wait_s": percentile(waits, 95),
        "avg_bounded_slowdown": sum(
            max(1.0, (r.wait + r.run) / max(r.run, BOUND_S)) for r in records) / count,
        "avg_jct_s": sum(r.end - r.submit for r in records) / count,
        "max_wait_s": waits[-1],
    }
