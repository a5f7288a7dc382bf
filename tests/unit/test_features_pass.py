"""The pass with -C/--constraint (core/feature_starts.py): a constrained job starts only
on nodes that satisfy its constraint, waits with BadConstraints when no node set could,
takes a matching OR's nodes from one alternative and a count's from distinct nodes; a
property test (each backfill mode, exclusive jobs too) holds every start to the rule
(core.features.satisfied), and every reservation too, gives no GPU twice, and holds every BadConstraints to a
brute-force search of the partition's nodes."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.features import parse_constraint, satisfied
from gpusched.core.model import (
    GpuView,
    NodeState,
    NodeView,
    PartitionView,
    PendingJob,
    Plan,
    Policy,
    Reason,
    Snapshot,
)
from gpusched.core.plan import plan

NOW = 1_000.0


def node(name: str, *features: str, gpus: int = 2) -> NodeView:
    return NodeView(name, NodeState.UP,
                    tuple(GpuView(f"{name}-g{i}", i) for i in range(gpus)),
                    features=frozenset(features))


def job(job_id: int, constraint: str | None, gpus: int = 1, nodes: int = 1) -> PendingJob:
    return PendingJob(job_id, "p", gpus, 1000, NOW - 100 + job_id, 3600, nodes=nodes,
                      priority=1000.0 - job_id,  # taken in the order of their ids
                      constraint=constraint and parse_constraint(constraint).text())


def run(nodes: list[NodeView], jobs: list[PendingJob], backfill: str = "easy") -> Plan:
    snapshot = Snapshot(tuple(nodes), (PartitionView("p", tuple(n.name for n in nodes)),),
                        tuple(jobs))
    return plan(snapshot, NOW, Policy(backfill=backfill))


def placed(result: Plan) -> dict[int, tuple[str, ...]]:
    return {s.job_id: s.nodes or (s.node,) for s in result.starts}


def reasons(result: Plan) -> dict[int, Reason]:
    return {p.job_id: p.reason for p in result.pending}


def test_a_constrained_job_starts_only_on_a_matching_node() -> None:
    nodes = [node("n1", "a100"), node("n2", "h100", "nvlink"), node("n3", "h100")]
    result = run(nodes, [job(1, "h100&nvlink"), job(2, "a100|l4"), job(3, "h100&nvlink", gpus=2)])
    assert placed(result) == {1: ("n2",), 2: ("n1",)}
    assert reasons(result) == {3: Reason.RESOURCES}  # n2's other GPU is taken


def test_nothing_can_match_is_bad_constraints_and_blocks_nobody() -> None:
    nodes = [node("n1", "a100"), node("n2", "h100")]
    result = run(nodes, [job(1, "v100"), job(2, "a100&h100"), job(3, "[a100*1&h100*2]", nodes=3),
                         job(4, None)])
    assert reasons(result) == {1: Reason.BAD_CONSTRAINTS, 2: Reason.BAD_CONSTRAINTS,
                               3: Reason.BAD_CONSTRAINTS}
    assert placed(result) == {4: ("n1",)}


def test_matching_or_takes_every_node_from_one_alternative() -> None:
    nodes = [node("r1a", "rack1"), node("r2a", "rack2"), node("r2b", "rack2"),
             node("r1b", "rack1", gpus=0)]
    result = run(nodes, [job(1, "[rack1|rack2]", gpus=2, nodes=2)])
    assert placed(result) == {1: ("r2a", "r2b")}  # rack1 has one node with GPUs
    plain = run(nodes, [job(1, "rack1|rack2", gpus=2, nodes=2)])
    assert len(placed(plain)[1]) == 2


def test_counts_take_distinct_nodes_of_each_feature() -> None:
    nodes = [node("a1", "a"), node("ab", "a", "b"), node("b1", "b"), node("c1", "c")]
    result = run(nodes, [job(1, "[a*1&b*2]", nodes=3)])
    assert sorted(placed(result)[1]) == ["a1", "ab", "b1"]
    spare = run(nodes, [job(1, "c*1", nodes=2)])
    assert "c1" in placed(spare)[1]
    busy = run(nodes, [job(1, "c", gpus=2), job(2, "c*1", nodes=2)])
    assert placed(busy) == {1: ("c1",)} and reasons(busy) == {2: Reason.RESOURCES}


FEATURES = ("a", "b", "c")
feature_sets_st = st.frozensets(st.sampled_from(FEATURES), max_size=2)
constraints_st = st.sampled_from(
    ("a", "b", "a&b", "a|c", "(a|b)&c", "[a|b]", "c&[a|b]", "a*1", "[a*1&b*1]", "[a*2]",
     "b|a&c"))


@settings(max_examples=600, deadline=None)
@given(st.lists(st.tuples(feature_sets_st, st.integers(0, 2)), min_size=1, max_size=5),
       st.lists(st.tuples(st.none() | constraints_st, st.integers(0, 2), st.integers(1, 2)),
                min_size=1, max_size=5),
       st.sampled_from(("easy", "conservative", "none")), st.booleans())
def test_starts_satisfy_constraints_and_bad_ones_are_truly_impossible(
        shapes: list[tuple[frozenset[str], int]],
        asks: list[tuple[str | None, int, int]], backfill: str, exclusive: bool) -> None:
    nodes = [node(f"n{i}", *features, gpus=gpus) for i, (features, gpus) in enumerate(shapes)]
    jobs = [job(i + 1, text, gpus, count) for i, (text, gpus, count) in enumerate(asks)]
    if exclusive:  # whole nodes (counts are refused with --exclusive at submit)
        jobs = [replace(j, exclusive=True) if "*" not in (j.constraint or "") else j
                for j in jobs]
    result = run(nodes, jobs, backfill)
    features = {n.name: n.features for n in nodes}
    given = [uuid for start in result.starts for uuid in start.gpu_uuids]
    assert len(given) == len(set(given))  # no GPU twice
    for start in result.starts:
        wanted = jobs[start.job_id - 1]
        names = start.nodes or (start.node,)
        assert len(set(names)) == wanted.nodes
        if wanted.constraint:
            assert satisfied(parse_constraint(wanted.constraint), [features[n] for n in names])
    for held in result.reservations:  # a reservation holds nodes the job may take
        wanted = jobs[held.job_id - 1]
        if wanted.constraint and held.nodes:
            assert satisfied(parse_constraint(wanted.constraint),
                             [features[n] for n in held.nodes])
    for pending in result.pending:
        wanted = jobs[pending.job_id - 1]
        could = wanted.constraint is None or any(
            satisfied(parse_constraint(wanted.constraint), [n.features for n in subset])
            for subset in combinations(nodes, wanted.nodes))
        assert (pending.reason is Reason.BAD_CONSTRAINTS) == (not could)


def test_a_waiting_counted_job_gets_a_reservation_backfill_keeps() -> None:
    nodes = [node("c1", "c"), node("d1")]
    short = replace(job(3, None, gpus=2), time_limit=600)
    long = replace(job(4, None, gpus=2), time_limit=7200)
    result = run(nodes, [job(1, "c", gpus=2), job(2, "c*1", nodes=2), short, long])
    assert placed(result) == {1: ("c1",), 3: ("d1",)}  # 3 ends before the reservation
    assert [(r.job_id, r.start_time, sorted(r.nodes)) for r in result.reservations] == [
        (2, NOW + 3600, ["c1", "d1"])]  # when job 1's time limit frees c1
    assert reasons(result)[2] is Reason.RESOURCES
    assert reasons(result)[4] is Reason.PRIORITY  # it would run into the reservation
    estimated = plan(Snapshot(tuple(nodes), (PartitionView("p", ("c1", "d1")),), (
        job(1, "c", gpus=2), job(2, "c*1", nodes=2))), NOW, Policy(reservations=0))
    assert not estimated.reservations
    assert next(p for p in estimated.pending if p.job_id == 2).expected_start is None


def test_a_one_node_count_is_not_taken_from_a_many_node_job_of_the_same_constraint() -> None:
    """``a*1`` on one node asks for a node with ``a``; on two nodes, one of them. The
    nodes a job may take were once remembered by the constraint's text alone, so the
    second job took what the first could."""
    nodes = [node("n0", "a", "b"), node("n1", "c", gpus=0)]
    result = run(nodes, [job(1, "a*1", gpus=0, nodes=2), job(2, "a*1", gpus=0)], "none")
    assert placed(result) == {1: ("n0", "n1"), 2: ("n0",)}


def test_counts_find_their_nodes_where_taking_the_fewest_candidates_first_would_not() -> None:
    """c has the fewest candidates (n2, n3) and would take n2 first, then a would take n1,
    leaving b only n4 of the two it needs. c on n3 leaves b n2 and n4: the job starts."""
    nodes = [node("n1", "a", "b"), node("n2", "a", "b", "c"), node("n3", "a", "c"),
             node("n4", "b")]
    result = run(nodes, [job(1, "[a*1&b*2&c*1]", nodes=4)])
    assert sorted(placed(result)[1]) == ["n1", "n2", "n3", "n4"]
    # The same with a fifth node for the job's uncounted rest, and busy nodes beside.
    nodes.append(node("n5"))
    result = run(nodes, [job(1, "[a*1&b*2&c*1]", nodes=5), job(2, None)])
    assert sorted(placed(result)[1]) == ["n1", "n2", "n3", "n4", "n5"]


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.tuples(st.frozensets(st.sampled_from(FEATURES)), st.integers(0, 2)),
                min_size=1, max_size=6),
       st.sampled_from(("a*1", "[a*1&b*1]", "[a*2]", "[a*1&b*2]", "[a*1&b*1&c*1]",
                        "[a*2&c*1]", "[b*1&c*2]", "[a*1&b*2&c*1]")),
       st.integers(0, 2), st.integers(1, 4))
def test_on_idle_nodes_a_counted_job_that_could_start_does(
        shapes: list[tuple[frozenset[str], int]], text: str, gpus: int, count: int) -> None:
    """Every node idle: a job that some set of nodes could hold now (a brute-force search:
    enough GPUs on each, the constraint satisfied) starts in the first pass, and one
    that none could does not."""
    nodes = [node(f"n{i}", *features, gpus=n_gpus)
             for i, (features, n_gpus) in enumerate(shapes)]
    asked = job(1, text, gpus, count)
    constraint = parse_constraint(text)
    could = any(satisfied(constraint, [n.features for n in subset])
                for subset in combinations([n for n in nodes if len(n.gpus) >= gpus], count))
    result = run(nodes, [asked])
    assert (1 in placed(result)) == could, (shapes, text, gpus, count)
