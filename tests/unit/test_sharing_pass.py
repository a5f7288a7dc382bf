"""Jobs asking for a share of one GPU in a scheduling pass (core/sharing.py,
core/share_starts.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.model import (
    GpuView,
    NodeState,
    NodeView,
    PartitionView,
    PendingJob,
    Policy,
    Reason,
    RunningJob,
    Snapshot,
)
from gpusched.core.plan import plan

NOW = 1_000.0


def node(name: str, gpus: int = 1, sharing: str | None = "mps", shares: int = 100,
         memory_mb: int = 80_000) -> NodeView:
    return NodeView(name, NodeState.UP, tuple(
        GpuView(f"GPU-{name}-{i}", i, gpu_type=f"gpu-{memory_mb // 1000}gb", sharing=sharing,
                shares=shares, memory_mb=memory_mb)
        for i in range(gpus)))


def job(job_id: int, share: int = 0, mode: str | None = "mps", user: str = "u1",
        gpus: int = 1, limit: int = 100, mem: int = 0) -> PendingJob:
    return PendingJob(job_id, "p", gpus, 1000, float(job_id), limit, user=user,
                      share=share, share_mode=mode if share else None, gpu_mem_mb=mem)


def snapshot(nodes, pending, running=()) -> Snapshot:
    return Snapshot(tuple(nodes), (PartitionView("p", tuple(n.name for n in nodes)),),
                    tuple(pending), tuple(running))


def test_two_mps_shares_on_one_gpu_and_a_third_waits() -> None:
    decided = plan(snapshot([node("a")], [job(1, 50), job(2, 40), job(3, 20)]), NOW, Policy())
    assert [(s.job_id, s.gpu_uuids, s.shares) for s in decided.starts] == [
        (1, ("GPU-a-0",), (("GPU-a-0", 50, 40_000),)),
        (2, ("GPU-a-0",), (("GPU-a-0", 40, 32_000),))]
    assert [(p.job_id, p.reason) for p in decided.pending] == [(3, Reason.RESOURCES)]


def test_partly_used_gpu_is_filled_before_a_free_one() -> None:
    running = [RunningJob(7, "a", (), user="u1", end_time=NOW + 50,
                          shares=(("GPU-a-1", 30, 0),))]
    decided = plan(snapshot([node("a", gpus=2)], [job(1, 50)], running), NOW, Policy())
    assert decided.starts[0].shares[0][0] == "GPU-a-1"


def test_mps_users_never_share_a_gpu_unless_allowed() -> None:
    pending = [job(1, 30, user="u1"), job(2, 30, user="u2")]
    decided = plan(snapshot([node("a")], pending), NOW, Policy())
    assert [s.job_id for s in decided.starts] == [1]
    allowed = plan(snapshot([node("a")], pending), NOW, Policy(mps_multi_user=True))
    assert [s.job_id for s in allowed.starts] == [1, 2]
    shards = plan(snapshot([node("a", sharing="shard", shares=4)],
                           [job(1, 2, "shard", "u1"), job(2, 2, "shard", "u2")]), NOW, Policy())
    assert [s.job_id for s in shards.starts] == [1, 2]  # shards have no such rule


def test_a_whole_gpu_job_waits_for_a_shared_gpu_and_no_share_without_sharing() -> None:
    decided = plan(snapshot([node("a")], [job(1, 10), job(2)]), NOW, Policy())
    assert [s.job_id for s in decided.starts] == [1]
    assert decided.pending[0].job_id == 2
    # The whole-GPU job's reservation starts when the share's time limit ends.
    assert decided.reservations[0].start_time == NOW + 100
    plain = plan(snapshot([node("a", sharing=None)], [job(1, 10)]), NOW, Policy())
    assert not plain.starts and plain.pending[0].reason is Reason.RESOURCES
    other = plan(snapshot([node("a", sharing="shard")], [job(1, 10, "mps")]), NOW, Policy())
    assert not other.starts


def test_memory_of_the_gpu_is_never_over_committed() -> None:
    decided = plan(snapshot([node("a", memory_mb=40_000)],
                            [job(1, 10, mem=30_000), job(2, 10, mem=20_000),
                             job(3, 10, mem=10_000)]), NOW, Policy())
    assert [(s.job_id, s.shares[0][2]) for s in decided.starts] == [(1, 30_000), (3, 10_000)]


def test_a_share_does_not_delay_the_reservation_of_a_blocked_job() -> None:
    # One GPU shared until NOW+100 by job 7; job 1 needs it whole and gets a reservation
    # at NOW+100. A share running past that would delay it; a short one may backfill.
    running = [RunningJob(7, "a", (), user="u1", end_time=NOW + 100,
                          shares=(("GPU-a-0", 50, 0),))]
    pending = [job(1), job(2, 10, limit=500), job(3, 10, limit=50)]
    decided = plan(snapshot([node("a")], pending, running), NOW, Policy())
    assert decided.reservations[0].job_id == 1
    assert decided.reservations[0].start_time == NOW + 100
    assert [s.job_id for s in decided.starts] == [3]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 120), st.sampled_from(["u1", "u2"]),
                          st.integers(0, 50_000), st.integers(1, 4)), min_size=1, max_size=25),
       st.integers(1, 3), st.booleans())
def test_shares_never_over_commit(requests, gpus, multi) -> None:
    nodes = [node("a", gpus=gpus, memory_mb=60_000), node("b", gpus=1, memory_mb=60_000)]
    pending = [job(i + 1, share, user=user, mem=mem, limit=60 * length)
               for i, (share, user, mem, length) in enumerate(requests)]
    decided = plan(snapshot(nodes, pending), NOW, Policy(mps_multi_user=multi))
    units: Counter[str] = Counter()
    memory: Counter[str] = Counter()
    users: dict[str, set[str]] = {}
    asked = {p.job_id: p for p in pending}
    for start in decided.starts:
        (uuid, taken, mem), = start.shares
        assert start.gpu_uuids == (uuid,) and taken == asked[start.job_id].share
        units[uuid] += taken
        memory[uuid] += mem
        users.setdefault(uuid, set()).add(asked[start.job_id].user)
    assert all(v <= 100 for v in units.values())
    assert all(v <= 60_000 for v in memory.values())
    if not multi:
        assert all(len(u) == 1 for u in users.values())


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 120), st.sampled_from(["u1", "u2"]),
                          st.integers(0, 50_000)), min_size=1, max_size=25),
       st.integers(1, 3))
def test_the_first_share_that_waits_had_no_room(requests, gpus) -> None:
    """Without backfill, every job before the first that waits starts, and nothing after
    it: so when it waits, no GPU had room for it, as the pass left them."""
    nodes = [node("a", gpus=gpus, memory_mb=60_000), node("b", gpus=1, memory_mb=60_000)]
    pending = [job(i + 1, share, user=user, mem=mem)
               for i, (share, user, mem) in enumerate(requests)]
    decided = plan(snapshot(nodes, pending), NOW, Policy(backfill="none"))
    units: Counter[str] = Counter()
    memory: Counter[str] = Counter()
    users: dict[str, set[str]] = {}
    for start in decided.starts:
        (uuid, taken, mem), = start.shares
        units[uuid] += taken
        memory[uuid] += mem
        users.setdefault(uuid, set()).add(next(p.user for p in pending if p.job_id == start.job_id))
    started = [s.job_id for s in decided.starts]
    assert started == [p.job_id for p in pending[:len(started)]]
    if len(started) < len(pending):
        waiting = pending[len(started)]
        need_mem = waiting.gpu_mem_mb or 600 * waiting.share
        assert not any(
            units[g] + waiting.share <= 100 and memory[g] + need_mem <= 60_000
            and users.get(g, {waiting.user}) == {waiting.user}
            for g in [f"GPU-a-{i}" for i in range(gpus)] + ["GPU-b-0"])


def mig_node(name: str) -> NodeView:
    parent = GpuView(f"GPU-{name}-0", 0, gpu_type="a100-80gb", mig_mode=True, memory_mb=80_000)
    return NodeView(name, NodeState.UP, (
        parent,
        GpuView(f"MIG-{name}-1", 1, gpu_type="a100-80gb", mig_profile="1g.10gb", parent=0,
                memory_mb=9_728),
        GpuView(f"MIG-{name}-2", 2, gpu_type="a100-80gb", mig_profile="3g.40gb", parent=0,
                memory_mb=40_192)))


def memory_job(job_id: int, mem: int, limit: int = 100) -> PendingJob:
    return PendingJob(job_id, "p", 1, 1000, float(job_id), limit, user="u1", gpu_mem_mb=mem)


def test_gpu_memory_gets_the_smallest_slice_with_enough() -> None:
    decided = plan(snapshot([mig_node("m")], [memory_job(1, 8_000), memory_job(2, 8_000),
                                              memory_job(3, 30_000)]), NOW, Policy())
    assert [(s.job_id, s.gpu_uuids, s.shares) for s in decided.starts] == [
        (1, ("MIG-m-1",), ()), (2, ("MIG-m-2",), ())]
    assert decided.pending[0].job_id == 3


def test_gpu_memory_gets_an_mps_share_then_a_whole_gpu() -> None:
    nodes = [node("a", memory_mb=40_000), node("x", sharing=None, memory_mb=16_000),
             node("y", sharing=None, memory_mb=80_000)]
    decided = plan(snapshot(nodes, [memory_job(1, 10_000), memory_job(2, 10_001),
                                    memory_job(3, 50_000)]), NOW, Policy())
    assert [(s.job_id, s.gpu_uuids, s.shares) for s in decided.starts] == [
        (1, ("GPU-a-0",), (("GPU-a-0", 25, 10_000),)),
        (2, ("GPU-a-0",), (("GPU-a-0", 26, 10_001),)),
        (3, ("GPU-y-0",), ())]


def test_gpu_memory_of_a_type_is_its_smallest_gpus() -> None:
    # Two GPUs of one type, one reporting less memory: the type counts as the smaller,
    # so a job is never placed on a GPU without the memory it asked for.
    mixed = NodeView("z", NodeState.UP, (
        GpuView("GPU-z-0", 0, gpu_type="l4", memory_mb=16_000),
        GpuView("GPU-z-1", 1, gpu_type="l4", memory_mb=24_000)))
    decided = plan(snapshot([mixed], [memory_job(1, 20_000)]), NOW, Policy())
    assert not decided.starts


def test_gpu_memory_nothing_has_waits() -> None:
    decided = plan(snapshot([node("x", sharing=None, memory_mb=16_000)],
                            [memory_job(1, 20_000)]), NOW, Policy())
    assert not decided.starts and decided.pending[0].reason is Reason.RESOURCES


def test_a_waiting_share_is_explained_in_units() -> None:
    from gpusched.core.explain import explain

    snap = snapshot([node("a")], [job(1, 50), job(2, 40), job(3, 20)])
    detail = explain(snap, NOW, Policy(), 3).blockers[0].detail
    assert "it needs 20 units of one GPU shared by MPS" in detail
    assert "the most room on a shared GPU is 10 units (on a)" in detail
    other_user = snapshot([node("a")], [job(1, 50), job(3, 20, user="u2")])
    explained = explain(other_user, NOW, Policy(), 3)
    assert explained.reason is Reason.RESOURCES
    assert "no GPU is shared with room left" in explained.blockers[0].detail
    assert "one user's jobs at a time" in explained.blockers[0].detail


def test_gpu_memory_prefers_the_smaller_slice_to_the_scarcer_one() -> None:
    # Best fit by count alone would take the one 2g slice (fewest free of its kind).
    parent = GpuView("GPU-m-0", 0, gpu_type="a100-80gb", mig_mode=True, memory_mb=80_000)
    node = NodeView("m", NodeState.UP, (parent, *(
        GpuView(f"MIG-m-{i}", i, gpu_type="a100-80gb", mig_profile=profile, parent=0,
                memory_mb=memory)
        for i, (profile, memory) in enumerate(
            [("1g.10gb", 9_728), ("1g.10gb", 9_728), ("2g.20gb", 19_968)], start=1))))
    decided = plan(snapshot([node], [memory_job(1, 8_000)]), NOW, Policy())
    assert decided.starts[0].gpu_uuids in (("MIG-m-1",), ("MIG-m-2",))


def test_fgd_keeps_room_the_waiting_shares_can_use() -> None:
    # GPU a-0 has 40 units left; the queue is mostly 40-unit shares (held here, so that
    # only job 1 starts). Best fit puts job 1's 30 units on a-0 (10 left, which no 40-unit
    # share can use); FGD puts it on the free a-1 (70 left) and keeps a-0's 40 for one.
    running = [RunningJob(7, "a", (), user="u1", end_time=NOW + 500,
                          shares=(("GPU-a-0", 60, 0),))]
    held = [replace(job(i, 40), hold="user") for i in range(2, 12)]
    pending = [job(1, 30), *held]
    best = plan(snapshot([node("a", gpus=2)], pending, running), NOW, Policy())
    fgd = plan(snapshot([node("a", gpus=2)], pending, running), NOW, Policy(packing="fgd"))
    assert [s.shares[0][0] for s in best.starts] == ["GPU-a-0"]
    assert [s.shares[0][0] for s in fgd.starts] == ["GPU-a-1"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 100), st.sampled_from(["u1", "u2"])),
                min_size=1, max_size=20), st.booleans())
def test_fgd_never_over_commits_and_starts_what_best_fit_would_find_room_for(
        requests, multi) -> None:
    nodes = [node("a", gpus=2, memory_mb=60_000), node("b", gpus=1, memory_mb=60_000)]
    pending = [job(i + 1, share, user=user) for i, (share, user) in enumerate(requests)]
    decided = plan(snapshot(nodes, pending), NOW,
                   Policy(packing="fgd", mps_multi_user=multi, backfill="none"))
    units: Counter[str] = Counter()
    for start in decided.starts:
        (uuid, taken, _), = start.shares
        units[uuid] += taken
    assert all(v <= 100 for v in units.values())
    started = [s.job_id for s in decided.starts]
    assert started == [p.job_id for p in pending[:len(started)]]
