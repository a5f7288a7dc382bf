"""A differential property test of -C/--constraint: random constraints are written out
as text, parsed by gpusched.core.features, and judged against a deliberately simple
reference that evaluates the generated tree itself (left to right, as Slurm reads it)
and tries every assignment of nodes to counts and every node subset by brute force;
the nodes ``assign_counts`` gives each count are checked against the same brute force."""

from __future__ import annotations

from itertools import combinations, permutations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.features import assign_counts, parse_constraint, possible, satisfied

NAMES = ("a", "b", "c", "d")

# A tree: a name, or ("group", first, ((op, tree), ...)) written in parentheses when nested.
names_st = st.sampled_from(NAMES)
trees_st = st.recursive(
    names_st,
    lambda inner: st.tuples(st.just("group"), inner,
                            st.lists(st.tuples(st.sampled_from("&|"), inner), max_size=2)),
    max_leaves=5)
feature_sets_st = st.frozensets(st.sampled_from(NAMES))


def write(tree: object, nested: bool = False) -> str:
    if isinstance(tree, str):
        return tree
    _, first, rest = tree  # type: ignore[misc]
    text = write(first, True) + "".join(op + write(t, True) for op, t in rest)
    return f"({text})" if nested else text


def holds(tree: object, features: frozenset[str]) -> bool:
    """Left to right, no precedence."""
    if isinstance(tree, str):
        return tree in features
    _, first, rest = tree  # type: ignore[misc]
    value = holds(first, features)
    for op, term in rest:
        value = (value and holds(term, features)) if op == "&" else (value or holds(term, features))
    return value


@st.composite
def constraints_st(draw: st.DrawFn) -> tuple[str, object, list[object], list[tuple[object, int]]]:
    """(text, base tree or None, matching-OR alternatives, counts)."""
    base = draw(st.none() | trees_st)
    kind = draw(st.sampled_from(("none", "choice", "counts")))
    if base is None and kind == "none":
        kind = "choice"
    choice: list[object] = []
    counts: list[tuple[object, int]] = []
    parts = [write(base, True)] if base is not None else []
    if kind == "choice":
        choice = draw(st.lists(trees_st, min_size=1, max_size=3))
        parts.append("[" + "|".join(write(t, True) for t in choice) + "]")
    elif kind == "counts":
        counts = draw(st.lists(st.tuples(trees_st, st.integers(1, 2)), min_size=1, max_size=2))
        parts.append("[" + "&".join(f"{write(t, True)}*{n}" for t, n in counts) + "]")
    if draw(st.booleans()):
        parts.reverse()  # the bracket may come first
    return "&".join(parts), base, choice, counts


def reference(base: object, choice: list[object], counts: list[tuple[object, int]],
              allocation: list[frozenset[str]]) -> bool:
    if base is not None and not all(holds(base, x) for x in allocation):
        return False
    if choice and not any(all(holds(alt, x) for x in allocation) for alt in choice):
        return False
    slots = [tree for tree, n in counts for _ in range(n)]
    if len(slots) > len(allocation):
        return False
    return not slots or any(all(holds(tree, allocation[node]) for tree, node in zip(slots, order))
                            for order in permutations(range(len(allocation)), len(slots)))


@settings(max_examples=300, deadline=None)
@given(constraints_st(), st.lists(feature_sets_st, min_size=1, max_size=4))
def test_satisfied_is_the_reference(drawn: tuple[str, object, list[object], list[tuple[object, int]]],
                                    allocation: list[frozenset[str]]) -> None:
    text, base, choice, counts = drawn
    parsed = parse_constraint(text)
    assert parse_constraint(parsed.text()) == parsed
    assert satisfied(parsed, allocation) == reference(base, choice, counts, allocation)


@settings(max_examples=200, deadline=None)
@given(constraints_st(), st.lists(feature_sets_st, min_size=1, max_size=5), st.integers(1, 3))
def test_possible_is_some_subset_satisfying(
        drawn: tuple[str, object, list[object], list[tuple[object, int]]],
        nodes: list[frozenset[str]], wanted: int) -> None:
    text, base, choice, counts = drawn
    expected = any(reference(base, choice, counts, [nodes[i] for i in subset])
                   for subset in combinations(range(len(nodes)), wanted))
    assert possible(parse_constraint(text), dict(enumerate(nodes)), wanted) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(trees_st, st.integers(1, 3)), min_size=1, max_size=3),
       st.lists(feature_sets_st, min_size=1, max_size=6))
def test_assigned_counts_are_distinct_nodes_each_of_its_count(
        counts: list[tuple[object, int]], nodes: list[frozenset[str]]) -> None:
    """Nodes for every count exactly when some assignment exists (the reference over all
    the nodes); each count gets as many nodes as it names, each holding its expression,
    and no node serves two counts."""
    text = "[" + "&".join(f"{write(t, True)}*{n}" for t, n in counts) + "]"
    parsed = parse_constraint(text)
    chosen = assign_counts(parsed.counts, dict(enumerate(nodes)))
    assert (chosen is not None) == reference(None, [], counts, nodes)
    if chosen is not None:
        flat = [index for taken in chosen for index in taken]
        assert len(flat) == len(set(flat))
        assert [len(taken) for taken in chosen] == [n for _, n in parsed.counts]
        assert all(expr.holds(nodes[index])
                   for (expr, _), taken in zip(parsed.counts, chosen) for index in taken)
