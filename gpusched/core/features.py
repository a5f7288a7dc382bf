"""Node features and job constraints (sbatch's ``-C/--constraint``).

A node carries features: names an administrator gives it (``[[node]] features``) and
names its agent derives from its GPUs (``gpu_features``). A job's constraint says which
nodes it may use, in Slurm's syntax:

- ``a``: nodes with feature a; ``a&b``: with both; ``a|b``: with either (the nodes of
  one job may differ). Operators have no precedence: ``a|b&c`` is ``(a|b)&c``, read
  from left to right; parentheses group.
- ``[a|b|c]`` (matching OR): every node of the job has the same one of them.
- ``a*4`` (a count): at least 4 of the job's nodes have a; ``[a*2&b*4]`` (multiple
  counts): 2 nodes with a and 4 other nodes with b. A count needs brackets when the
  constraint has more than that one term, as in Slurm.
- One bracket per constraint, joined to the rest by ``&`` only: ``gpu&[rack1|rack2]``.

A constraint is a ``Constraint``: ``base`` (what every node of the job must have),
``choice`` (matching-OR alternatives: every node has one and the same) and ``counts``
(groups of nodes, disjoint, each of its count and expression). ``satisfied`` is the
rule; ``eligible``, ``options`` and ``possible`` are what the pass asks of it.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpusched.errors import UsageError

MAX_FEATURE_NAME = 64  # characters of one feature's name
MAX_CONSTRAINT_TEXT = 1024  # characters of a -C value
MAX_TERMS = 64  # feature names in one constraint
MAX_COUNT = 100_000  # nodes one count may ask for
MAX_DEPTH = 16  # parentheses within parentheses
MAX_NODE_FEATURES = 128  # features one node may carry (admin's and its GPUs' together)
# A feature's name: letters, digits and ``_ . + -`` (``sm_80``, ``a100-80gb``); case counts.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,%d}" % (MAX_FEATURE_NAME - 1))
_TOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-z0-9_.+-]+)|(?P<op>[&|()\[\]*,]))")


class ConstraintError(UsageError):
    """A -C value that cannot be taken (sbatch: Invalid feature specification)."""


def valid_feature(name: str) -> bool:
    """Whether ``name`` may name a node feature."""
    return _NAME.fullmatch(name) is not None


# -- expressions -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Expr:
    """Feature names joined by ``&`` and ``|`` from left to right: ``first`` then each
    (operator, term) of ``rest``; a term is a name or a parenthesised Expr."""

    first: str | Expr
    rest: tuple[tuple[str, str | Expr], ...] = ()

    def holds(self, features: frozenset[str] | set[str]) -> bool:
        """Whether a node with ``features`` satisfies this expression."""
        value = _term(self.first, features)
        for op, term in self.rest:
            value = (value and _term(term, features)) if op == "&" else (
                value or _term(term, features))
        return value

    def text(self) -> str:
        """The canonical text: no spaces, parentheses only around nested groups."""
        return _term_text(self.first) + "".join(op + _term_text(t) for op, t in self.rest)

    def names(self) -> Iterable[str]:
        """Every feature name it mentions."""
        for term in (self.first, *(t for _, t in self.rest)):
            if isinstance(term, str):
                yield term
            else:
                yield from term.names()


def _term(term: str | Expr, features: frozenset[str] | set[str]) -> bool:
    return term in features if isinstance(term, str) else term.holds(features)


def _term_text(term: str | Expr) -> str:
    return term if isinstance(term, str) else f"({term.text()})"


@dataclass(frozen=True, slots=True)
class Constraint:
    """A parsed constraint: see the module's docstring. ``choice`` and ``counts`` are
    never both set (one bracket per constraint)."""

    base: Expr | None = None
    choice: tuple[Expr, ...] = ()
    counts: tuple[tuple[Expr, int], ...] = ()
    bracketed: bool = False  # counts written in brackets (``[a*2]``, not ``a*2``)

    @property
    def counted(self) -> int:
        """Nodes the counts name together (0: no counts)."""
        return sum(count for _, count in self.counts)

    def text(self) -> str:
        """The canonical text, parsed back to an equal Constraint."""
        parts = [self.base.text()] if self.base is not None else []
        if self.choice:
            parts.append("[" + "|".join(_item_text(e) for e in self.choice) + "]")
        elif self.counts:
            inner = "&".join(f"{_item_text(e)}*{n}" for e, n in self.counts)
            parts.append(f"[{inner}]" if self.bracketed else inner)
        return "&".join(parts)

    def names(self) -> frozenset[str]:
        """Every feature name it mentions."""
        exprs = [*([self.base] if self.base else []), *self.choice, *(e for e, _ in self.counts)]
        return frozenset(name for e in exprs for name in e.names())


def _item_text(expr: Expr) -> str:
    return expr.text() if not expr.rest and isinstance(expr.first, str) else f"({expr.text()})"


# -- parsing ---------------------------------------------------------------------------
class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            found = _TOKEN.match(text, pos)
            if found is None:
                raise ConstraintError(f"--constraint: unexpected {text[pos:].strip()[:1]!r} "
                                      f"at character {pos + 1}")
            self.tokens.append(found.group("name") or found.group("op"))
            pos = found.end()
        self.pos = 0
        self.terms = 0
        self.single = False
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str | None:
        token = self.peek()
        self.pos += 1
        return token

    def fail(self, what: str) -> ConstraintError:
        seen = self.peek()
        where = "the end" if seen is None else repr(seen)
        return ConstraintError(f"--constraint: expected {what}, found {where}")

    def name(self, token: str) -> str:
        if not valid_feature(token):
            raise ConstraintError(
                f"--constraint: {token[:MAX_FEATURE_NAME + 8]!r} is not a feature name "
                f"(letters, digits, '_', '.', '+', '-'; at most {MAX_FEATURE_NAME})")
        self.terms += 1
        if self.terms > MAX_TERMS:
            raise ConstraintError(f"--constraint: at most {MAX_TERMS} feature names")
        return token

    def count(self) -> int | None:
        if self.peek() != "*":
            return None
        self.take()
        token = self.take()
        if token is None or not token.isdigit() or len(token) > 6 or not 0 < int(token) <= MAX_COUNT:
            raise ConstraintError(f"--constraint: a count after '*' is a whole number, 1 to "
                                  f"{MAX_COUNT}")
        return int(token)

    def term(self) -> str | Expr:
        """A name or a parenthesised expression (no brackets, no counts inside)."""
        token = self.take()
        if token == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ConstraintError(f"--constraint: at most {MAX_DEPTH} parentheses deep")
            inner = self.expr()
            self.depth -= 1
            if self.take() != ")":
                self.pos -= 1
                raise self.fail("')'")
            return inner
        if token is None or token in "&|()[]*,":
            self.pos -= 1
            raise self.fail("a feature name or '('")
        return self.name(token)

    def expr(self) -> Expr:
        first = self.term()
        rest: list[tuple[str, str | Expr]] = []
        while self.peek() in ("&", "|") and self.tokens[self.pos + 1:self.pos + 2] != ["["]:
            op = self.take()
            assert op is not None
            rest.append((op, self.term()))
        self.single = not rest  # one term: a count may follow it
        if not rest and isinstance(first, Expr):
            return first  # ``(a&b)`` alone is ``a&b``
        return Expr(first, tuple(rest))

    def bracket(self) -> tuple[tuple[Expr, ...], tuple[tuple[Expr, int], ...]]:
        """``[a|b|...]`` (matching OR) or ``[a*N&b*M...]`` (counts); the '[' is taken."""
        items: list[tuple[Expr, int | None]] = []
        ops: set[str] = set()
        while True:
            term = self.term()
            items.append((term if isinstance(term, Expr) else Expr(term), self.count()))
            op = self.take()
            if op == "]":
                break
            if op not in ("&", "|"):
                self.pos -= 1
                raise self.fail("'&', '|' or ']'")
            ops.add(op)
        if ops == {"&", "|"}:
            raise ConstraintError("--constraint: a bracket holds either alternatives "
                                  "([a|b]) or counts ([a*2&b*4]), not both")
        counted = [n for _, n in items if n is not None]
        if "|" in ops or (not ops and not counted):
            if counted:
                raise ConstraintError("--constraint: no counts in a matching OR ([a|b])")
            return tuple(e for e, _ in items), ()
        if len(counted) < len(items):
            raise ConstraintError("--constraint: every item of [a*N&b*M] needs a count")
        return (), tuple((e, n) for e, n in items if n is not None)


def parse_constraint(text: str) -> Constraint:
    """A -C value as a Constraint; ConstraintError saying why it cannot be taken."""
    if len(text) > MAX_CONSTRAINT_TEXT:
        raise ConstraintError(f"--constraint: at most {MAX_CONSTRAINT_TEXT} characters")
    if not text.strip():
        raise ConstraintError("--constraint: expected at least one feature name")
    if "," in text:
        raise ConstraintError("--constraint: join features with '&' (and) or '|' (or), "
                              "not ','")
    p = _Parser(text)
    parts: list[Expr] = []  # the expressions joined by '&' around the bracket
    choice: tuple[Expr, ...] = ()
    counts: tuple[tuple[Expr, int], ...] = ()
    bracketed = False
    while True:
        if p.peek() == "[":
            if bracketed:
                raise ConstraintError("--constraint: one bracket per constraint")
            p.take()
            choice, counts = p.bracket()
            bracketed = True
        else:
            start = p.pos
            expr = p.expr()
            if bracketed and not p.single and any(op == "|" for op, _ in expr.rest):
                raise ConstraintError("--constraint: a bracket is joined to other features "
                                      "with '&' only (put the '|' in parentheses)")
            count = p.count()
            if count is not None:
                if not p.single or counts or parts or p.peek() is not None or start != 0:
                    raise ConstraintError("--constraint: a count beside other features "
                                          "needs brackets: [a*2&b*4]")
                counts = ((expr, count),)
            else:
                parts.append(expr)
        op = p.take()
        if op is None:
            break
        if op == "|":
            raise ConstraintError("--constraint: a bracket is joined to other features "
                                  "with '&' only (put the '|' in parentheses)")
        if op != "&":
            p.pos -= 1
            raise p.fail("'&', '|' or the end")
    base = None
    for part in parts:
        base = part if base is None else _and(base, part)
    return Constraint(base, choice, counts, bracketed and bool(counts))


def _and(left: Expr, right: Expr) -> Expr:
    """``left & right`` as one expression."""
    term: str | Expr = right.first if not right.rest else right
    return Expr(left.first, (*left.rest, ("&", term))) if all(
        op == "&" for op, _ in left.rest) else Expr(left, (("&", term),))


# -- what a node set must be -----------------------------------------------------------
def eligible(constraint: Constraint, features: frozenset[str] | set[str]) -> bool:
    """Whether a node with ``features`` may be one of a job's nodes under ``constraint``
    (its base, and one of the alternatives; counts do not bar a node)."""
    if constraint.base is not None and not constraint.base.holds(features):
        return False
    return not constraint.choice or any(alt.holds(features) for alt in constraint.choice)


def options(constraint: Constraint, nodes: Mapping[int, frozenset[str]]) -> list[frozenset[int]]:
    """The node sets a job may take all its nodes from: one per matching-OR
    alternative, in the order written (else one), each of eligible nodes."""
    base = [i for i, f in nodes.items()
            if constraint.base is None or constraint.base.holds(f)]
    if not constraint.choice:
        return [frozenset(base)]
    return [frozenset(i for i in base if alt.holds(nodes[i])) for alt in constraint.choice]


def counts_fit(counts: Sequence[tuple[Expr, int]], nodes: Mapping[int, frozenset[str]]
               ) -> bool:
    """Whether distinct ``nodes`` can fill every count (each node at most one)."""
    return assign_counts(counts, nodes) is not None


def assign_counts(counts: Sequence[tuple[Expr, int]], nodes: Mapping[int, frozenset[str]]
                  ) -> list[list[int]] | None:
    """Distinct ``nodes`` for each count (each node fills at most one), in the order of
    ``counts`` and of ``nodes``; None when no choice fills them all. A maximum flow from
    the counts to the kinds of node (which counts a node may fill, as a bit mask), each
    kind as many times as it has nodes; augmenting paths found breadth first, so a large
    count takes few rounds and no recursion."""
    needed = sum(count for _, count in counts)
    kinds: dict[int, list[int]] = {}
    for index, features in nodes.items():
        mask = sum(1 << k for k, (expr, _) in enumerate(counts) if expr.holds(features))
        if mask:
            kinds.setdefault(mask, []).append(index)
    if sum(len(members) for members in kinds.values()) < needed:
        return None
    # Vertices: "s", ("count", k), ("kind", mask), "t"; residual capacities.
    room: dict[object, dict[object, int]] = {"s": {}, "t": {}}
    for k, (_, count) in enumerate(counts):
        room["s"][("count", k)] = count
        room[("count", k)] = {"s": 0}
    for mask, members in kinds.items():
        room[("kind", mask)] = {"t": len(members)}
        room["t"][("kind", mask)] = 0
        for k in range(len(counts)):
            if mask >> k & 1:
                room[("count", k)][("kind", mask)] = needed
                room[("kind", mask)][("count", k)] = 0
    flow = 0
    while flow < needed:
        came: dict[object, object] = {"s": "s"}
        queue: deque[object] = deque(["s"])
        while queue and "t" not in came:
            at = queue.popleft()
            for to, left in room[at].items():
                if left > 0 and to not in came:
                    came[to] = at
                    queue.append(to)
        if "t" not in came:
            return None
        path: list[object] = ["t"]
        while path[-1] != "s":
            path.append(came[path[-1]])
        push = min(room[b][a] for a, b in zip(path, path[1:]))
        for a, b in zip(path, path[1:]):
            room[b][a] -= push
            room[a][b] += push
        flow += push
    # What flowed from count k to a kind is the residual room back from the kind.
    unused = {mask: iter(members) for mask, members in kinds.items()}
    chosen: list[list[int]] = []
    for k in range(len(counts)):
        taken: list[int] = []
        for mask, members_left in unused.items():
            taken.extend(next(members_left)
                         for _ in range(room[("kind", mask)].get(("count", k), 0)))
        chosen.append(taken)
    return chosen


def satisfied(constraint: Constraint, allocation: Sequence[frozenset[str]]) -> bool:
    """Whether nodes with these features (one entry per node of the job) satisfy
    ``constraint``: every node its base; all of them one same alternative; and the
    counts filled by distinct nodes among them."""
    if constraint.base is not None and not all(constraint.base.holds(f) for f in allocation):
        return False
    if constraint.choice and not any(all(alt.holds(f) for f in allocation)
                                     for alt in constraint.choice):
        return False
    return not constraint.counts or counts_fit(constraint.counts, dict(enumerate(allocation)))


def possible(constraint: Constraint, nodes: Mapping[int, frozenset[str]], wanted: int) -> bool:
    """Whether ``wanted`` distinct nodes among ``nodes`` could satisfy ``constraint``
    (whatever they run now): BadConstraints when not."""
    if constraint.counted > wanted:
        return False
    for option in options(constraint, nodes):
        if len(option) >= wanted and (not constraint.counts or counts_fit(
                constraint.counts, {i: nodes[i] for i in option})):
            return True
    return False


def check_request(constraint: Constraint, nodes: int, whole_or_shared: bool = False) -> None:
    """What the job's own shape rules out, whatever the cluster: counts over more nodes
    than the job has, and counts on several nodes of a job that takes whole nodes or a
    share of one GPU (``whole_or_shared``)."""
    if constraint.counted > nodes:
        raise ConstraintError(
            f"--constraint: its counts name {constraint.counted} nodes, the job has {nodes} "
            f"(ask for more with --nodes)")
    if constraint.counts and nodes > 1 and whole_or_shared:
        raise ConstraintError("--constraint: node counts (a*N) are not taken with "
                              "--exclusive, --gpu-mem or a GPU share")


def stored_constraint(text: str | None) -> Constraint | None:
    """A stored constraint's Constraint (None: none); stored texts were checked at submit."""
    return None if not text else parse_constraint(text)


