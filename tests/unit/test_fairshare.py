"""Fair-share: hand-computed trees, decay over simulated time, and invariants."""

from __future__ import annotations

import gc
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.fairshare import Account, FairShareTree, UserShare, accrue, decay

DAY = 86400.0
WEEK = 7 * DAY


def three_level_tree() -> FairShareTree:
    """root ─ physics(60) ─ theory(1) ─ alice
                         └ exp(1)    ─ bob, carol
           └ bio(40) ─ dave"""
    return FairShareTree(
        [Account("physics", "root", 60), Account("bio", "root", 40),
         Account("theory", "physics", 1), Account("exp", "physics", 1)],
        [UserShare("alice", "theory"), UserShare("bob", "exp"), UserShare("carol", "exp"),
         UserShare("dave", "bio")],
    )


USAGE = {("alice", "theory"): 600.0, ("bob", "exp"): 300.0, ("dave", "bio"): 100.0}


def test_fair_tree_ranks_depth_first_by_level_fairshare() -> None:
    # root level: physics S=.6 U=.9 -> LF .667; bio S=.4 U=.1 -> LF 4: bio first.
    # physics: theory S=.5 U=600/900 -> .75; exp S=.5 U=300/900 -> 1.5: exp first.
    # exp: carol (no usage, LF inf) before bob. Ranks 4..1 over 4 users.
    factors = three_level_tree().fair_tree(USAGE)
    assert factors == {("dave", "bio"): 1.0, ("carol", "exp"): 0.75,
                       ("bob", "exp"): 0.5, ("alice", "theory"): 0.25}


def test_ranking_leaves_nothing_for_the_cyclic_collector() -> None:
    # A pass ranks the tree every time: what it makes is freed by reference counting.
    tree = three_level_tree()
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            assert tree.fair_tree(USAGE)["dave", "bio"] == 1.0
            assert tree.account_usage(USAGE)["physics"] == 900.0
            assert tree.classic(USAGE).keys() == tree.fair_tree(USAGE).keys()
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_classic_formula_uses_effective_usage() -> None:
    # normalised shares: alice .3, bob .15, carol .15, dave .4. Actual usage (of all):
    # physics .9, bio .1 (under the root: effective = actual); theory .6 -> .6 + (.9 -
    # .6) * 1/2 = .75; exp .3 -> .3 + (.9 - .3) * 1/2 = .6; alice .6 -> .6 + (.75 - .6)
    # * 1 = .75; bob .3 -> .3 + (.6 - .3) * 1/2 = .45; carol 0 -> .6 * 1/2 = .3; dave .1.
    factors = three_level_tree().classic(USAGE)
    assert factors[("alice", "theory")] == pytest.approx(2 ** -(0.75 / 0.3))
    assert factors[("bob", "exp")] == pytest.approx(2 ** -(0.45 / 0.15))
    assert factors[("carol", "exp")] == pytest.approx(2 ** -(0.3 / 0.15))
    assert factors[("dave", "bio")] == pytest.approx(2 ** -(0.1 / 0.4))
    # carol used nothing, but her account tree (physics) far more than its share: she
    # is below dave, as under Fair Tree.
    fair = three_level_tree().fair_tree(USAGE)
    assert factors[("carol", "exp")] < factors[("dave", "bio")]
    assert fair[("carol", "exp")] < fair[("dave", "bio")]


