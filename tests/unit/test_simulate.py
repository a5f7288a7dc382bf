"""Trace replay: hand-computed schedules, their figures, and the replay's shortcuts.

``tests/data/sim_backfill_1x4.swf`` on one node with 4 GPUs, worked out by hand:

- Job 1 (1 GPU, limit 10 s, runs 20 s) starts at 10 and is killed at its limit, 20.
- Job 2 (1 GPU, 40 s) starts at 12 and ends at 52.
- Job 3 (4 GPUs, 10 s) must wait for job 2: reservation at 52, runs 52-62, always.
- Job 4 (3 GPUs, 20 s, submitted at 13) and job 5 (1 GPU, limit 20 s, runs 10 s,
  submitted at 18) differ:
  - no backfill: both wait behind job 3 and start at 62;
  - EASY: job 5 fits now and ends (38 at its limit) before job 3's reservation at 52,
    so it starts at 18; when it ends at 28, 3 GPUs are free and job 4 ends (48) before
    52: it starts at 28;
  - conservative: job 4 gets a reservation too, at 20 (job 1's limit), on 3 of the 4
    GPUs. Job 5 would leave only 2 free at 20, so it may not start at 18; after job 4
    the next room for it clashes with job 3, so it starts at 62. Job 4 starts at 20.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.model import RunningJob, Snapshot
from gpusched.core.plan import SchedulingPass, queue_order
from gpusched.errors import ConfigError, UsageError
from gpusched.sim.cluster import parse_cluster, uniform
from gpusched.sim.metrics import KEYS, metrics, percentile
from gpusched.sim.replay import SimPolicy, job_shape, simulate
from gpusched.sim.traces import TraceJob, read_swf

DATA = Path(__file__).resolve().parents[1] / "data"


def starts(backfill: str, trace: str = "sim_backfill_1x4.swf", nodes: int = 1,
           kill: bool = True) -> dict[int, tuple[float, float, str]]:
    jobs = read_swf(DATA / trace).jobs
    result = simulate(jobs, uniform(nodes, 4), SimPolicy(backfill=backfill, kill=kill))
    return {r.job_id: (r.start, r.end, r.state) for r in result.records}


@pytest.mark.parametrize("backfill,expected", [
    ("none", {4: 62.0, 5: 62.0}),
    ("easy", {4: 28.0, 5: 18.0}),
    ("conservative", {4: 20.0, 5: 62.0}),
])
def test_each_backfill_mode_gives_its_hand_computed_schedule(
        backfill: str, expected: dict[int, float]) -> None:
    got = starts(backfill)
    assert got[1] == (10.0, 20.0, "TIMEOUT")
    assert got[2] == (12.0, 52.0, "COMPLETED")
    assert got[3] == (52.0, 62.0, "COMPLETED")
    assert {job: got[job][0] for job in (4, 5)} == expected
    assert got[4][1] == expected[4] + 20 and got[5][1] == expected[5] + 10


def test_no_kill_lets_a_job_run_past_its_limit() -> None:
    got = starts("easy", kill=False)
    assert got[1] == (10.0, 30.0, "COMPLETED")


def test_easy_figures_worked_out_by_hand() -> None:
    result = simulate(read_swf(DATA / "sim_backfill_1x4.swf").jobs, uniform(1, 4), SimPolicy())
    figures = metrics(result.records, result.cluster_gpus)
    assert set(figures) == set(KEYS)
    # waits 0, 0, 40, 15, 0; runs 10 (killed), 40, 10, 20, 10; ends 20, 52, 62, 48, 28
    assert figures["jobs"] == 5
    assert figures["makespan_s"] == 52.0  # 62 - 10
    assert figures["utilization"] == pytest.approx((10 + 40 + 40 + 60 + 10) / (4 * 52))
    assert figures["avg_wait_s"] == 11.0
    assert figures["p50_wait_s"] == 0.0
    assert figures["p95_wait_s"] == pytest.approx(15 + (40 - 15) * 0.8)
    assert figures["max_wait_s"] == 40.0
    # bounded slowdowns 1, 1, (40 + 10) / 10, (15 + 20) / 20, 1
    assert figures["avg_bounded_slowdown"] == pytest.approx((1 + 1 + 5 + 1.75 + 1) / 5)
    assert figures["avg_jct_s"] == pytest.approx((10 + 40 + 50 + 35 + 10) / 5)


def test_a_wide_job_spans_nodes_and_a_small_one_backfills_beside_it() -> None:
    jobs = read_swf(DATA / "sim_multinode_2x4.swf").jobs
    easy = simulate(jobs, uniform(2, 4), SimPolicy()).records
    none = simulate(jobs, uniform(2, 4), SimPolicy(backfill="none")).records
    wide = easy[0]
    assert wide.nodes == ("node01", "node02") and wide.gpus == 6
    assert len({u for u in wide.gpu_uuids}) == 6
    assert (easy[1].start, easy[1].nodes) == (100.0, ("node01",))
    assert (easy[2].start, easy[2].nodes, easy[2].backfilled) == (2.0, ("node01",), True)
    assert not set(easy[2].gpu_uuids) & set(wide.gpu_uuids)
    assert [r.start for r in none] == [0.0, 100.0, 100.0]
    assert not none[2].backfilled


def test_shape_of_a_trace_job() -> None:
    job = TraceJob(7, 0.0, 10.0, 60, gpus=13, cpus=10, mem_mb=1000)
    pending = job_shape(job, 8, "sim")
    assert (pending.nodes, pending.gpus, pending.cpus, pending.mem_mb) == (2, 7, 5, 500)
    assert job_shape(replace(job, gpus=8), 8, "sim").nodes == 1


def test_jobs_too_big_for_the_cluster_are_left_out_and_named() -> None:
    jobs = [TraceJob(1, 0.0, 5.0, 10, 2), TraceJob(2, 1.0, 5.0, 10, 9), TraceJob(3, 2.0, 5.0, 10, 1)]
    result = simulate(jobs, uniform(2, 4), SimPolicy())
    assert result.never == [2]
    assert [r.job_id for r in result.records] == [1, 3]


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([0.0, 10.0], 50) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 95) == pytest.approx(3.85)
    assert percentile([], 50) == 0.0


def test_policy_labels_parse_and_bad_ones_are_refused() -> None:
    base = SimPolicy()
    assert SimPolicy.parse("conservative", base).name == "fcfs/conservative"
    assert SimPolicy.parse("multifactor", base).name == "multifactor/easy"
    assert SimPolicy.parse("fcfs/easy/3", base).reservations == 3
    for bad in ("", "easy/", "lifo", "fcfs/fast", "fcfs/easy/x", "a/b/c/d"):
        with pytest.raises(UsageError):
            SimPolicy.parse(bad, base)


def test_cluster_file_nodes_and_partitions() -> None:
    cluster = parse_cluster("c.toml", {
        "node": [{"names": "a[1-2]", "gpus": 8, "type": "a100-80gb", "cpus": 64,
                  "memory": "512G", "block": "r1"},
                 {"names": "b1", "gpus": 4}],
        "partition": [{"name": "big", "nodes": "a[1-2]"},
                      {"name": "all", "nodes": "*", "default": True}],
    })
    assert [n.name for n in cluster.nodes] == ["a1", "a2", "b1"]
    assert cluster.gpus == 20 and cluster.default_partition == "all"
    assert cluster.nodes[0].gpus[0].gpu_type == "a100-80gb"
    assert (cluster.nodes[0].memory_mb, cluster.nodes[0].block) == (512 * 1024, "r1")
    assert cluster.partitions[0].nodes == ("a1", "a2")
    for bad, words in [
        ({"node": []}, "node"),
        ({"node": [{"names": "a1", "gpus": 0}]}, "node[0].gpus"),
        ({"node": [{"names": "a[1-", "gpus": 1}]}, "node[0].names"),
        ({"node": [{"names": "a1", "gpus": 1, "colour": "red"}]}, "node[0].colour"),
        ({"node": [{"names": "a1", "gpus": 1}, {"names": "a1", "gpus": 2}]}, "declared twice"),
        ({"node": [{"names": "a1", "gpus": 1}], "partition": [{"name": "p", "nodes": "zz"}]},
         "'zz' is not declared"),
        ({"node": [{"names": "a1", "gpus": 1}], "nodes": []}, "nodes"),
    ]:
        with pytest.raises(ConfigError, match=words.replace("[", r"\[")):
            parse_cluster("c.toml", bad)


# -- the replay's shortcuts change nothing --------------------------------------------

def _workload(draw: st.DrawFn) -> list[TraceJob]:
    count = draw(st.integers(3, 25))
    jobs, at = [], 0.0
    for job_id in range(1, count + 1):
        at += draw(st.sampled_from([0.0, 0.0, 1.0, 3.0, 10.0]))
        limit = draw(st.sampled_from([5, 10, 20, 40, 100]))
        run = draw(st.sampled_from([limit, limit // 2, limit + 5, 1]))
        jobs.append(TraceJob(job_id, at, float(run), limit, draw(st.sampled_from([1, 1, 2, 3, 4, 6, 8]))))
    return jobs


workloads = st.composite(_workload)()


@settings(max_examples=60, deadline=None)
@given(workloads, st.sampled_from(["none", "easy", "conservative"]))
def test_arrivals_extending_a_pass_decide_as_fresh_passes_do(jobs: list[TraceJob],
                                                              backfill: str) -> None:
    cluster = uniform(2, 4)
    fast = simulate(jobs, cluster, SimPolicy(backfill=backfill))
    slow = simulate(jobs, cluster, SimPolicy(backfill=backfill), shortcuts=False)
    assert fast.records == slow.records
    assert fast.passes <= slow.passes


@settings(max_examples=40, deadline=None)
@given(workloads, st.integers(0, 10))
def test_pass_arrive_equals_a_fresh_pass(jobs: list[TraceJob], split: int) -> None:
    """``SchedulingPass.arrive`` directly: a pass over the first jobs, extended by the
    rest, against one fresh pass over all of them once the first pass's starts run."""
    cluster = uniform(2, 4)
    policy = SimPolicy(backfill="easy").core()
    pending = [job_shape(j, 4, "sim") for j in jobs]
    pending = [replace(p, submit_time=0.0 if i < split else 1.0) for i, p in enumerate(pending)]
    old, new = pending[:split], pending[split:]
    first = SchedulingPass(Snapshot(cluster.nodes, cluster.partitions, tuple(old)), 0.0, policy)
    plan = first.run(queue_order(first.snapshot, 0.0, policy))
    if not first.extendable:
        with pytest.raises(ValueError):
            first.arrive(1.0, new)
        return
    added = first.arrive(1.0, new)
    started = {s.job_id for s in plan.starts}
    limits = {p.job_id: p.time_limit for p in pending}
    running = tuple(RunningJob(s.job_id, s.node, s.gpu_uuids, nodes=s.nodes,
                               end_time=float(limits[s.job_id] or math.inf))
                    for s in plan.starts)
    snapshot = Snapshot(cluster.nodes, cluster.partitions,
                        tuple(p for p in pending if p.job_id not in started), running)
    fresh = SchedulingPass(snapshot, 1.0, policy).run(queue_order(snapshot, 1.0, policy))
    assert fresh.starts == added.starts
    assert fresh.reservations == plan.reservations + added.reservations


