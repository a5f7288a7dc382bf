"""sbatch's other dependency forms: ``after:ID[+MIN]``, ``aftercorr``, array tasks
(``afterok:12_3``) and ``?`` (any of), parsed and judged; a hypothesis differential
against a plain reference evaluator; the pass starting an aftercorr array's tasks one by
one as their counterparts complete."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.dependency import (
    MAX_AFTER_MINUTES,
    Dependency,
    DependencyError,
    Key,
    dependency_reason,
    format_dependency,
    parse_dependency,
)
from gpusched.core.model import (
    GpuView,
    JobState,
    NodeState,
    NodeView,
    PartitionView,
    PendingJob,
    Policy,
    Reason,
    Snapshot,
)
from gpusched.core.plan import plan

C, F, R, P, CA = (JobState.COMPLETED, JobState.FAILED, JobState.RUNNING, JobState.PENDING,
                  JobState.CANCELLED)
WAIT, NEVER = Reason.DEPENDENCY, Reason.DEPENDENCY_NEVER_SATISFIED


def test_parse_the_forms() -> None:
    assert parse_dependency("after:5+10:6") == (Dependency("after", (5, 6), (), (10, 0)),)
    assert parse_dependency("afterok:12_3:12") == (Dependency("afterok", (12, 12), (3, None)),)
    assert parse_dependency("aftercorr:7") == (Dependency("aftercorr", (7,)),)
    assert parse_dependency("afterok:1?afternotok:2") == (
        Dependency("afterok", (1,), any_of=True), Dependency("afternotok", (2,), any_of=True))
    assert parse_dependency("after:5+0") == (Dependency("after", (5,)),)
    assert Dependency("after", (5, 12), (None, 3), (2, 0)).targets() == [(5, 2), ((12, 3), 0)]


@pytest.mark.parametrize(("text", "named"), [
    ("afterok:1,afterany:2?singleton", "'?'"),  # both joiners
    ("afterok:5+3", "afterok:5+3"),  # +MIN belongs to after
    ("aftercorr:5_1", "aftercorr"),  # aftercorr takes whole arrays
    ("after:5+x", "after:5+x"), (f"after:5+{MAX_AFTER_MINUTES + 1}", "after:5"),
    ("afterok:5_", "afterok:5_"), ("afterok:5_1000000", "afterok:5_1000000"),
    ("afterok:1??afterok:2", "empty item"), ("afterburstbuffer:3", "burst buffer"),
])
def test_bad_forms_are_refused_naming_them(text: str, named: str) -> None:
    with pytest.raises(DependencyError, match=named.replace("+", r"\+").replace("?", r"\?")):
        parse_dependency(text)


@pytest.mark.parametrize(("text", "states", "began", "now", "expected"), [
    ("after:1", {1: P}, {}, 0, WAIT),
    ("after:1", {1: R}, {1: 100.0}, 100, None),
    ("after:1", {1: R}, {}, 100, WAIT),  # an array some of whose tasks have not begun
    ("after:1+10", {1: R}, {1: 100.0}, 699, WAIT),
    ("after:1+10", {1: R}, {1: 100.0}, 700, None),
    ("after:1+10", {1: CA}, {1: 50.0}, 700, None),  # cancelled while pending counts
    ("after:1", {1: F}, {1: 50.0}, 60, None),
    ("afterok:12_3", {12: R, (12, 3): C}, {}, 0, None),
    ("afterok:12_3", {12: C, (12, 3): F}, {}, 0, NEVER),
    ("afterok:12_3", {12: R}, {}, 0, WAIT),  # the task is not known yet
    ("afterok:1?afterok:2", {1: F, 2: R}, {}, 0, WAIT),
    ("afterok:1?afterok:2", {1: F, 2: C}, {}, 0, None),
    ("afterok:1?afterok:2", {1: F, 2: CA}, {}, 0, NEVER),
    ("afterok:1,afterok:2", {1: F, 2: R}, {}, 0, NEVER),
    ("aftercorr:9", {9: C}, {}, 0, None),  # not an array task: the whole job
    ("aftercorr:9", {9: F}, {}, 0, NEVER),
])
def test_verdicts_of_the_forms(text: str, states: dict[Key, JobState], began: dict[Key, float],
                               now: float, expected: Reason | None) -> None:
    assert dependency_reason(parse_dependency(text), states, False, began=began,
                             now=now) == expected


def test_aftercorr_judges_the_task_of_the_same_id() -> None:
    states: dict[Key, JobState] = {9: R, (9, 0): C, (9, 1): F, (9, 2): R}
    deps = parse_dependency("aftercorr:9")
    assert [dependency_reason(deps, states, False, task=t) for t in (0, 1, 2)] == [
        None, NEVER, WAIT]
    # A task the other array lacks waits for that array as a whole.
    assert dependency_reason(deps, states, False, task=7) is WAIT


# -- a differential against a plain reference --------------------------------------

STATES = (P, R, C, F, CA)
targets = st.tuples(st.integers(1, 4), st.none() | st.integers(0, 2), st.integers(0, 3))


@st.composite
def clauses(draw: st.DrawFn) -> tuple[str, list[tuple[int, int | None, int]]]:
    kind = draw(st.sampled_from(("after", "afterok", "afternotok", "afterany", "aftercorr")))
    found = draw(st.lists(targets, min_size=1, max_size=3))
    found = [(j, None if kind == "aftercorr" else t, m if kind == "after" else 0)
             for j, t, m in found]
    return kind, found


def _text(kind: str, found: list[tuple[int, int | None, int]]) -> str:
    items = [f"{j}{'' if t is None else f'_{t}'}{f'+{m}' if m else ''}" for j, t, m in found]
    return f"{kind}:{':'.join(items)}"


def _reference(spec: list[tuple[str, list[tuple[int, int | None, int]]]], any_of: bool,
               states: dict[Key, JobState], began: dict[Key, float], now: float,
               task: int | None) -> Reason | None:
    """Each clause judged target by target, as sbatch's manual words them."""
    results = []
    for kind, found in spec:
        keys = []
        for j, t, m in found:
            key: Key = j if t is None else (j, t)
            if kind == "aftercorr" and task is not None and (j, task) in states:
                key = (j, task)
            keys.append((key, m))
        met = never = True
        never = False
        for key, m in keys:
            state = states.get(key)
            ended = state is not None and state.terminal
            if kind == "after":
                begun = ended or key in began
                ok = state is not None and begun and (
                    m == 0 or now >= began.get(key, now) + 60 * m)
            elif kind == "afterany":
                ok = ended
            elif kind == "afternotok":
                ok = ended and state is not C
                never = never or state is C
            else:  # afterok, aftercorr
                ok = state is C
                never = never or (ended and state is not C)
            met = met and ok
        results.append("met" if met and not never else "never" if never else "wait")
    if any_of:
        return None if "met" in results else NEVER if set(results) == {"never"} else WAIT
    return NEVER if "never" in results else WAIT if "wait" in results else None


