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
from operator import itemgetter
from typing import NamedTuple

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


class PriorityInput(NamedTuple):
    """What priority needs to know about one pending job.

    A NamedTuple rather than a frozen dataclass: a queue builds tens of thousands per
    pass, and a tuple is several times cheaper to build.
    """

    job_id: int
    eligible_time: float  # when it became eligible to run: age counts from here
    gpus: int
    fairshare: float
    partition_tier: int = 0
    qos_priority: int = 0


class PriorityBreakdown(NamedTuple):
    """A job's factors and its total, for ordering and for ``gpusched prio``."""

    job_id: int
    age: float
    fairshare: float
    job_size: float
    partition: float
    qos: float
    total: float


def _inverse(whole: float) -> float:
    return 1.0 / whole if whole > 0 else 0.0


class _Scorer:
    """Weights and scale folded into constants once, then applied to many jobs."""

    def __init__(self, weights: PriorityWeights, scale: PriorityScale) -> None:
        w = weights
        weight_sum = w.age + w.fairshare + w.job_size + w.partition + w.qos
        norm = 1.0 / weight_sum if weight_sum > 0 else 0.0
        self.weights = (w.age * norm, w.fairshare * norm, w.job_size * norm,
                        w.partition * norm, w.qos * norm)
        self.inverses = (_inverse(w.max_age), _inverse(scale.cluster_gpus),
                         _inverse(scale.max_partition_tier), _inverse(scale.max_qos_priority))
        self.favor_small = w.favor_small

    def score(self, job: PriorityInput, now: float) -> PriorityBreakdown:
        """One job's breakdown."""
        return self.score_all((job,), now)[0]

    def score_all(self, jobs: Iterable[tuple[int, float, int, float, int, int]],
                  now: float) -> list[PriorityBreakdown]:
        """The breakdowns of jobs given as tuples of ``PriorityInput``'s six fields (a
        ``PriorityInput`` is one), in their order."""
        inv_age, inv_gpus, inv_tier, inv_qos = self.inverses
        w_age, w_fs, w_size, w_part, w_qos = self.weights
        favor_small = self.favor_small
        result: list[PriorityBreakdown] = []
        add = result.append
        for job_id, eligible_time, gpus, fairshare, partition_tier, qos_priority in jobs:
            # Each factor clamped to [0, 1], written out: this runs once per pending job.
            age = (now - eligible_time) * inv_age
            age = 0.0 if age < 0.0 else 1.0 if age > 1.0 else age
            size = gpus * inv_gpus
            size = 0.0 if size < 0.0 else 1.0 if size > 1.0 else size
            if favor_small:
                size = 1.0 - size
            fairshare = 0.0 if fairshare < 0.0 else 1.0 if fairshare > 1.0 else fairshare
            partition = partition_tier * inv_tier
            partition = 0.0 if partition < 0.0 else 1.0 if partition > 1.0 else partition
            qos = qos_priority * inv_qos
            qos = 0.0 if qos < 0.0 else 1.0 if qos > 1.0 else qos
            total = (w_age * age + w_fs * fairshare + w_size * size + w_part * partition
                     + w_qos * qos)
            add(PriorityBreakdown(job_id, age, fairshare, size, partition, qos, total))
        return result


def job_priority(job: PriorityInput, now: float, weights: PriorityWeights,
                 scale: PriorityScale) -> PriorityBreakdown:
    """The factors and weighted total of one job at time ``now``."""
    return _Scorer(weights, scale).score(job, now)


def priorities(jobs: Iterable[PriorityInput], now: float, weights: PriorityWeights,
               scale: PriorityScale) -> list[PriorityBreakdown]:
    """Breakdowns of many jobs, highest priority first (ties: lower job id first)."""
    return ranked_fields(jobs, now, weights, scale)


def scored_fields(jobs: Iterable[tuple[int, float, int, float, int, int]], now: float,
                  weights: PriorityWeights, scale: PriorityScale) -> list[PriorityBreakdown]:
    """The breakdowns of jobs given as plain tuples of ``PriorityInput``'s six fields,
    in their order."""
    return _Scorer(weights, scale).score_all(jobs, now)


def ranked_fields(jobs: Iterable[tuple[int, float, int, float, int, int]], now: float,
                  weights: PriorityWeights, scale: PriorityScale) -> list[PriorityBreakdown]:
    """``priorities`` of jobs given as plain tuples of ``PriorityInput``'s six fields
    (a ``PriorityInput`` is one): a queue need not build a named tuple per job."""
    result = scored_fields(jobs, now, weights, scale)
    # Stable sorts: by job id, then by total, highest first (``reverse`` keeps equal
    # totals in job id order).
    result.sort(key=itemgetter(0))
    result.sort(key=itemgetter(6), reverse=True)
    return result
