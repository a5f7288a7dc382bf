"""Job arrays in the pure core: task-id sets, and how a pass starts an array's tasks."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.arrays import (
    MAX_TASKS,
    ArrayError,
    drop_first,
    fold,
    iter_tasks,
    parse_array,
    remove,
    task_bounds,
    task_count,
)
from gpusched.core.model import (
    PartitionView,
    PendingJob,
    Policy,
    QosLimits,
    Reason,
    RunningJob,
    Snapshot,
)
from gpusched.core.plan import SchedulingPass, plan, queue_order
from tests.unit.test_plan import node, reasons


@pytest.mark.parametrize(("text", "tasks", "cap"), [
    ("0-99", "0-99", None),
    ("1,3,5-9", "1,3,5-9", None),
    ("0-30:10", "0-30:10", None),
    ("0-31:10", "0-30:10", None),  # the last id is on the step
    ("9,1-3,2", "1-3,9", None),  # sorted, each id once
    ("0-15%4", "0-15", 4),
    (" 7 ", "7", None),
    ("0,2,4,6", "0-6:2", None),
    ("1,3", "1,3", None),
])
def test_parse_array(text: str, tasks: str, cap: int | None) -> None:
    spec = parse_array(text)
    assert (spec.tasks, spec.max_running) == (tasks, cap)


@pytest.mark.parametrize(("text", "words"), [
    ("", "expected task ids"),
    ("a-3", "'a' is not a task id"),
    ("5-3", "ends before it starts"),
    ("0-9:0", "step"),
    ("3:2", "needs a range"),
    ("0-9%0", "at least 1"),
    ("0-9%x", "at least 1"),
    ("1,,2", "'' is not a task id"),
    ("-1", "'' is not a task id"),
    ("0-999999", f"more than {MAX_TASKS}"),
    ("1000000", "above the largest"),
])
def test_bad_arrays_name_the_problem(text: str, words: str) -> None:
    with pytest.raises(ArrayError, match="invalid array") as err:
        parse_array(text)
    assert words in str(err.value)


def test_taking_tasks_in_order() -> None:
    tasks = "1,3,5-9,20-40:10"
    assert list(iter_tasks(tasks)) == [1, 3, 5, 6, 7, 8, 9, 20, 30, 40]
    assert task_count(tasks) == 10 and task_bounds(tasks) == (10, 1, 40)
    assert drop_first(tasks, 3) == "6-9,20-40:10"
    assert drop_first(tasks, 9) == "40"
    assert drop_first(tasks, 10) is None
    assert remove(tasks, {5, 30}) == "1,3,6-9,20,40"
    assert remove("4", {4}) is None


@given(st.sets(st.integers(0, 300), min_size=1, max_size=60), st.integers(0, 70))
def test_fold_and_drop_keep_exactly_the_ids(ids: set[int], k: int) -> None:
    text = fold(sorted(ids))
    assert list(iter_tasks(text)) == sorted(ids)
    assert parse_array(text).tasks == text  # canonical text parses to itself
    left = drop_first(text, k)
    assert (list(iter_tasks(left)) if left else []) == sorted(ids)[k:]


def array_job(job_id: int, tasks: str, gpus: int = 1, cap: int | None = None,
              **fields: object) -> PendingJob:
    return replace(PendingJob(job_id, "gpu", gpus, 1000, float(job_id), user="u"),
                   array_job_id=job_id, array_tasks=tasks, array_max_running=cap, **fields)


def snapshot(nodes: int, gpus: int, pending: list[PendingJob],
             running: list[RunningJob] = (), **fields: object) -> Snapshot:  # type: ignore[assignment]
    views = tuple(node(f"n{i}", gpus) for i in range(nodes))
    return Snapshot(views, (PartitionView("gpu", tuple(v.name for v in views)),),
                    tuple(pending), tuple(running), **fields)  # type: ignore[arg-type]


def test_an_array_starts_tasks_lowest_first_until_the_nodes_are_full() -> None:
    p = plan(snapshot(2, 2, [array_job(7, "0-9")]), 0.0, Policy())
    assert [(s.job_id, s.array_task_id, s.node) for s in p.starts] == [
        (7, 0, "n0"), (7, 1, "n0"), (7, 2, "n1"), (7, 3, "n1")]
    assert reasons(p) == {7: Reason.RESOURCES}


def test_the_cap_counts_running_tasks_and_blocks_nobody() -> None:
    running = [RunningJob(20, "n0", ("n0-g0",), "u", array_job_id=7)]
    later = PendingJob(8, "gpu", 1, 1000, 8.0)
    p = plan(snapshot(1, 4, [array_job(7, "1-9", cap=2), later], running), 0.0, Policy())
    assert [(s.job_id, s.array_task_id) for s in p.starts] == [(7, 1), (8, None)]
    assert reasons(p) == {7: Reason.JOB_ARRAY_TASK_LIMIT}
    full = [*running, RunningJob(21, "n0", ("n0-g1",), "u", array_job_id=7)]
    p = plan(snapshot(1, 4, [array_job(7, "2-9", cap=2)], full), 0.0, Policy())
    assert p.starts == () and reasons(p) == {7: Reason.JOB_ARRAY_TASK_LIMIT}


def test_the_last_tasks_leave_no_pending_record() -> None:
    p = plan(snapshot(1, 4, [array_job(7, "3,5")]), 0.0, Policy())
    assert [s.array_task_id for s in p.starts] == [3, 5] and p.pending == ()


def test_qos_limits_count_each_task() -> None:
    job = array_job(7, "0-9", qos="normal")
    p = plan(snapshot(1, 8, [job], qos_limits={"normal": QosLimits(max_gpus_per_user=3)}),
             0.0, Policy())
    assert len(p.starts) == 3 and reasons(p) == {7: Reason.QOS_MAX_GPUS_PER_USER}


def test_a_blocked_array_blocks_its_partition_like_any_job() -> None:
    later = PendingJob(8, "gpu", 1, 1000, 8.0)
    p = plan(snapshot(1, 2, [array_job(7, "0-4", gpus=2), later]), 0.0, Policy())
    assert [s.array_task_id for s in p.starts] == [0]
    assert reasons(p) == {7: Reason.RESOURCES, 8: Reason.PRIORITY}


def test_a_huge_array_costs_a_pass_only_its_runnable_tasks() -> None:
    """10,000 pending tasks on a full cluster: the pass tries one task, not all."""

    class Counting(SchedulingPass):
        tries = 0

        def _try_start(self, job: PendingJob, task: int | None) -> Reason | None:
            self.tries += 1
            return super()._try_start(job, task)

    empty = snapshot(1, 0, [array_job(7, "0-9999")])
    counting = Counting(empty, 0.0, Policy())
    result = counting.run(queue_order(empty, 0.0, Policy()))
    assert reasons(result) == {7: Reason.RESOURCES} and counting.tries == 1


@given(st.lists(st.tuples(st.sets(st.integers(0, 40), min_size=1, max_size=12),
                          st.none() | st.integers(1, 4), st.integers(0, 3), st.integers(0, 2)),
                min_size=1, max_size=4),
       st.integers(1, 3), st.integers(0, 4))
def test_no_pass_breaks_a_cap_or_starts_a_task_twice(
        arrays: list[tuple[set[int], int | None, int, int]], nodes: int, gpus: int) -> None:
    pending, running = [], []
    for n, (ids, cap, already, size) in enumerate(arrays, start=1):
        pending.append(array_job(n, fold(sorted(ids)), gpus=size, cap=cap))
        running += [RunningJob(1000 * n + k, "n0", (), "u", array_job_id=n) for k in range(already)]
    p = plan(snapshot(nodes, gpus, pending, running), 0.0, Policy())
    for n, (ids, cap, already, _) in enumerate(arrays, start=1):
        tasks = [s.array_task_id for s in p.starts if s.job_id == n]
        assert tasks == sorted(ids)[:len(tasks)]  # lowest ids first, each once
        if cap is not None:
            assert len(tasks) == 0 or already + len(tasks) <= cap
    used = [u for s in p.starts for u in s.gpu_uuids]
    assert len(used) == len(set(used))
