"""Fragmentation-aware placement (gpusched.core.fragmentation): the measure on hand-made
nodes, the choices FGD and best fit make, never over-committing, and the optimised
choice against a plain recomputation from the definition."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.fragmentation import (
    GpuNode,
    Task,
    Workload,
    apply,
    choose,
    gpu_demand,
    growth,
    kind_fragmentation,
    placements,
    score,
)

CPU, MEM = 32_000, 262_144


def node(*gpus: int, cpu: int = CPU, mem: int = MEM, kind: str = "") -> GpuNode:
    return GpuNode(cpu, mem, tuple(gpus), kind)


def frac(milli: int, cpu: int = 1000, mem: int = 1024, kind: str = "") -> Task:
    return Task(cpu, mem, 1, milli, kind)


def whole(n: int, cpu: int = 1000, mem: int = 1024) -> Task:
    return Task(cpu, mem, n, 1000)


CPU_ONLY = Task(4000, 8192, 0, 0)


# ---- the measure on known states ------------------------------------------------------


def test_fraction_counts_gpus_too_small_for_it() -> None:
    n = node(1000, 600, 300, 0)
    assert kind_fragmentation(n, frac(500)) == 300  # only the 300 left on GPU 2
    assert kind_fragmentation(n, frac(200)) == 0
    assert kind_fragmentation(n, frac(700)) == 900  # 600 + 300 are too small


def test_whole_gpu_kind_counts_every_partly_used_gpu() -> None:
    n = node(1000, 1000, 600, 300)
    assert kind_fragmentation(n, whole(1)) == 900
    assert kind_fragmentation(n, whole(2)) == 900
    # Three idle GPUs are not there: nothing on the node is usable by it.
    assert kind_fragmentation(n, whole(3)) == 2900


def test_kind_that_cannot_fit_cpu_memory_or_type_sees_all_free_gpu() -> None:
    n = node(1000, 500, cpu=2000, mem=4096, kind="t4")
    assert kind_fragmentation(n, frac(200, cpu=3000)) == 1500
    assert kind_fragmentation(n, frac(200, mem=8192)) == 1500
    assert kind_fragmentation(n, frac(200, kind="a100")) == 1500
    assert kind_fragmentation(n, frac(200, kind="t4")) == 0
    assert kind_fragmentation(n, CPU_ONLY) == 1500  # asks no GPU: can use none of it


def test_workload_fragmentation_is_the_popularity_weighted_sum() -> None:
    kinds = [(frac(500), 2), (whole(1), 1), (CPU_ONLY, 1)]
    wl = Workload(kinds)
    n = node(1000, 600, 300, 0)
    want = (2 * 300 + 1 * 900 + 1 * 1900) / 4
    assert wl.fragmentation(n) == pytest.approx(want)
    assert wl.scaled_fragmentation(n) == 2 * 300 + 900 + 1900
    assert wl.popularity(frac(500)) == 0.5
    assert wl.popularity(frac(501)) == 0.0
    # Same state, GPUs listed in another order: same value (cached by sorted state).
    assert wl.fragmentation(node(0, 300, 1000, 600)) == pytest.approx(want)


def test_workload_of_groups_identical_tasks() -> None:
    wl = Workload.of([frac(500), frac(500), whole(2), frac(500)])
    assert dict(wl.kinds) == {frac(500): 3, whole(2): 1}
    assert wl.total == 4
    by_gpu = Workload.of([frac(500), frac(500), whole(2), CPU_ONLY], weigh="gpu")
    assert dict(by_gpu.kinds) == {frac(500): 1000, whole(2): 2000}
    for bad in (lambda: Workload([(frac(1), -1)]), lambda: Workload([], band=-1),
                lambda: Workload.of([], weigh="size")):
        with pytest.raises(ValueError):
            bad()


# ---- the choices ------------------------------------------------------------------------


def test_fgd_keeps_whole_gpus_whole_when_whole_gpu_tasks_are_common() -> None:
    """A 0.5 fraction arrives; one node has a half-used GPU, another is idle. With a
    workload of whole-GPU and half-GPU tasks, FGD fills the half-used GPU: putting it on
    the idle node would leave a half GPU that whole-GPU tasks cannot use."""
    wl = Workload([(whole(1), 3), (frac(500), 1)])
    nodes = [node(1000, 1000), node(500, 1000)]
    assert choose(nodes, frac(500), "fgd", wl) == (1, (0,))
    assert score(nodes[1], frac(500), (0,), "fgd", wl) < score(nodes[0], frac(500), (0,), "fgd", wl)
    # Exact growths: the idle node's whole GPU stops being usable by 3 of 4 kinds for
    # half of it; the half-used GPU is filled, which frees the whole-GPU kinds' loss.
    assert growth(nodes[0], frac(500), (0,), wl) == pytest.approx(3 * 500 / 4)
    assert growth(nodes[1], frac(500), (0,), wl) == pytest.approx(-3 * 500 / 4)


def test_fgd_avoids_leaving_a_sliver_no_kind_can_use() -> None:
    """Workload of 0.6-GPU tasks. A 0.3 task arrives; a GPU with 0.9 free would keep 0.6
    (still usable), a GPU with 0.7 free would keep 0.4 (useless to 0.6 tasks). Best fit
    takes the tighter 0.7; FGD takes the 0.9 GPU, as the paper's reasoning predicts."""
    wl = Workload([(frac(600), 1)])
    n = node(900, 700)
    assert choose([n], frac(300), "fgd", wl) == (0, (0,))
    assert choose([n], frac(300), "bestfit") == (0, (1,))


