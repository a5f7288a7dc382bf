"""The scheduler makes exactly the decisions of an independent reference.

``tests/reference/scheduler.py`` is FCFS, EASY and conservative backfill written from the
textbook definitions over a pool of interchangeable GPUs. Here the same workloads are
replayed through ``plan()`` by the simulator (``gpusched.sim.replay.simulate``, as
``gpusched simulate`` runs it: first come first served, no pass budget, no reservation
depth but the mode's own) on clusters where which GPU a job gets cannot matter:

- ``nodes``: N nodes with 1 GPU each, a job of k GPUs asking for k nodes;
- ``gpus``: 1 node with N GPUs, every job on that one node.

Every job must start and end at the same moments in both. Run times never pass time
limits, so whether a job is killed at its limit cannot matter either.

Conservative backfill agrees on both shapes because the scheduler counts the units of
interchangeable nodes as the textbook's profile does (``core/pools.py``): on 1-GPU nodes
a reservation is a count over its interval, and nodes are named only when a job starts.
The smallest workload on which holding named nodes from the moment of reserving went
wrong (6 nodes x 1 GPU; id, submit, GPUs, limit = run time) is kept as a hand case:
(1, 0, 2, 73), (2, 0, 3, 80), (3, 1, 4, 10), (4, 2, 2, 25), (5, 3, 1, 75); job 5 starts
at 3 in both.

The first tests hold the reference itself to schedules worked out by hand.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.sim.cluster import uniform
from gpusched.sim.replay import SimPolicy, simulate
from gpusched.sim.traces import TraceJob, read_swf
from tests.reference.scheduler import POLICIES, Job
from tests.reference.scheduler import simulate as reference

DATA = Path(__file__).resolve().parents[1] / "data"
# The reference's policy -> the simulator's backfill mode.
BACKFILL = {"fcfs": "none", "easy": "easy", "conservative": "conservative"}
SHAPES = ("nodes", "gpus")
# What the scheduler is held to: every policy on both shapes.
CASES = [(policy, shape) for policy in POLICIES for shape in SHAPES]

Times = dict[int, tuple[float, float]]


def by_reference(jobs: list[Job], total: int, policy: str) -> Times:
    """(start, end) of every job under the reference."""
    return {job_id: (o.start, o.end) for job_id, o in reference(jobs, total, policy).items()}


def by_gpusched(jobs: list[Job], total: int, policy: str, shape: str,
                kill: bool = True) -> Times:
    """(start, end) of every job replayed through the scheduler's own pass (``kill``:
    the replay that ends jobs at their limits, which also extends a pass with arrivals
    instead of running a fresh one; with run times within limits the two must agree)."""
    cluster = uniform(total, 1) if shape == "nodes" else uniform(1, total)
    trace = [TraceJob(j.job_id, j.submit, j.runtime, int(j.limit), j.gpus) for j in jobs]
    result = simulate(trace, cluster, SimPolicy(order="fcfs", backfill=BACKFILL[policy],
                                                kill=kill))
    assert result.never == []
    return {r.job_id: (r.start, r.end) for r in result.records}


def assert_same_schedule(jobs: list[Job], total: int, policy: str, shape: str,
                         kill: bool = True) -> None:
    expected = by_reference(jobs, total, policy)
    got = by_gpusched(jobs, total, policy, shape, kill)
    wrong = [(job_id, expected[job_id], got.get(job_id)) for job_id in sorted(expected)
             if got.get(job_id) != expected[job_id]]
    assert not wrong and set(got) == set(expected), (
        f"{policy} on {total} GPUs ({shape}): (job, reference, gpusched) "
        f"{wrong[:5]} of {len(wrong)} differing")


# -- the reference, by hand --------------------------------------------------------------

def job(job_id: int, submit: float, gpus: int, limit: float, runtime: float | None = None) -> Job:
    return Job(job_id, submit, gpus, limit, limit if runtime is None else runtime)


def starts(jobs: list[Job], total: int, policy: str) -> dict[int, float]:
    return {job_id: o.start for job_id, o in reference(jobs, total, policy).items()}


# 4 GPUs: A holds 2 until 100; B needs 3 and must wait for it; C needs 1 for a long time.
# At 100 four GPUs are free for B's three: one is extra, so EASY starts C at once.
EXTRA = [job(1, 0, 2, 100), job(2, 1, 3, 100), job(3, 2, 1, 1000)]

# 6 GPUs: A holds 4 until 100; B (4) is the head, shadow 100, extra 2; C needs all 6; D
# fits now beside A and runs long. EASY lets D use the extra and so delay C (only the
# head is protected); conservative gives C a reservation at 200 that D may not delay.
DELAY = [job(1, 0, 4, 100), job(2, 1, 4, 100), job(3, 2, 6, 10), job(4, 3, 2, 300)]

# 4 GPUs: B needs all 4 at 100 (extra 0); C ends before then, D would not.
SHADOW = [job(1, 0, 2, 100), job(2, 1, 4, 100), job(3, 2, 1, 50), job(4, 3, 1, 200)]

# 6 GPUs: the workload of the module docstring. Profile after W (job 3, 4 GPUs at 80)
# and P (job 4, 2 GPUs at 73 to 98): 1 GPU free until 73, 1 until 80, none until 90.
# Q (job 5) needs 1 GPU until 78: it fits now.
COUNTED = [job(1, 0, 2, 73), job(2, 0, 3, 80), job(3, 1, 4, 10), job(4, 2, 2, 25),
           job(5, 3, 1, 75)]


@pytest.mark.parametrize("jobs,total,policy,expected", [
    (EXTRA, 4, "fcfs", {1: 0, 2: 100, 3: 100}),
    (EXTRA, 4, "easy", {1: 0, 2: 100, 3: 2}),
    (EXTRA, 4, "conservative", {1: 0, 2: 100, 3: 2}),
    (DELAY, 6, "fcfs", {1: 0, 2: 100, 3: 200, 4: 210}),
    (DELAY, 6, "easy", {1: 0, 2: 100, 3: 303, 4: 3}),
    (DELAY, 6, "conservative", {1: 0, 2: 100, 3: 200, 4: 210}),
    (SHADOW, 4, "fcfs", {1: 0, 2: 100, 3: 200, 4: 200}),
    (SHADOW, 4, "easy", {1: 0, 2: 100, 3: 2, 4: 200}),
    (SHADOW, 4, "conservative", {1: 0, 2: 100, 3: 2, 4: 200}),
    (COUNTED, 6, "conservative", {1: 0, 2: 0, 3: 80, 4: 73, 5: 3}),
])
def test_the_reference_gives_the_hand_computed_schedule(
        jobs: list[Job], total: int, policy: str, expected: dict[int, float]) -> None:
    assert starts(jobs, total, policy) == expected


@pytest.mark.parametrize("policy", POLICIES)
def test_reference_tie_breaks(policy: str) -> None:
    # Same submit time: lower id first, whatever the order given.
    assert starts([job(2, 0, 2, 10), job(1, 0, 2, 10)], 2, policy) == {1: 0, 2: 10}
    # An end and a submit at the same time: the end is applied before scheduling.
    assert starts([job(1, 0, 2, 10), job(2, 10, 2, 10)], 2, policy) == {1: 0, 2: 10}
    # A job that runs 0 s gives its GPUs back at once and scheduling runs again then.
    done = reference([job(1, 0, 2, 10, 0), job(2, 0, 2, 10, 5)], 2, policy)
    assert [(o.start, o.end) for o in (done[1], done[2])] == [(0, 0), (0, 5)]
    # An early end brings the next job forward: plans use limits, starts use real ends.
    assert starts([job(1, 0, 2, 100, 30), job(2, 1, 2, 10)], 2, policy) == {1: 0, 2: 30}


@pytest.mark.parametrize("jobs,total,policy,message", [
    ([job(1, 0, 3, 10)], 2, "easy", "asks for 3 GPUs of 2"),
    ([job(1, 0, 1, 10, 11)], 2, "easy", "run time 11 is not within"),
    ([job(1, 0, 1, 0)], 2, "easy", "time limit 0 is not finite"),
    ([job(1, 0, 1, float("inf"))], 2, "easy", "time limit inf is not finite"),
    ([job(1, 0, 1, 10), job(1, 5, 1, 10)], 2, "easy", "job 1 appears twice"),
    ([job(1, 0, 1, 10)], 2, "sjf", "unknown policy 'sjf'"),
])
def test_the_reference_refuses_what_it_does_not_model(
        jobs: list[Job], total: int, policy: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        reference(jobs, total, policy)


# -- gpusched against the reference: random workloads ----------------------------------

@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[Job], int]:
    """Up to 40 jobs on up to 16 GPUs, submitted within a minute (many at the same second),
    limits and run times short enough that they overlap, ends often at submit times."""
    total = draw(st.integers(1, 16))
    count = draw(st.integers(1, 40))
    jobs = []
    for job_id in range(1, count + 1):
        limit = draw(st.integers(1, 50))
        jobs.append(Job(job_id, draw(st.integers(0, 60)), draw(st.integers(1, total)), limit,
                        draw(st.integers(0, limit))))
    return jobs, total


@pytest.mark.parametrize("policy,shape", CASES)
@settings(max_examples=150, deadline=None)
@given(workload=workloads(), kill=st.booleans())
def test_gpusched_makes_the_references_decisions(
        workload: tuple[list[Job], int], kill: bool, policy: str, shape: str) -> None:
    jobs, total = workload
    assert_same_schedule(jobs, total, policy, shape, kill)


# -- gpusched against the reference: windows of real logs -------------------------------

# (log, processors of its machine, first job of the window): windows where the queue
# builds up, so that most jobs wait and the three policies part ways.
WINDOWS = [
    ("SDSC-SP2-1998-4.2-cln.swf.gz", 128, 1500),
    ("SDSC-SP2-1998-4.2-cln.swf.gz", 128, 42000),
    ("KTH-SP2-1996-2.1-cln.swf.gz", 100, 4500),
    ("KTH-SP2-1996-2.1-cln.swf.gz", 100, 18000),
]
WINDOW_JOBS = 300


@cache
def trace_jobs(name: str, skip: int) -> list[TraceJob]:
    """The log's jobs skip+1 to skip+WINDOW_JOBS, as tests/data keeps them (the header
    and those jobs' lines of the log: tests/data/README.md)."""
    sample = DATA / name.replace(".swf.gz", f".window{skip}.swf")
    return read_swf(sample).jobs


