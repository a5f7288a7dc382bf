"""Multifactor priority, as in Slurm: a weighted sum of factors that each lie in [0, 1].

The factors: age (time waiting, capped at ``max_age``), fair-share (from the account
tree), job size (GPUs over the cluster's GPUs; or the reverse with ``favor_small``),
partition tier and QOS priority (each over the largest configured). The total is the
weighted sum divided by the sum of the weights, so it also lies in [0, 1] and two
clusters' priorities read alike whatever weights they use.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

WEEK = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class PriorityWeights:
    """How much each factor counts (Slurm's PriorityWeight*), and the age cap."""

    age: float = 1000.0
    fairshare: float = 10000.0
    job_size: float = 1000.0
    partition: float = 1000.0
    qos: float = 1000.0
    max_age: float = WEEK
    favor_small: bool = False


@dataclass(frozen=True, slots=True)
class PriorityScale:
    """Cluster-wide maxima that turn raw values into factors."""

    cluster_gpus: int
    max_partition_tier: int = 0
    max_qos_priority: int = 0


@dataclass(frozen=True, slots=True)
class PriorityInput:
    """What priority needs to know about one pending job."""

    job_id: int
    eligible_time: float  # when it became eligible to run: age counts from here
    gpus: int
    fairshare: float
    partition_tier: int = 0
    qos_priority: int = 0


@dataclass(frozen=True, slots=True)
class PriorityBreakdown:
    """A job's factors and its total, for ordering and for ``gpusched prio``."""

    job_id: int
    age: float
    fairshare: float
    job_size: float
    partition: float
    qos: float
    total: float


def _fraction(value: float, whole: float) -> float:
    if whole <= 0:
        return 0.0
    return min(max(value / whole, 0.0), 1.0)


def job_priority(job: PriorityInput, now: float, weights: PriorityWeights,
                 scale: PriorityScale) -> PriorityBreakdown:
    """The factors and weighted total of one job at time ``now``."""
    age = _fraction(now - job.eligible_time, weights.max_age)
    size = _fraction(job.gpus, scale.cluster_gpus)
    if weights.favor_small:
        size = 1.0 - size
    fairshare = min(max(job.fairshare, 0.0), 1.0)
    partition = _fraction(job.partition_tier, scale.max_partition_tier)
    qos = _fraction(job.qos_priority, scale.max_qos_priority)
    weight_sum = (weights.age + weights.fairshare + weights.job_size + weights.partition
                  + weights.qos)
    weighted = (weights.age * age + weights.fairshare * fairshare + weights.job_size * size
                + weights.partition * partition + weights.qos * qos)
    total = weighted / weight_sum if weight_sum > 0 else 0.0
    return PriorityBreakdown(job.job_id, age, fairshare, size, partition, qos, total)


def priorities(jobs: Iterable[PriorityInput], now: float, weights: PriorityWeights,
               scale: PriorityScale) -> list[PriorityBreakdown]:
    """Breakdowns of many jobs, highest priority first (ties: lower job id first)."""
    result = [job_priority(job, now, weights, scale) for job in jobs]
    result.sort(key=lambda b: (-b.total, b.job_id))
    return result