def test_fgd_places_cpu_only_tasks_where_they_strand_least_gpu() -> None:
    """A CPU-only task that would leave a GPU node without CPU for GPU tasks goes to the
    node where GPU tasks still fit."""
    wl = Workload([(whole(1, cpu=4000), 1)])
    tight = node(1000, cpu=8000)  # after it: 4000 CPU left, a 1-GPU task still fits
    tighter = node(1000, cpu=6000)  # after it: 2000 left, the GPU is stranded
    assert choose([tighter, tight], CPU_ONLY, "fgd", wl) == (1, ())


def test_bestfit_packs_fractions_onto_a_partly_used_gpu() -> None:
    nodes = [node(1000, 1000), node(1000, 400), node(1000, 700)]
    assert choose(nodes, frac(300), "bestfit") == (1, (1,))
    # On one node: the tightest GPU that fits.
    assert choose([node(1000, 800, 350)], frac(300), "bestfit") == (0, (2,))


def test_whole_gpu_tasks_take_idle_gpus_only() -> None:
    n = node(999, 1000, 1000, 500)
    assert placements(n, whole(2)) == [(1, 2)]
    assert placements(n, whole(3)) == []
    assert placements(n, frac(999)) == [(0,), (1,), (2,)]
    assert placements(n, CPU_ONLY) == [()]


def test_firstfit_and_random() -> None:
    nodes = [node(200), node(1000), node(1000)]
    assert choose(nodes, frac(500), "firstfit") == (1, (0,))
    picks = {choose(nodes, frac(500), "random", rng=random.Random(s)) for s in range(30)}
    assert picks == {(1, (0,)), (2, (0,))}
    assert choose(nodes, whole(2), "firstfit") is None
    with pytest.raises(ValueError):
        choose(nodes, frac(500), "random")
    with pytest.raises(ValueError):
        choose(nodes, frac(500), "fgd")
    with pytest.raises(ValueError):
        choose(nodes, frac(500), "worstfit")


def test_apply_refuses_to_over_commit() -> None:
    n = node(1000, 300, cpu=2000, mem=2048)
    assert apply(n, frac(300), (1,)) == node(1000, 0, cpu=1000, mem=1024)
    for task, gpus in ((frac(400), (1,)), (frac(300, cpu=3000), (0,)), (whole(2), (0, 1)),
                       (frac(300), (5,)), (whole(1), (0, 0)), (CPU_ONLY, ())):
        with pytest.raises(ValueError):
            apply(n, task, gpus)


# ---- properties over random nodes and tasks ------------------------------------------------

gpu_free = st.sampled_from([0, 50, 200, 300, 450, 500, 700, 1000, 1000])
nodes_st = st.builds(
    lambda cpu, mem, gpus, kind: GpuNode(cpu, mem, tuple(gpus), kind),
    st.sampled_from([0, 2000, 8000, 32000]), st.sampled_from([0, 4096, 65536]),
    st.lists(gpu_free, min_size=0, max_size=8), st.sampled_from(["", "t4", "a100"]))
tasks_st = st.one_of(
    st.builds(Task, st.sampled_from([0, 1000, 6000]), st.sampled_from([0, 2048, 16384]),
              st.just(1), st.sampled_from([50, 250, 300, 500, 700, 999]),
              st.sampled_from(["", "", "t4"])),
    st.builds(Task, st.sampled_from([0, 1000, 6000]), st.sampled_from([0, 2048, 16384]),
              st.sampled_from([1, 2, 4, 8]), st.just(1000), st.sampled_from(["", "a100"])),
    st.builds(Task, st.sampled_from([1000, 6000]), st.sampled_from([2048]), st.just(0),
              st.just(0)),
)
workloads_st = st.lists(st.tuples(tasks_st, st.integers(1, 5)), min_size=1, max_size=6).map(Workload)