keys = st.integers(1, 4) | st.tuples(st.integers(1, 4), st.integers(0, 2))


@settings(max_examples=400, deadline=None)
@given(st.lists(clauses(), min_size=1, max_size=3), st.booleans(),
       st.dictionaries(keys, st.sampled_from(STATES)),
       st.dictionaries(keys, st.integers(0, 400).map(float)),
       st.integers(0, 600), st.none() | st.integers(0, 2))
def test_judged_as_the_reference_judges(
        spec: list[tuple[str, list[tuple[int, int | None, int]]]], any_of: bool,
        states: dict[Key, JobState], began: dict[Key, float], now: int,
        task: int | None) -> None:
    text = ("?" if any_of else ",").join(_text(kind, found) for kind, found in spec)
    any_of = any_of and len(spec) > 1  # one clause: the joiner is not written
    parsed = parse_dependency(text)
    # Every clause keeps what it names (a target named twice counts once).
    assert [(d.kind, d.targets()) for d in parsed] == [
        (kind, list(dict.fromkeys((j if t is None else (j, t), m) for j, t, m in found)))
        for kind, found in spec]
    assert parse_dependency(format_dependency(parsed)) == parsed  # as stored
    expected = _reference(spec, any_of, states, began, float(now), task)
    assert dependency_reason(parsed, states, False, began=began, now=float(now),
                             task=task) == expected, text


# -- the pass -------------------------------------------------------------------------


def _snapshot(jobs: list[PendingJob], states: dict[Key, JobState],
              began: dict[Key, float] | None = None) -> Snapshot:
    node = NodeView("a", NodeState.UP, tuple(GpuView(f"g{i}", i) for i in range(4)))
    return Snapshot((node,), (PartitionView("gpu", ("a",)),), tuple(jobs),
                    job_states=states, job_began=began or {})


def test_an_aftercorr_array_starts_the_tasks_whose_counterparts_completed() -> None:
    array = PendingJob(20, "gpu", 1, 1000, 1.0, user="alice", dependency="aftercorr:10",
                       array_job_id=20, array_tasks="0-3")
    states: dict[Key, JobState] = {10: R, (10, 0): C, (10, 1): C, (10, 2): R, (10, 3): P}
    result = plan(_snapshot([array], states), 0.0, Policy())
    assert [s.array_task_id for s in result.starts] == [0, 1]
    assert [(p.job_id, p.reason) for p in result.pending] == [(20, WAIT)]
    # Tasks start in order: task 3's counterpart done does not let it pass task 2.
    states[(10, 3)] = C
    assert [s.array_task_id for s in plan(_snapshot([array], states), 0.0, Policy()).starts
            ] == [0, 1]
    states[(10, 2)] = F
    blocked = plan(_snapshot([array], states), 0.0, Policy())
    assert [s.array_task_id for s in blocked.starts] == [0, 1]
    assert blocked.pending[0].reason is NEVER


def test_after_with_minutes_in_a_pass() -> None:
    job = PendingJob(2, "gpu", 1, 1000, 1.0, user="alice", dependency="after:1+5")
    snap = _snapshot([job], {1: R}, {1: 1000.0})
    assert plan(snap, 1299.0, Policy()).pending[0].reason is WAIT
    assert [s.job_id for s in plan(snap, 1300.0, Policy()).starts] == [2]
