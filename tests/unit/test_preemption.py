"""Preemption by QOS: the cheapest victims, a grace time, and no second round."""

from __future__ import annotations

from dataclasses import replace

from gpusched.core.model import (
    PartitionView,
    PendingJob,
    Policy,
    Preemption,
    Reason,
    RunningJob,
    Snapshot,
)
from gpusched.core.plan import plan
from gpusched.core.priority import PriorityWeights
from tests.unit.test_plan import node, reasons

NOW = 10_000.0
ORDER = PriorityWeights(age=1000, fairshare=0, job_size=0, partition=0, qos=0)


def low(job_id: int, where: str, gpus: tuple[int, ...], ran: float, **fields: object) -> RunningJob:
    return replace(RunningJob(job_id, where, tuple(f"{where}-g{i}" for i in gpus), qos="low",
                              start_time=NOW - ran), **fields)  # type: ignore[arg-type]


def snap(running: list[RunningJob], pending: list[PendingJob], nodes: int = 1) -> Snapshot:
    views = tuple(node(f"n{i}", 4) for i in range(nodes))
    return Snapshot(views, (PartitionView("gpu", tuple(v.name for v in views)),),
                    tuple(pending), tuple(running),
                    qos_preempt={"high": frozenset({"low"})})


HIGH = PendingJob(1, "gpu", 2, 1000, NOW - 5, 600, qos="high")


def test_the_victims_are_the_ones_that_lose_the_least_work() -> None:
    running = [low(11, "n0", (0,), 3600), low(12, "n0", (1,), 600), low(13, "n0", (2,), 7200),
               low(14, "n0", (3,), 60)]
    later = PendingJob(2, "gpu", 1, 1000, NOW - 1, 10, qos="low")
    p = plan(snap(running, [HIGH, later]), NOW, Policy(weights=ORDER))
    assert p.preemptions == (Preemption(12, 1, "requeue"), Preemption(14, 1, "requeue"))
    # The freed GPUs are held for job 1 from the end of the grace time; nothing backfills.
    assert [(r.job_id, r.start_time, r.nodes) for r in p.reservations] == [(1, NOW + 30, ("n0",))]
    assert p.starts == () and reasons(p) == {1: Reason.RESOURCES, 2: Reason.PRIORITY}


def test_the_cheapest_node_wins_and_a_multi_gpu_victim_counts_all_its_gpus() -> None:
    running = [low(11, "n0", (0, 1), 100), low(12, "n0", (2, 3), 50),
               low(13, "n1", (0,), 60), low(14, "n1", (1,), 30), low(15, "n1", (2, 3), 5000)]
    p = plan(snap(running, [HIGH], nodes=2), NOW, Policy(weights=ORDER))
    # n0: job 12 alone frees 2 GPUs at a loss of 2 x 50; n1 needs 13 and 14 (60 + 30).
    assert [v.job_id for v in p.preemptions] == [13, 14]
    cancel = plan(snap(running, [HIGH], nodes=2), NOW, Policy(weights=ORDER, preempt_mode="cancel"))
    assert {v.mode for v in cancel.preemptions} == {"cancel"}


def test_jobs_already_stopping_are_not_preempted_again() -> None:
    stopping = [low(11, "n0", (0, 1), 60, preempting=True, end_time=NOW + 20),
                low(12, "n0", (2, 3), 30)]
    p = plan(snap(stopping, [HIGH]), NOW, Policy(weights=ORDER))
    assert p.preemptions == ()
    assert [(r.job_id, r.start_time) for r in p.reservations] == [(1, NOW + 20)]


def test_no_preemption_without_a_qos_that_allows_it_or_when_off() -> None:
    running = [low(11, "n0", (0, 1, 2, 3), 60)]
    normal = replace(HIGH, qos="normal")
    assert plan(snap(running, [normal]), NOW, Policy(weights=ORDER)).preemptions == ()
    assert plan(snap(running, [HIGH]), NOW, Policy(weights=ORDER, preempt_mode="off")).preemptions == ()
    peers = [replace(running[0], qos="high")]
    assert plan(snap(peers, [HIGH]), NOW, Policy(weights=ORDER)).preemptions == ()


def test_a_job_that_fits_now_preempts_nobody() -> None:
    running = [low(11, "n0", (0, 1), 60)]
    p = plan(snap(running, [HIGH]), NOW, Policy(weights=ORDER))
    assert p.preemptions == () and [s.job_id for s in p.starts] == [1]


def test_a_multi_node_job_uses_free_nodes_and_clears_only_what_it_lacks() -> None:
    running = [low(11, "n0", (0, 1, 2, 3), 600), low(12, "n1", (0, 1, 2, 3), 60)]
    wide = PendingJob(1, "gpu", 4, 1000, NOW - 5, 600, qos="high", nodes=2)
    p = plan(snap(running, [wide], nodes=3), NOW, Policy(weights=ORDER))
    assert [v.job_id for v in p.preemptions] == [12]  # n2 is free; n1's job lost least
    assert [(r.start_time, sorted(r.nodes)) for r in p.reservations] == [(NOW + 30, ["n1", "n2"])]