def test_a_pass_that_cannot_be_extended_says_so() -> None:
    cluster = uniform(1, 4)
    policy = SimPolicy(backfill="easy").core()
    jobs = [job_shape(TraceJob(1, 0.0, 10, 10, 3), 4, "sim"),
            job_shape(TraceJob(2, 0.0, 10, 10, 4), 4, "sim"),
            job_shape(TraceJob(3, 0.0, 5, 5, 1), 4, "sim")]
    scheduling = SchedulingPass(Snapshot(cluster.nodes, cluster.partitions, tuple(jobs)), 0.0, policy)
    plan = scheduling.run(queue_order(scheduling.snapshot, 0.0, policy))
    assert [s.job_id for s in plan.starts] == [1, 3]  # 3 backfilled after 2's reservation
    assert not scheduling.extendable
    with pytest.raises(ValueError):
        scheduling.arrive(1.0, [])


def test_multifactor_puts_the_user_who_used_less_first() -> None:
    jobs = [TraceJob(1, 0.0, 1000.0, 1000, 1, user="u1", group="g1"),
            TraceJob(2, 1.0, 10.0, 10, 1, user="u1", group="g1"),
            TraceJob(3, 1.0, 10.0, 10, 1, user="u2", group="g2")]
    fcfs = {r.job_id: r.start for r in simulate(jobs, uniform(1, 1), SimPolicy()).records}
    fair = {r.job_id: r.start for r in simulate(
        jobs, uniform(1, 1), SimPolicy(order="multifactor")).records}
    assert (fcfs[2], fcfs[3]) == (1000.0, 1010.0)
    assert (fair[3], fair[2]) == (1000.0, 1010.0)