@settings(max_examples=300, deadline=None)
@given(st.lists(nodes_st, min_size=1, max_size=6), tasks_st, workloads_st,
       st.sampled_from(["fgd", "bestfit", "firstfit", "random"]), st.integers(0, 9))
def test_never_over_commits(nodes: list[GpuNode], task: Task, wl: Workload, policy: str,
                            seed: int) -> None:
    picked = choose(nodes, task, policy, wl, rng=random.Random(seed))
    if picked is None:
        assert all(not placements(n, task) for n in nodes)
        return
    index, gpus = picked
    before = nodes[index]
    after = apply(before, task, gpus)  # raises if anything is over-committed
    assert after.cpu_milli >= 0 and after.mem_mib >= 0
    assert all(0 <= free <= 1000 for free in after.gpus)
    assert sum(before.gpus) - sum(after.gpus) == gpu_demand(task)


def brute_force_fgd(nodes: list[GpuNode], task: Task, kinds: list[tuple[Task, int]],
                    band: int = 80) -> tuple[int, tuple[int, ...]] | None:
    """FGD's choice recomputed from scratch: every node, every placement, the workload
    fragmentation before and after from the per-kind definition, the growth in
    thousandths of a GPU compared by bands of ``band`` (0: exactly), then best fit."""
    total = sum(count for _, count in kinds)

    def frag(n: GpuNode) -> int:
        return sum(count * kind_fragmentation(n, kind) for kind, count in kinds)

    def banded(grown: int) -> Fraction | int:
        # growth / total thousandths, floored to whole bands: exact rational arithmetic.
        return Fraction(grown, total) // band if band else grown

    best = None
    for index, n in enumerate(nodes):
        for gpus in placements(n, task):
            after = apply(n, task, gpus)
            left = sum(after.gpus)
            own = after.gpus[gpus[0]] if task.num_gpu == 1 and task.gpu_milli < 1000 else 0
            key = (banded(frag(after) - frag(n)), (left, own, after.cpu_milli), index, gpus)
            if best is None or key < best[0]:
                best = (key, (index, gpus))
    return None if best is None else best[1]


@settings(max_examples=400, deadline=None)
@given(st.lists(nodes_st, min_size=1, max_size=7), tasks_st, workloads_st,
       st.sampled_from([0, 1, 80, 300]))
def test_choose_matches_brute_force(nodes: list[GpuNode], task: Task, wl: Workload,
                                    band: int) -> None:
    wl = Workload(wl.kinds, band=band)
    assert choose(nodes, task, "fgd", wl) == brute_force_fgd(nodes, task, list(wl.kinds), band)
    # score() orders placements as choose() does (the node index aside).
    scored = [(score(n, task, g, "fgd", wl), i, g) for i, n in enumerate(nodes)
              for g in placements(n, task)]
    if scored:
        assert min(scored)[1:] == choose(nodes, task, "fgd", wl)
    for n in nodes:
        plain = sum(c * kind_fragmentation(n, k) for k, c in wl.kinds)
        assert wl.scaled_fragmentation(n) == plain


def test_choose_matches_brute_force_on_random_clusters() -> None:
    """Larger random states than hypothesis draws: nodes filled by random tasks."""
    rnd = random.Random(7)
    kinds = [frac(rnd.choice([100, 250, 300, 460, 500, 650, 810]), cpu=rnd.choice([1000, 4000]))
             for _ in range(6)] + [whole(1), whole(2), whole(8), CPU_ONLY]
    wl = Workload((k, rnd.randint(1, 9)) for k in kinds)
    for _ in range(40):
        nodes = [node(*([1000] * rnd.choice([1, 2, 4, 8])), cpu=rnd.choice([16000, 64000]))
                 for _ in range(12)]
        for _ in range(rnd.randint(0, 40)):
            t = rnd.choice(kinds)
            i = rnd.randrange(len(nodes))
            options = placements(nodes[i], t)
            if options:
                nodes[i] = apply(nodes[i], t, rnd.choice(options))
        task = rnd.choice(kinds)
        for band in (0, 80):
            banded = Workload(wl.kinds, band=band)
            want = brute_force_fgd(nodes, task, list(wl.kinds), band)
            assert choose(nodes, task, "fgd", banded) == want


def test_score_stays_exact_for_large_growths() -> None:
    # A growth of 4e14 scaled units once swamped best fit's tie-break in one float.
    wl = Workload([(frac(500), 10**12)], band=0)
    nodes = [node(1000, cpu=CPU), node(1000, cpu=CPU - 1)]
    task = frac(600)
    scores = [score(n, task, (0,), "fgd", wl) for n in nodes]
    assert scores[1] < scores[0]
    assert choose(nodes, task, "fgd", wl) == (1, (0,))
    assert all(isinstance(part, int) for part in scores[0])
