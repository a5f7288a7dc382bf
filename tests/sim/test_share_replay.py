"""Replays of traces with fractions of GPUs (shares): the replay's kept occupancy and
carriers decide as fresh passes do, and no GPU is ever given more than all of it."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.sim.cluster import SimCluster, uniform
from gpusched.sim.replay import SimPolicy, simulate
from gpusched.sim.traces import TraceJob

POLICIES = [SimPolicy(backfill=b, kill=k) for b in ("none", "easy", "conservative")
            for k in (True, False)]


def _workload(draw: st.DrawFn) -> list[TraceJob]:
    jobs, at = [], 0.0
    for job_id in range(1, draw(st.integers(3, 30)) + 1):
        at += draw(st.sampled_from([0.0, 0.0, 1.0, 3.0, 10.0]))
        limit = draw(st.sampled_from([5, 10, 20, 40, 100]))
        run = draw(st.sampled_from([limit, limit // 2, limit + 5, 1]))
        milli = draw(st.sampled_from([0, 0, 100, 250, 460, 500, 900]))
        jobs.append(TraceJob(job_id, at, float(run), limit,
                             1 if milli else draw(st.sampled_from([1, 1, 2, 4])),
                             cpus=draw(st.sampled_from([0, 0, 2, 8])), gpu_milli=milli))
    return jobs


def _never_over_committed(records, jobs) -> None:
    milli = {job.job_id: job.gpu_milli or 1000 for job in jobs}
    events: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for r in records:
        for uuid in r.gpu_uuids:
            events[uuid] += [(r.start, milli[r.job_id]), (r.end, -milli[r.job_id])]
    for uuid, changes in events.items():
        held = 0
        for _, change in sorted(changes, key=lambda c: (c[0], c[1])):  # ends first
            held += change
            assert held <= 1000, uuid


@settings(max_examples=80, deadline=None)
@given(st.composite(_workload)(), st.sampled_from(POLICIES),
       st.sampled_from([uniform(2, 2), uniform(3, 1)]))
def test_share_replays_decide_as_fresh_passes_do(jobs: list[TraceJob], policy: SimPolicy,
                                                 cluster: SimCluster) -> None:
    fast = simulate(jobs, cluster, policy)
    slow = simulate(jobs, cluster, policy, shortcuts=False)
    assert fast.records == slow.records
    assert fast.never == slow.never
    _never_over_committed(fast.records, jobs)


def test_fractions_share_one_gpu_and_count_as_fractions() -> None:
    jobs = [TraceJob(1, 0.0, 10.0, 10, 1, gpu_milli=500),
            TraceJob(2, 0.0, 10.0, 10, 1, gpu_milli=500),
            TraceJob(3, 0.0, 10.0, 10, 1, gpu_milli=100)]
    result = simulate(jobs, uniform(1, 1), SimPolicy())
    by_id = {r.job_id: r for r in result.records}
    assert by_id[1].start == by_id[2].start == 0.0 and by_id[3].start == 10.0
    assert by_id[1].gpu_uuids == by_id[2].gpu_uuids
    assert by_id[1].gpus == 0.5 and by_id[3].gpus == 0.1
