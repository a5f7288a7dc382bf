"""The block layout of a job step's tasks (gpusched.core.steps), against srun's rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.steps import (
    Held,
    JobNode,
    StepAsk,
    StepBusy,
    StepLayoutError,
    counts,
    layout,
    master_port,
    tasks_per_node_text,
)


def _nodes(n: int, gpus: int = 4, cpus: int = 0) -> list[JobNode]:
    return [JobNode(f"n{i}", tuple(f"GPU-{i}-{g}" for g in range(gpus)), cpus)
            for i in range(n)]


def test_default_is_one_task_per_job_node() -> None:
    step = layout(_nodes(3), StepAsk())
    assert step.node_names == ("n0", "n1", "n2")
    assert step.tasks_per_node == (1, 1, 1)
    assert [t.gpus for p in step.parts for t in p.tasks] == [_nodes(3)[i].gpus for i in range(3)]


def test_block_distribution_puts_the_extra_tasks_first() -> None:
    step = layout(_nodes(2), StepAsk(ntasks=5))
    assert step.by_node() == {"n0": [0, 1, 2], "n1": [3, 4]}
    assert [t.local_id for t in step.parts[1].tasks] == [0, 1]


def test_ntasks_alone_uses_no_more_nodes_than_tasks() -> None:
    assert layout(_nodes(4), StepAsk(ntasks=2)).node_names == ("n0", "n1")


def test_ntasks_per_node() -> None:
    assert counts(StepAsk(nodes=2, ntasks_per_node=3), 4) == (2, [3, 3])
    assert counts(StepAsk(ntasks=7, ntasks_per_node=3), 4) == (3, [3, 3, 1])
    with pytest.raises(StepLayoutError, match="need 3 nodes; the job has 2"):
        counts(StepAsk(ntasks=7, ntasks_per_node=3), 2)


def test_gpus_per_task_gives_each_task_its_own() -> None:
    step = layout(_nodes(2, gpus=4), StepAsk(ntasks=4, gpus_per_task=2))
    assert [t.gpus for t in step.parts[0].tasks] == [("GPU-0-0", "GPU-0-1"), ("GPU-0-2", "GPU-0-3")]
    assert [t.gpus for t in step.parts[1].tasks] == [("GPU-1-0", "GPU-1-1"), ("GPU-1-2", "GPU-1-3")]


def test_more_than_the_job_has_is_refused_with_what_it_has() -> None:
    with pytest.raises(StepLayoutError, match="need 5 GPUs on a node .* n0: 4 GPUs"):
        layout(_nodes(2, gpus=4), StepAsk(ntasks=9, gpus_per_task=1))
    with pytest.raises(StepLayoutError, match="--nodes 3: the job has 2 nodes"):
        layout(_nodes(2), StepAsk(nodes=3))
    with pytest.raises(StepLayoutError, match="fewer than --nodes"):
        layout(_nodes(2), StepAsk(nodes=2, ntasks=1))
    with pytest.raises(StepLayoutError, match="CPUs"):
        layout(_nodes(1, cpus=4), StepAsk(ntasks=3, cpus_per_task=2, exact=True))


def test_running_steps_make_a_step_wait_unless_overlap() -> None:
    nodes = _nodes(2, gpus=2)
    first = layout(nodes, StepAsk(nodes=1, ntasks=1, gpus_per_task=2))
    assert first.node_names == ("n0",)
    second = layout(nodes, StepAsk(nodes=1, ntasks=1, gpus_per_task=2), first.holds)
    assert second.node_names == ("n1",)  # passes over the busy node
    held = {**first.holds, **second.holds}
    with pytest.raises(StepBusy):
        layout(nodes, StepAsk(nodes=1, gpus_per_task=1), held)
    assert layout(nodes, StepAsk(nodes=1, overlap=True), held).node_names == ("n0",)


def test_exact_steps_share_a_node_by_cpus() -> None:
    nodes = _nodes(1, gpus=0, cpus=8)
    a = layout(nodes, StepAsk(ntasks=2, cpus_per_task=2, exact=True))
    assert a.parts[0].cpus == 4
    b = layout(nodes, StepAsk(ntasks=2, cpus_per_task=2, exact=True), a.holds)
    assert b.parts[0].cpus == 4
    with pytest.raises(StepBusy):
        layout(nodes, StepAsk(ntasks=1), {"n0": Held(frozenset(), 4)})  # not exact: all 8


def test_tasks_per_node_text_and_master_port() -> None:
    assert tasks_per_node_text([3, 3, 3, 1]) == "3(x3),1"
    assert tasks_per_node_text([2]) == "2"
    assert tasks_per_node_text([1, 2, 1]) == "1,2,1"
    assert 29_500 <= master_port(123, 4) < 31_500
    assert master_port(1, 0) != master_port(1, 1)


@given(st.integers(1, 8), st.integers(1, 40), st.one_of(st.none(), st.integers(1, 6)))
def test_every_task_once_in_order_and_balanced(job_nodes: int, ntasks: int,
                                               per_node: int | None) -> None:
    ask = StepAsk(ntasks=ntasks, ntasks_per_node=per_node)
    try:
        step = layout(_nodes(job_nodes, gpus=1), ask)
    except StepLayoutError:
        needed = ntasks if per_node is None else -(-ntasks // per_node)
        assert min(needed, ntasks) > job_nodes or (per_node is not None and needed > job_nodes)
        return
    ids = [t.task_id for p in step.parts for t in p.tasks]
    assert ids == list(range(ntasks))
    sizes = step.tasks_per_node
    if per_node is None:
        assert max(sizes) - min(sizes) <= 1 and list(sizes) == sorted(sizes, reverse=True)
    else:
        assert all(s == per_node for s in sizes[:-1]) and 0 < sizes[-1] <= per_node