def classic_reference(accounts: list[Account], users: list[UserShare],
                      usage: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """Slurm's classic factors straight from its formulas, association by association
    up the parent links: UE = UA + (UE_parent - UA) * S / S_level (UA under the root),
    S normalised = S / S_level * S_parent, F = 2^(-UE/S)."""
    parent = {a.name: a.parent for a in accounts}
    raw = {a.name: float(a.shares) for a in accounts}
    level: dict[str, float] = {}
    for name, above in parent.items():
        level[str(above)] = level.get(str(above), 0.0) + raw[name]
    for u in users:
        level[u.account] = level.get(u.account, 0.0) + u.shares
    grand = sum(usage.values())

    def below(name: str, account: str | None) -> bool:
        while account is not None:
            if account == name:
                return True
            account = parent.get(account)
        return False

    def account_ue(name: str) -> float:
        ua = (sum(v for (_, a), v in usage.items() if below(name, a)) / grand) if grand else 0.0
        above = str(parent[name])
        if above == "root":
            return ua
        return ua + (account_ue(above) - ua) * raw[name] / level[above]

    def account_s(name: str) -> float:
        above = str(parent[name])
        return raw[name] / level[above] * (1.0 if above == "root" else account_s(above))

    found = {}
    for u in users:
        ua = usage.get((u.user, u.account), 0.0) / grand if grand else 0.0
        ue = ua if u.account == "root" else ua + (account_ue(u.account) - ua) * u.shares / level[u.account]
        s = u.shares / level[u.account] * (1.0 if u.account == "root" else account_s(u.account))
        found[(u.user, u.account)] = 2 ** (-ue / s)
    return found


def test_users_tied_on_level_fairshare_share_a_rank() -> None:
    tree = FairShareTree([Account("a", "root")],
                         [UserShare("u1", "a"), UserShare("u2", "a"), UserShare("u3", "a")])
    factors = tree.fair_tree({("u3", "a"): 5.0})
    assert factors == {("u1", "a"): 1.0, ("u2", "a"): 1.0, ("u3", "a"): 1 / 3}


def test_children_of_tied_accounts_are_ranked_as_one_pool() -> None:
    tree = FairShareTree([Account("x", "root"), Account("y", "root")],
                         [UserShare("a", "x"), UserShare("b", "x", 3), UserShare("c", "y")])
    # x and y tie (same shares, same usage); their users are pooled: c (S=1, U=1 in y)
    # has LF 1, b (S=.75, U=.5) 1.5, a (S=.25, U=.5) .5.
    usage = {("a", "x"): 5.0, ("b", "x"): 5.0, ("c", "y"): 10.0}
    assert tree.fair_tree(usage) == {("b", "x"): 1.0, ("c", "y"): 2 / 3, ("a", "x"): 1 / 3}


def test_no_usage_at_all_gives_everyone_the_top_factor() -> None:
    tree = three_level_tree()
    assert set(tree.fair_tree({}).values()) == {1.0}
    assert set(tree.classic({}).values()) == {1.0}


def test_decay_halves_usage_every_half_life() -> None:
    assert decay(1000.0, WEEK, WEEK) == pytest.approx(500.0)
    assert decay(1000.0, 2 * WEEK, WEEK) == pytest.approx(250.0)
    assert decay(1000.0, WEEK, 0) == 1000.0  # half-life 0: no decay


def test_accrual_is_consistent_over_split_intervals_and_saturates() -> None:
    once = accrue(0.0, 10 * DAY, WEEK, billed_rate=2.0)
    twice = accrue(accrue(0.0, 4 * DAY, WEEK, 2.0), 6 * DAY, WEEK, 2.0)
    assert once == pytest.approx(twice)
    assert once < 2.0 * 10 * DAY  # what accrued early has decayed a little
    steady = 2.0 * WEEK / math.log(2)
    assert accrue(0.0, 50 * WEEK, WEEK, 2.0) == pytest.approx(steady, rel=1e-6)
    assert accrue(10.0, 3600.0, 0, 2.0) == 10.0 + 7200.0


def test_old_heavy_usage_decays_below_recent_light_usage() -> None:
    """Simulated time: alice used 10,000 GPU-s four weeks ago, bob 1,000 one day ago."""
    tree = FairShareTree([Account("lab", "root")], [UserShare("alice", "lab"), UserShare("bob", "lab")])
    now = 30 * DAY
    raw = {("alice", "lab"): (10_000.0, now - 28 * DAY), ("bob", "lab"): (1_000.0, now - DAY)}
    undecayed = {k: u for k, (u, _) in raw.items()}
    decayed = {k: decay(u, now - t, WEEK) for k, (u, t) in raw.items()}
    assert decayed[("alice", "lab")] == pytest.approx(625.0)
    assert tree.fair_tree(undecayed)[("bob", "lab")] > tree.fair_tree(undecayed)[("alice", "lab")]
    assert tree.fair_tree(decayed)[("alice", "lab")] > tree.fair_tree(decayed)[("bob", "lab")]


def test_tree_errors_name_the_bad_reference() -> None:
    with pytest.raises(ValueError, match="unknown parent nowhere"):
        FairShareTree([Account("a", "nowhere")], [])
    with pytest.raises(ValueError, match="unknown account b"):
        FairShareTree([Account("a", "root")], [UserShare("u", "b")])


# --- properties ---------------------------------------------------------------------------

@st.composite
def trees_and_usage(draw: st.DrawFn) -> tuple[FairShareTree, dict[tuple[str, str], float]]:
    n_accounts = draw(st.integers(1, 6))
    accounts = []
    for i in range(n_accounts):
        parent = "root" if i == 0 else draw(st.sampled_from(["root"] + [f"a{j}" for j in range(i)]))
        accounts.append(Account(f"a{i}", parent, draw(st.integers(1, 5))))
    users = [UserShare(f"u{i}", f"a{draw(st.integers(0, n_accounts - 1))}", draw(st.integers(1, 5)))
             for i in range(draw(st.integers(1, 8)))]
    usage = {(u.user, u.account): float(draw(st.integers(0, 1000))) for u in users}
    return FairShareTree(accounts, users), usage


@settings(max_examples=300, deadline=None)
@given(trees_and_usage(), st.data())
def test_more_usage_never_raises_a_users_factor(
        case: tuple[FairShareTree, dict[tuple[str, str], float]], data: st.DataObject) -> None:
    tree, usage = case
    key = data.draw(st.sampled_from(sorted(usage)))
    more = {**usage, key: usage[key] + data.draw(st.integers(1, 5000))}
    assert tree.fair_tree(more)[key] <= tree.fair_tree(usage)[key]
    assert tree.classic(more)[key] <= tree.classic(usage)[key]


@settings(max_examples=100, deadline=None)
@given(trees_and_usage())
def test_factors_are_deterministic_and_in_range(
        case: tuple[FairShareTree, dict[tuple[str, str], float]]) -> None:
    tree, usage = case
    fair = tree.fair_tree(usage)
    assert fair == tree.fair_tree(dict(reversed(list(usage.items()))))
    assert set(fair) == set(tree.users)
    assert all(0 < f <= 1 for f in fair.values())
    assert max(fair.values()) == 1.0
    assert all(0 <= f <= 1 for f in tree.classic(usage).values())


def test_report_walks_the_tree_like_sshare() -> None:
    rows = three_level_tree().report(USAGE)
    shown = [(r.depth, r.account, r.user, r.raw_usage, r.fairshare) for r in rows]
    assert shown == [
        (0, "root", None, 1000.0, None),
        (1, "bio", None, 100.0, None),
        (2, "bio", "dave", 100.0, 1.0),
        (1, "physics", None, 900.0, None),
        (2, "exp", None, 300.0, None),
        (3, "exp", "bob", 300.0, 0.5),
        (3, "exp", "carol", 0.0, 0.75),
        (2, "theory", None, 600.0, None),
        (3, "theory", "alice", 600.0, 0.25),
    ]
    physics = next(r for r in rows if r.account == "physics" and r.user is None)
    assert (physics.norm_shares, physics.effective_usage) == (0.6, 0.9)
    alice = rows[-1]
    assert alice.norm_shares == pytest.approx(0.3)
    assert three_level_tree().report(USAGE, "classic")[-1].fairshare == pytest.approx(
        2 ** -(0.75 / 0.3))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_classic_factors_equal_the_reference(data: st.DataObject) -> None:
    n_accounts = data.draw(st.integers(1, 6))
    accounts = []
    for i in range(n_accounts):
        parent = "root" if i == 0 else data.draw(
            st.sampled_from(["root"] + [f"a{j}" for j in range(i)]))
        accounts.append(Account(f"a{i}", parent, data.draw(st.integers(1, 5))))
    users = [UserShare(f"u{i}", data.draw(st.sampled_from(["root"] + [a.name for a in accounts])),
                       data.draw(st.integers(1, 5)))
             for i in range(data.draw(st.integers(1, 8)))]
    usage = {(u.user, u.account): float(data.draw(st.integers(0, 1000))) for u in users}
    got = FairShareTree(accounts, users).classic(usage)
    want = classic_reference(accounts, users, usage)
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-9, abs=1e-12)
