"""Node features and -C/--constraint (gpusched.core.features): the parser's forms and
refusals, the rule a job's node set must follow, and the features a node's GPUs give."""

from __future__ import annotations

import pytest

from gpusched.core.features import (
    MAX_CONSTRAINT_TEXT,
    ConstraintError,
    check_features,
    check_request,
    eligible,
    gpu_features,
    memory_feature,
    options,
    parse_constraint,
    possible,
    satisfied,
)
from gpusched.errors import UsageError


def f(*names: str) -> frozenset[str]:
    return frozenset(names)


@pytest.mark.parametrize(("text", "canonical"), [
    ("a", "a"), (" a & b ", "a&b"), ("a|b&c", "a|b&c"), ("a&(b|c)", "a&(b|c)"),
    ("[a|b]", "[a|b]"), ("[x|y]&gpu", "gpu&[x|y]"), ("a*4", "a*4"), ("(a|b)*2", "(a|b)*2"),
    ("[a*2&b*4]", "[a*2&b*4]"), ("[(a|b)*1&c*2]", "[(a|b)*1&c*2]"),
    ("a|b&[x|y]&c", "(a|b)&c&[x|y]"), ("sm_80&gpumem80g", "sm_80&gpumem80g"),
    ("(a)", "a"),
])
def test_forms_parse_to_a_canonical_text_that_parses_back(text: str, canonical: str) -> None:
    parsed = parse_constraint(text)
    assert parsed.text() == canonical
    assert parse_constraint(canonical) == parsed


@pytest.mark.parametrize(("text", "says"), [
    ("", "at least one feature"), ("a,b", "not ','"), ("a&", "found the end"),
    ("&a", "found '&'"), ("a&b*2", "needs brackets"), ("[a|b]|c", "with '&' only"),
    ("[a|b]&c|d", "with '&' only"), ("a|[b|c]", "with '&' only"),
    ("[a*2|b]", "no counts in a matching OR"), ("[a&b]", "needs a count"),
    ("[a*2&b]", "needs a count"), ("[a*2&b*1|c*1]", "not both"), ("a*0", "1 to"),
    ("a*x", "1 to"), ("(a", "expected ')'"), ("a)", "found ')'"),
    ("[a|b]&[c|d]", "one bracket"), ("a b", "found 'b'"), ("a$b", "unexpected '$'"),
    ("(a)*2&b", "needs brackets"), ("x" * 65, "not a feature name"), ("-a", "not a feature"),
    ("(" * 17 + "a" + ")" * 17, "parentheses deep"),
    ("a&" * 64 + "a", "at most 64 feature names"),
    ("a" * (MAX_CONSTRAINT_TEXT + 1), f"at most {MAX_CONSTRAINT_TEXT} characters"),
])
def test_bad_forms_are_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(ConstraintError, match="^--constraint: ") as err:
        parse_constraint(text)
    assert says in err.value.message


def test_operators_read_left_to_right_without_precedence() -> None:
    # Slurm: "foo|bar&baz" is (foo|bar)&baz; "foo&bar|baz" is (foo&bar)|baz.
    c = parse_constraint("foo|bar&baz")
    assert c.base is not None
    assert not c.base.holds(f("foo"))
    assert c.base.holds(f("foo", "baz")) and c.base.holds(f("bar", "baz"))
    d = parse_constraint("foo&bar|baz")
    assert d.base is not None and d.base.holds(f("baz")) and not d.base.holds(f("foo"))


def test_matching_or_puts_every_node_in_one_alternative() -> None:
    c = parse_constraint("gpu&[rack1|rack2]")
    assert satisfied(c, [f("gpu", "rack1"), f("gpu", "rack1")])
    assert not satisfied(c, [f("gpu", "rack1"), f("gpu", "rack2")])
    assert not satisfied(c, [f("rack1"), f("gpu", "rack1")])
    plain = parse_constraint("gpu&(rack1|rack2)")
    assert satisfied(plain, [f("gpu", "rack1"), f("gpu", "rack2")])
    nodes = {0: f("gpu", "rack1"), 1: f("gpu", "rack2"), 2: f("rack1"), 3: f("gpu", "rack1")}
    assert options(c, nodes) == [frozenset({0, 3}), frozenset({1})]
    assert [i for i, feats in nodes.items() if eligible(c, feats)] == [0, 1, 3]
    assert possible(c, nodes, 2) and not possible(c, nodes, 3)