def test_the_shipped_example_cluster_file_loads() -> None:
    from gpusched.sim.cluster import load_cluster

    cluster = load_cluster(Path(__file__).resolve().parents[2] / "etc" / "sim-cluster.toml")
    assert cluster.gpus == 32 * 8 and cluster.default_partition == "batch"
    assert {n.block for n in cluster.nodes} == {"rack1", "rack2", "rack3", "rack4"}
    assert cluster.partitions[1].max_time == 3600
    jobs = [TraceJob(1, 0.0, 60.0, 3600, 20), TraceJob(2, 0.0, 60.0, 8 * 86400, 1)]
    result = simulate(jobs, cluster, SimPolicy())
    assert [r.job_id for r in result.records] == [1] and result.never == [2]
    assert len({cluster.nodes[[n.name for n in cluster.nodes].index(name)].block
                for name in result.records[0].nodes}) == 1  # 3 nodes in one rack


def test_a_down_default_partition_runs_nothing_and_says_so() -> None:
    cluster = parse_cluster("c.toml", {"node": [{"names": "n1", "gpus": 2}],
                                       "partition": [{"name": "p", "state": "down"}]})
    result = simulate([TraceJob(1, 0.0, 5.0, 10, 1)], cluster, SimPolicy())
    assert (result.records, result.never) == ([], [1])


def test_any_could_start_needs_enough_nodes_with_enough_free_gpus() -> None:
    from gpusched.core.capacity import any_could_start

    assert any_could_start([3, 1, 0], [(2, 1)])
    assert not any_could_start([3, 1, 0], [(2, 2), (4, 1)])  # 4 free in all, but not so
    assert any_could_start([3, 2, 0], [(2, 2)])
    assert not any_could_start([8, 8], [(1, 3)])
    assert not any_could_start([], [(1, 1)]) and not any_could_start([4], [])


@given(st.lists(st.integers(0, 8), max_size=12),
       st.lists(st.tuples(st.integers(0, 9), st.integers(1, 13)), max_size=4))
def test_any_could_start_counted_answers_as_the_sorted_check(free: list[int],
                                                             shapes: list[tuple[int, int]]) -> None:
    from gpusched.core.units import any_could_start, any_could_start_counted

    with_free = [free.count(n) for n in range(9)]
    assert any_could_start_counted(with_free, shapes) == any_could_start(free, shapes)
