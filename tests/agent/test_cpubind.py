"""Choosing a job's CPUs near its GPUs (--gres-flags), and reading CPU lists and MIG
capability minors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.agent.cgroups.devices import mig_cap_minors, parse_mig_minors
from gpusched.agent.cpubind import BindingError, CpuChoice, choose_cpus, parse_cpulist

# two NUMA nodes of 4 CPUs each
NUMA = {0: {0, 1, 2, 3}, 1: {4, 5, 6, 7}}
ALL = set(range(8))


def test_prefers_cpus_near_the_gpus() -> None:
    assert choose_cpus(2, ALL, set(), {1}, NUMA) == CpuChoice((4, 5), (1,))
    assert choose_cpus(2, ALL, {4, 5}, {1}, NUMA) == CpuChoice((6, 7), (1,))


def test_falls_back_to_other_cpus_unless_binding_is_enforced() -> None:
    got = choose_cpus(3, ALL, {4, 5}, {1}, NUMA)
    assert got.cpus == (0, 6, 7) and got.mems == (0, 1)
    with pytest.raises(BindingError, match="3 CPUs asked, 2 free near the job's GPUs"):
        choose_cpus(3, ALL, {4, 5}, {1}, NUMA, "enforce-binding")
    assert choose_cpus(2, ALL, {4, 5}, {1}, NUMA, "enforce-binding").cpus == (6, 7)


def test_disable_binding_ignores_numa() -> None:
    assert choose_cpus(2, ALL, set(), {1}, NUMA, "disable-binding").cpus == (0, 1)


def test_enforce_binding_needs_a_known_numa_node() -> None:
    with pytest.raises(BindingError, match="not known"):
        choose_cpus(1, ALL, set(), set(), NUMA, "enforce-binding")


def test_no_cpuset_when_not_counted_or_too_few_free() -> None:
    none = choose_cpus(0, ALL, set(), {0}, NUMA)
    assert none.cpus is None and none.note is not None and "no CPUs" in none.note
    short = choose_cpus(5, ALL, {0, 1, 2, 3}, {0}, NUMA)
    assert short.cpus is None and short.note == "5 CPUs asked but 4 free on this node: no cpuset"


@given(st.integers(0, 10), st.sets(st.integers(0, 15)), st.sets(st.integers(0, 15)),
       st.sets(st.integers(0, 3)), st.sampled_from([None, "disable-binding", "enforce-binding"]))
def test_never_a_held_or_unavailable_cpu(count: int, available: set[int], held: set[int],
                                         gpu_numa: set[int], flags: str | None) -> None:
    numa = {n: set(range(4 * n, 4 * n + 4)) for n in range(4)}
    try:
        got = choose_cpus(count, available, held, gpu_numa, numa, flags)
    except BindingError:
        assert flags == "enforce-binding"
        return
    if got.cpus is not None:
        assert len(got.cpus) == count and set(got.cpus) <= available - held
        if flags == "enforce-binding":
            near = set().union(*(numa[n] for n in gpu_numa))
            assert set(got.cpus) <= near
    assert got == choose_cpus(count, available, held, gpu_numa, numa, flags)


def test_cpu_lists() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("") == set()
    for bad in ("3-1", "a", "-1", "70000"):
        with pytest.raises(ValueError):
            parse_cpulist(bad)


def test_mig_capability_minors() -> None:
    table = parse_mig_minors("config 1\nmonitor 2\ngpu0/gi1/access 12\n"
                             "gpu0/gi1/ci0/access 13\ngpu1/gi2/access 30\nbad line here\n")
    assert table == {"gpu0/gi1": 12, "gpu0/gi1/ci0": 13, "gpu1/gi2": 30}
    assert mig_cap_minors(table, 0, 1, 0) == [12, 13]
    with pytest.raises(ValueError, match="gpu1/gi2/ci0"):
        mig_cap_minors(table, 1, 2, 0)