def window(name: str, processors: int, skip: int) -> list[Job]:
    """The window's jobs, processors as GPUs, each run time cut to its limit (the logs
    hold jobs that ran past it); jobs wider than the machine are left out."""
    return [Job(j.job_id, j.submit, j.gpus, j.time_limit, min(j.run_time, j.time_limit))
            for j in trace_jobs(name, skip) if j.gpus <= processors]


@pytest.mark.parametrize("policy,shape", CASES)
@pytest.mark.parametrize("name,processors,skip", WINDOWS)
def test_gpusched_replays_log_windows_as_the_reference(
        name: str, processors: int, skip: int, policy: str, shape: str) -> None:
    jobs = window(name, processors, skip)
    assert len(jobs) > WINDOW_JOBS * 0.9
    assert_same_schedule(jobs, processors, policy, shape)


def test_the_log_windows_tell_the_policies_apart() -> None:
    """The windows are worth replaying: in each, many jobs wait under FCFS, and EASY and
    conservative each start many jobs at other times than FCFS and than each other."""
    for name, processors, skip in WINDOWS:
        jobs = window(name, processors, skip)
        fcfs, easy, conservative = (starts(jobs, processors, p) for p in POLICIES)
        waited = sum(fcfs[j.job_id] > j.submit for j in jobs)
        assert waited > len(jobs) // 2, (name, skip, waited)
        for a, b in ((fcfs, easy), (fcfs, conservative), (easy, conservative)):
            assert sum(a[k] != b[k] for k in a) > len(jobs) // 5, (name, skip)
