"""Fair-share: decayed usage over an account tree, ranked by Fair Tree or the classic formula.

Pure: usage figures and ``now`` come from the caller. The tree holds accounts (name,
parent, shares) and user associations (a user in an account, with shares).

Fair Tree, as Slurm documents it: at every level, each association's *level fair-share*
is ``S / U`` — its shares over the shares of it and its siblings, divided by its usage
over the usage of it and its siblings (``inf`` when it has used nothing). Siblings are
visited in descending level fair-share, depth first, and users are ranked in the order
they are reached; a user's factor is its rank over the number of users, so the first
reached gets 1.0. Siblings with equal level fair-share tie: tied users get the same
rank; the children of tied accounts are ranked together as one pool, which users tied
with those accounts join.

Classic: ``F = 2 ** (-UE / S)`` with ``S`` the user's shares normalised along its path
(the product of its and its ancestors' sibling share fractions) and ``UE`` its effective
usage, as Slurm's classic algorithm has it: an association's actual usage ``UA`` (its
usage over the whole tree's) moved toward its parent's effective usage by its fraction
of the shares at its level, ``UE = UA + (UE_parent - UA) * S_self / S_level``; under
the root, ``UE = UA``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import groupby

ROOT = "root"
UserKey = tuple[str, str]  # (user, account)


@dataclass(frozen=True, slots=True)
class Account:
    """An account: a node of the tree. The root account is named ``root``."""

    name: str
    parent: str | None
    shares: int = 1


@dataclass(frozen=True, slots=True)
class UserShare:
    """A user's association with an account: a leaf of the tree."""

    user: str
    account: str
    shares: int = 1


def decay(usage: float, elapsed: float, half_life: float) -> float:
    """Usage after ``elapsed`` seconds of exponential decay with ``half_life``."""
    if half_life <= 0:
        return usage
    return usage * math.pow(2.0, -elapsed / half_life)


def accrue(usage: float, elapsed: float, half_life: float, billed_rate: float) -> float:
    """Decayed usage plus what a constant ``billed_rate`` (units/s) adds over ``elapsed``.

    The added part decays too while it accrues: ∫ r·2^(-(t-s)/h) ds over the interval.
    """
    if half_life <= 0:
        return usage + billed_rate * elapsed
    k = math.log(2) / half_life
    return decay(usage, elapsed, half_life) + billed_rate * (1 - math.exp(-k * elapsed)) / k


@dataclass(frozen=True, slots=True)
class ShareRow:
    """One line of ``gpusched share``: an account, or a user within an account."""

    depth: int
    account: str
    user: str | None
    shares: int
    norm_shares: float
    raw_usage: float
    effective_usage: float
    fairshare: float | None  # users only