def test_counts_take_distinct_nodes() -> None:
    c = parse_constraint("[a*2&b*1]")
    assert c.counted == 3
    assert satisfied(c, [f("a"), f("a", "b"), f("b")])
    # The node with both may fill only one count.
    assert not satisfied(c, [f("a"), f("a", "b"), f("c")])
    assert satisfied(c, [f("a"), f("a"), f("b"), f("c")])  # a fourth node, free
    assert possible(c, {0: f("a", "b"), 1: f("a"), 2: f("b")}, 3)
    assert not possible(c, {0: f("a", "b"), 1: f("a"), 2: f("x")}, 3)
    single = parse_constraint("graphics*2")
    assert satisfied(single, [f("graphics"), f(), f("graphics")])
    assert not satisfied(single, [f("graphics"), f(), f()])
    assert all(eligible(single, x) for x in (f(), f("graphics")))


def test_counts_over_more_nodes_than_the_job_are_refused() -> None:
    check_request(parse_constraint("[a*2&b*2]"), 4)
    with pytest.raises(ConstraintError, match="name 4 nodes, the job has 3"):
        check_request(parse_constraint("[a*2&b*2]"), 3)
    assert not possible(parse_constraint("a*2"), {0: f("a"), 1: f("a")}, 1)


def test_counts_are_refused_to_jobs_of_whole_nodes_or_a_share_on_several_nodes() -> None:
    check_request(parse_constraint("a&b"), 2, whole_or_shared=True)  # no counts: taken
    check_request(parse_constraint("a*1"), 1, whole_or_shared=True)  # one node: taken
    with pytest.raises(ConstraintError, match="not taken with --exclusive"):
        check_request(parse_constraint("[a*1&b*1]"), 2, whole_or_shared=True)


def test_gpu_features() -> None:
    gpus = [{"type": "a100-80gb", "memory_mb": 81_920}, {"type": "l4", "memory_mb": 23_034},
            {"type": "h100-80gb", "memory_mb": 81_559, "mig_profile": None},
            {"type": "a100-80gb", "memory_mb": 9_728, "mig_profile": "1g.10gb", "parent": 0},
            {"type": "gpu", "memory_mb": 0}]
    assert gpu_features(gpus, nvlink=True, capabilities=[(8, 0), (9, 0), (8, 9)]) == [
        "a100", "a100-80gb", "gpumem24g", "gpumem80g", "h100", "h100-80gb", "l4", "mig",
        "nvlink", "sm_80", "sm_89", "sm_90"]
    assert gpu_features([{"type": "t4", "memory_mb": 15_360}]) == ["gpumem16g", "t4"]
    assert gpu_features([]) == []
    assert memory_feature("a40", 46_068) == "gpumem48g"
    assert memory_feature("gpu", 0) is None


def test_check_features() -> None:
    assert check_features(["b", "a", "b"], "features") == ("a", "b")
    for bad, says in ((["a b"], "not a feature name"), ("ab", "expected a list"),
                      ([1], "expected a list"), ([f"x{i}" for i in range(200)], "at most")):
        with pytest.raises(UsageError, match=says):
            check_features(bad, "features")


def test_large_counts_are_checked_without_recursion() -> None:
    c = parse_constraint("[a*3000&b*3000]")
    both = {i: f("a", "b") for i in range(6000)}
    assert possible(c, both, 6000) and not possible(c, both, 5999)
    assert not possible(c, {**both, 0: f("a")} | {i: f("a") for i in range(3001)}, 6000)
