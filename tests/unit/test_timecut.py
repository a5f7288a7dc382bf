"""--time-min, --deadline and --nice in the pass (core/timecut.py, core/ordering.py):
the search for the longest cut limit against a plain reference (hypothesis), and small
hand-made queues: a job backfilled with its limit cut, one ended past its deadline, one
started with its limit cut to its deadline, and nice moving jobs in the queue."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.explain import explain
from gpusched.core.model import (
    PartitionView,
    PendingJob,
    Policy,
    Reason,
    RunningJob,
    Snapshot,
    Start,
    StartKind,
)
from gpusched.core.ordering import queue_order
from gpusched.core.plan import plan
from gpusched.core.priority import PriorityWeights
from gpusched.core.timecut import MINUTE, capped, cut_start, past_deadline
from gpusched.core.units import Shape
from tests.unit.test_plan import node

AGE_ONLY = PriorityWeights(age=1000, fairshare=0, job_size=0, partition=0, qos=0)


def pj(job_id: int, gpus: int, limit: int | None, **fields: object) -> PendingJob:
    return replace(PendingJob(job_id, "gpu", gpus, 1000, -100.0 + job_id, limit),
                   **fields)  # type: ignore[arg-type]


# -- the search, against a reference ----------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 20000), st.integers(0, 25000))
def test_the_longest_cut_that_fits(time_min: int, limit: int, room: int) -> None:
    """``place`` finds room for any run of at most ``room`` seconds: the answer is the
    longest whole-minute limit below the job's own that fits (or time_min itself)."""
    job = pj(1, 1, limit, time_min=time_min)
    tried: list[float] = []

    def place(shape: Shape) -> str | None:
        tried.append(shape.duration)
        return "here" if shape.duration <= room else None

    found = cut_start(job, place)
    candidates = [m * MINUTE for m in range(0, limit // MINUTE + 1)
                  if time_min < m * MINUTE < limit and m * MINUTE <= room]
    if time_min >= limit or time_min > room:
        assert found is None
    else:
        assert found is not None and found[0] == "here"
        assert found[1].duration == max([time_min, *candidates])
    assert len(tried) <= 2 + max(1, limit // MINUTE).bit_length()  # a halving search


def test_deadline_rules() -> None:
    job = pj(1, 1, 3600, deadline=10_000.0)
    assert not past_deadline(job, 6400.0) and past_deadline(job, 6401.0)
    assert capped(job, 0.0) is job  # without time_min the whole limit must fit
    short = replace(job, time_min=600)
    assert not past_deadline(short, 9400.0) and past_deadline(short, 9401.0)
    assert capped(short, 7000.0).time_limit == 3000  # whole minutes to the deadline
    assert capped(short, 9390.0).time_limit == 600  # never below time_min
    assert capped(short, 0.0).time_limit == 3600
    assert not past_deadline(pj(2, 1, None), 1e12)


# -- the pass -------------------------------------------------------------------------

# One 4-GPU node: a running job holds 2 GPUs for an hour; job 1 wants all 4 and gets the
# reservation at t=3600.
RUNNING = (RunningJob(90, "n0", ("n0-g0", "n0-g1"), end_time=3600.0),)


def decide(*jobs: PendingJob, now: float = 0.0, running: tuple[RunningJob, ...] = RUNNING,
           estimates: bool = True) -> tuple[dict[int, Start], dict[int, Reason]]:
    snap = Snapshot((node("n0", 4),), (PartitionView("gpu", ("n0",)),), jobs, running)
    result = plan(snap, now, Policy(weights=AGE_ONLY, backfill="easy", estimates=estimates))
    return ({s.job_id: s for s in result.starts},
            {p.job_id: p.reason for p in result.pending})


def test_backfill_cuts_a_time_min_jobs_limit() -> None:
    head = pj(1, 4, 7200)
    starts, pending = decide(head, pj(2, 2, 7200))
    assert starts == {} and pending[2] is Reason.PRIORITY  # it would delay job 1
    starts, pending = decide(head, pj(2, 2, 7200, time_min=1800))
    start = starts[2]
    assert (start.time_limit, start.kind) == (3600, StartKind.BACKFILLED)  # ends in time
    starts, _ = decide(head, pj(2, 2, 7200, time_min=1800), now=100.0)
    assert starts[2].time_limit == 3480  # whole minutes, before t=3600
    starts, pending = decide(head, pj(2, 2, 7200, time_min=4000))
    assert 2 not in starts  # even its least limit would delay job 1
    starts, _ = decide(pj(3, 2, 7200, time_min=60))
    assert starts[3].time_limit is None  # room for its whole limit: nothing is cut


def test_a_job_like_one_that_failed_still_tries_a_cut_limit() -> None:
    """The pass's shortcut for a job needing what another could not have (no
    estimates: nothing else to work out for it) must not skip the shorter runs."""
    for estimates in (True, False):
        starts, pending = decide(pj(1, 4, 7200), pj(2, 1, 7200), pj(3, 1, 7200, time_min=600),
                                 estimates=estimates)
        assert 2 not in starts and starts[3].time_limit == 3600, estimates


def test_deadlines_in_the_pass() -> None:
    starts, pending = decide(pj(1, 1, 3600, deadline=1000.0), running=())
    assert pending == {1: Reason.DEADLINE} and starts == {}
    starts, pending = decide(pj(1, 1, 600, deadline=1000.0), running=())
    assert starts[1].time_limit is None
    # With time_min its limit is cut to end by the deadline.
    starts, pending = decide(pj(1, 1, 7200, time_min=600, deadline=3000.0), running=())
    assert starts[1].time_limit == 3000
    # Past the deadline whatever else holds it back: it can never run.
    starts, pending = decide(pj(1, 1, 600, deadline=100.0, hold="user"), running=())
    assert pending == {1: Reason.DEADLINE}
    snap = Snapshot((node("n0", 4),), (PartitionView("gpu", ("n0",)),),
                    (pj(1, 1, 600, deadline=100.0),))
    why = explain(snap, 0.0, Policy(weights=AGE_ONLY), 1)
    assert why.reason is Reason.DEADLINE and "deadline" in why.blockers[0].detail


def test_nice_moves_a_job_in_the_queue() -> None:
    jobs = (pj(1, 1, None), pj(2, 1, None), pj(3, 1, None))
    snap = Snapshot((node("n0", 4),), (PartitionView("gpu", ("n0",)),), jobs)
    policy = Policy(weights=AGE_ONLY)
    assert [j.job_id for j in queue_order(snap, 0.0, policy)] == [1, 2, 3]
    niced = replace(snap, pending=(replace(jobs[0], nice=100), jobs[1], jobs[2]))
    assert [j.job_id for j in queue_order(niced, 0.0, policy)] == [2, 3, 1]
    raised = replace(snap, pending=(jobs[0], jobs[1], replace(jobs[2], nice=-100)))
    assert [j.job_id for j in queue_order(raised, 0.0, policy)] == [3, 1, 2]
    # With every weight 0 (submit order), nice still counts.
    flat = Policy(weights=PriorityWeights(age=0, fairshare=0, job_size=0, partition=0, qos=0))
    assert [j.job_id for j in queue_order(niced, 0.0, flat)] == [2, 3, 1]
    # An administrator's priority is taken as it is, nice or not.
    fixed = replace(snap, pending=(replace(jobs[0], nice=100, priority=5.0), *jobs[1:]))
    assert [j.job_id for j in queue_order(fixed, 0.0, policy)][0] == 1


def test_both_backfill_modes_cut_the_limit_on_several_nodes() -> None:
    """Conservative backfill places through its pools of like nodes: the same cut."""
    running = (RunningJob(90, "n0", ("n0-g0", "n0-g1"), end_time=3600.0),)
    for mode in ("easy", "conservative"):
        for time_min, expected in ((None, None), (1800, 3600)):
            snap = Snapshot((node("n0", 4), node("n1", 4)),
                            (PartitionView("gpu", ("n0", "n1")),),
                            (pj(1, 4, 7200, nodes=2), pj(2, 4, 7200, time_min=time_min)),
                            running)
            result = plan(snap, 0.0, Policy(weights=AGE_ONLY, backfill=mode))
            starts = {s.job_id: s for s in result.starts}
            if expected is None:
                assert starts == {}, mode
            else:
                assert (starts[2].node, starts[2].time_limit) == ("n1", expected), mode