class FairShareTree:
    """The account tree, ready to rank users for a given usage."""

    def __init__(self, accounts: Iterable[Account], users: Iterable[UserShare]) -> None:
        self.accounts = {a.name: a for a in accounts}
        self.accounts.setdefault(ROOT, Account(ROOT, None, 1))
        self.users = {(u.user, u.account): u for u in users}
        self._children: dict[str, list[str]] = {name: [] for name in self.accounts}
        self._user_children: dict[str, list[UserKey]] = {name: [] for name in self.accounts}
        for account in self.accounts.values():
            if account.parent is not None:
                if account.parent not in self.accounts:
                    raise ValueError(f"account {account.name}: unknown parent {account.parent}")
                self._children[account.parent].append(account.name)
        for key, user in self.users.items():
            if user.account not in self.accounts:
                raise ValueError(f"user {user.user}: unknown account {user.account}")
            self._user_children[user.account].append(key)
        for kids in self._children.values():
            kids.sort()
        for user_kids in self._user_children.values():
            user_kids.sort()

    def account_usage(self, usage: Mapping[UserKey, float]) -> dict[str, float]:
        """Usage of every account: the sum over the users below it."""
        totals: dict[str, float] = {}
        self._total(ROOT, usage, totals)
        return totals

    def _total(self, name: str, usage: Mapping[UserKey, float], totals: dict[str, float]
               ) -> float:
        # A method, not a nested function: a recursive closure is a reference cycle,
        # left for the cyclic collector on every pass.
        value = sum(usage.get(k, 0.0) for k in self._user_children[name])
        value += sum(self._total(child, usage, totals) for child in self._children[name])
        totals[name] = value
        return value

    def normalized_shares(self) -> dict[UserKey, float]:
        """Each user's share of the whole cluster: sibling fractions multiplied down the path."""
        result: dict[UserKey, float] = {}
        self._normalized(ROOT, 1.0, result)
        return result

    def _normalized(self, name: str, fraction: float, result: dict[UserKey, float]) -> None:
        kids = self._children[name]
        users = self._user_children[name]
        total = sum(self.accounts[c].shares for c in kids) + sum(self.users[u].shares for u in users)
        for child in kids:
            self._normalized(child, fraction * _ratio(self.accounts[child].shares, total), result)
        for key in users:
            result[key] = fraction * _ratio(self.users[key].shares, total)

    def report(self, usage: Mapping[UserKey, float], method: str = "fair_tree") -> list[ShareRow]:
        """The tree depth first, as ``sshare`` shows it: shares, usage and factors."""
        factors = self.classic(usage) if method == "classic" else self.fair_tree(usage)
        used = self.account_usage(usage)
        grand = used[ROOT]
        user_norm = self.normalized_shares()
        rows: list[ShareRow] = []

        def walk(name: str, depth: int, fraction: float) -> None:
            account = self.accounts[name]
            rows.append(ShareRow(depth, name, None, account.shares, fraction, used[name],
                                 _ratio(used[name], grand), None))
            kids = self._children[name]
            users = self._user_children[name]
            total = (sum(self.accounts[c].shares for c in kids)
                     + sum(self.users[u].shares for u in users))
            for key in users:
                raw = usage.get(key, 0.0)
                rows.append(ShareRow(depth + 1, name, key[0], self.users[key].shares,
                                     user_norm[key], raw, _ratio(raw, grand), factors.get(key)))
            for child in kids:
                walk(child, depth + 1, fraction * _ratio(self.accounts[child].shares, total))

        walk(ROOT, 0, 1.0)
        return rows

    def classic(self, usage: Mapping[UserKey, float]) -> dict[UserKey, float]:
        """Classic factors ``2 ** (-UE/S)`` for every user association."""
        effective = self.effective_usage(usage)
        factors: dict[UserKey, float] = {}
        for key, share in self.normalized_shares().items():
            factors[key] = 0.0 if share <= 0 else math.pow(2.0, -effective[key] / share)
        return factors

    def effective_usage(self, usage: Mapping[UserKey, float]) -> dict[UserKey, float]:
        """Each user association's effective usage (Slurm's classic ``UE``): its actual
        usage moved toward its account's effective usage by its fraction of the shares
        at its level; an association right under the root keeps its actual usage."""
        used = self.account_usage(usage)
        result: dict[UserKey, float] = {}
        self._effective(ROOT, None, usage, used, used[ROOT], result)
        return result

    def _effective(self, name: str, parent_effective: float | None,
                   usage: Mapping[UserKey, float], used: Mapping[str, float], grand: float,
                   result: dict[UserKey, float]) -> None:
        kids = self._children[name]
        users = self._user_children[name]
        total = (sum(self.accounts[c].shares for c in kids)
                 + sum(self.users[u].shares for u in users))

        def effective(used_here: float, shares: float) -> float:
            actual = _ratio(used_here, grand)
            if parent_effective is None:
                return actual
            return actual + (parent_effective - actual) * _ratio(shares, total)

        for child in kids:
            self._effective(child, effective(used[child], self.accounts[child].shares), usage,
                            used, grand, result)
        for key in users:
            result[key] = effective(usage.get(key, 0.0), self.users[key].shares)

    def fair_tree(self, usage: Mapping[UserKey, float]) -> dict[UserKey, float]:
        """Fair Tree factors: rank / number of users, best first."""
        if not self.users:
            return {}
        accounts_used = self.account_usage(usage)
        ranks: dict[UserKey, int] = {}
        self._visit(self._level_pool(ROOT, usage, accounts_used), usage, accounts_used, ranks,
                    len(self.users))
        return {key: rank / len(self.users) for key, rank in ranks.items()}

    def _visit(self, pool: list[tuple[float, str, bool]], usage: Mapping[UserKey, float],
               accounts_used: Mapping[str, float], ranks: dict[UserKey, int],
               next_rank: int) -> int:
        """Rank the users under ``pool`` (level fair-share, name or user key as text,
        is_user), best first, from ``next_rank`` down; the next rank left."""
        pool.sort(key=lambda item: (-item[0], item[1]))
        for _, group in groupby(pool, key=lambda item: item[0]):
            tied = list(group)
            if all(is_user for _, _, is_user in tied):
                for _, name, _ in tied:
                    ranks[self._user_key(name)] = next_rank
                next_rank -= len(tied)
                continue
            # Tied accounts: their children form one pool, joined by the tied users,
            # who keep their level fair-share (so with no usage anywhere, all tie).
            merged = [item for item in tied if item[2]]
            for _, name, is_user in tied:
                if not is_user:
                    merged += self._level_pool(name, usage, accounts_used)
            next_rank = self._visit(merged, usage, accounts_used, ranks, next_rank)
        return next_rank

    def _user_key(self, text: str) -> UserKey:
        user, _, account = text.partition("\0")
        return user, account

    def _level_pool(self, parent: str, usage: Mapping[UserKey, float],
                    accounts_used: Mapping[str, float]) -> list[tuple[float, str, bool]]:
        """The children of ``parent`` with their level fair-share."""
        kids = self._children[parent]
        users = self._user_children[parent]
        shares_total = sum(self.accounts[c].shares for c in kids) + sum(self.users[u].shares for u in users)
        usage_total = sum(accounts_used[c] for c in kids) + sum(usage.get(u, 0.0) for u in users)
        pool = [(_level(self.accounts[c].shares, shares_total, accounts_used[c], usage_total), c, False)
                for c in kids]
        pool += [(_level(self.users[u].shares, shares_total, usage.get(u, 0.0), usage_total),
                  f"{u[0]}\0{u[1]}", True) for u in users]
        return pool


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def _level(shares: float, shares_total: float, used: float, usage_total: float) -> float:
    """Level fair-share S/U; infinite for an association that used nothing."""
    s = _ratio(shares, shares_total)
    u = _ratio(used, usage_total)
    if s == 0:
        return 0.0
    return math.inf if u == 0 else s / u