# -- the features a node's GPUs give it -------------------------------------------------
_NOMINAL = re.compile(r"-(\d+)gb\Z")


def memory_feature(gpu_type: str, memory_mb: int) -> str | None:
    """``gpumem<N>g``: a GPU's memory in GB, as its type states it (``a100-80gb``:
    80), else its memory rounded up to a multiple of 4 GiB (what NVML reports is a
    little under the product's nominal size); None when not known."""
    nominal = _NOMINAL.search(gpu_type)
    if nominal:
        return f"gpumem{int(nominal.group(1))}g"
    if memory_mb <= 0:
        return None
    return f"gpumem{-(-memory_mb // 4096) * 4}g"


def gpu_features(gpus: Iterable[Mapping[str, object]], nvlink: bool = False,
                 capabilities: Iterable[tuple[int, int]] = ()) -> list[str]:
    """The features a node's GPUs give it, sorted: each whole GPU's type (``a100-80gb``)
    and model (``a100``), its memory (``gpumem80g``), ``mig`` when a GPU is in MIG
    mode, ``nvlink`` when two GPUs are joined by NVLink, and each compute capability
    NVML reports (``sm_80``). ``gpus`` are inventory records (``type``, ``memory_mb``,
    ``mig_profile``, ``parent``)."""
    found: set[str] = set()
    for gpu in gpus:
        kind = str(gpu.get("type") or "gpu")
        if gpu.get("mig_profile"):
            found.add("mig")
            continue
        if kind != "gpu" and valid_feature(kind):
            found.add(kind)
            found.add(_NOMINAL.sub("", kind))
        memory = gpu.get("memory_mb")
        feature = memory_feature(kind, memory if isinstance(memory, int) else 0)
        if feature:
            found.add(feature)
    if nvlink:
        found.add("nvlink")
    for major, minor in capabilities:
        if 0 <= major < 100 and 0 <= minor < 10:
            found.add(f"sm_{major}{minor}")
    return sorted(found)


def check_features(names: object, what: str) -> tuple[str, ...]:
    """A list of feature names as sent or configured, checked and sorted without
    repeats; UsageError naming ``what`` otherwise."""
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise UsageError(f"{what}: expected a list of feature names")
    if len(names) > MAX_NODE_FEATURES:
        raise UsageError(f"{what}: at most {MAX_NODE_FEATURES} features")
    for name in names:
        if not valid_feature(name):
            raise UsageError(f"{what}: {name[:80]!r} is not a feature name (letters, digits, "
                             f"'_', '.', '+', '-'; at most {MAX_FEATURE_NAME})")
    return tuple(sorted(set(names)))


def canonical_constraint(text: str) -> str:
    """A -C value checked and in its canonical text (ConstraintError naming why not)."""
    return parse_constraint(text).text()
