"""What a pass does with a job's constraint (-C/--constraint, core/features.py): the
nodes it may use, whether any node set of its partition could ever satisfy it
(BadConstraints when not), and the starts of a job whose constraint counts nodes.

- A constraint without counts narrows the job's nodes to the eligible ones. A job on
  several nodes with a matching OR (``[a|b]``) takes all of them from one alternative:
  the one where it could start soonest (the first written among equals).
- A job on several nodes whose constraint counts nodes (``a*2``, ``[a*2&b*4]``) starts
  only when, at once, each count finds its nodes (distinct: fewest candidates first,
  else as a matching of the counts to the nodes ready now finds them) and its other
  nodes are found among the eligible rest. When it waits, it gets a
  reservation (or an expected start) at the earliest time its number of nodes is free
  together, when the nodes found then satisfy its counts; else neither (the pass does
  not search the timeline for counts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpusched.core.features import (
    Constraint,
    assign_counts,
    options,
    parse_constraint,
    possible,
    satisfied,
)
from gpusched.core.model import PendingJob, Reason, Reservation
from gpusched.core.units import INF, Shape

if TYPE_CHECKING:
    from gpusched.core.plan import SchedulingPass


class FeatureHooks:
    """A pass's view of node features, made once per pass; every answer is cached by
    the node set and the constraint's text."""

    def __init__(self, sched: SchedulingPass) -> None:
        self.sched = sched
        self._parsed: dict[str, Constraint] = {}
        self._options: dict[tuple[object, str, bool], list[frozenset[int]]] = {}
        self._possible: dict[tuple[object, str, int], bool] = {}
        # Counted jobs the matching found no nodes for, by what decides it, with the
        # capacity's state then: a like job is not matched again until that changes.
        self._unmatched: set[tuple[object, ...]] = set()

    def constraint(self, job: PendingJob) -> Constraint:
        """The job's parsed constraint (stored texts were checked at submit)."""
        text = job.constraint or ""
        found = self._parsed.get(text)
        if found is None:
            found = self._parsed[text] = parse_constraint(text)
        return found

    def _features(self, members: frozenset[int]) -> dict[int, frozenset[str]]:
        nodes = self.sched.capacity.nodes
        return {i: nodes[i].view.features for i in members}

    def _node_sets(self, job: PendingJob, members: frozenset[int], group: object
                   ) -> tuple[list[frozenset[int]], tuple[object, str, bool]]:
        """The node sets ``job`` may take (one per alternative of a matching OR), and
        the key they are known by."""
        constraint = self.constraint(job)
        # Whether every node fills a count depends on the job's number of nodes too.
        only_counted = bool(constraint.counts) and constraint.counted >= job.nodes
        key = (group, job.constraint or "", only_counted)
        found = self._options.get(key)
        if found is None:
            features = self._features(members)
            found = options(constraint, features)
            if only_counted:
                # Every node fills a count: only nodes some count takes.
                found = [frozenset(i for i in option if any(
                    expr.holds(features[i]) for expr, _ in constraint.counts))
                    for option in found]
            self._options[key] = found
        return found, key

    def possible(self, job: PendingJob) -> bool:
        """Whether some nodes of those the job may use could satisfy its constraint."""
        members, group = self.sched._named_where(job)
        key = (group, job.constraint or "", job.nodes)
        found = self._possible.get(key)
        if found is None:
            found = self._possible[key] = possible(
                self.constraint(job), self._features(members), max(1, job.nodes))
        return found

    def where(self, job: PendingJob, members: frozenset[int], group: object
              ) -> tuple[frozenset[int], object]:
        """The nodes ``job`` may take now under its constraint, and the group whose
        failures they share."""
        sets, key = self._node_sets(job, members, group)
        if len(sets) == 1:
            return sets[0], key
        if job.nodes <= 1:  # one node: any alternative
            return frozenset().union(*sets), key
        shape = Shape.of(job)
        estimate = self.sched.capacity.estimate  # remembered per set and shape
        best = min(range(len(sets)), key=lambda k: (estimate(shape, sets[k], (*key, k)), k))
        return sets[best], (*key, best)

    def counted(self, job: PendingJob) -> bool:
        """Whether ``job`` starts by ``try_counted``: several nodes, counts among them."""
        return job.nodes > 1 and bool(self.constraint(job).counts)

    def try_counted(self, job: PendingJob, task: int | None, members: frozenset[int],
                    group: object) -> Reason | None:
        """Start ``job`` now with each count on its own nodes; else the reason it waits.
        The counts take their nodes in turn, fewest candidates first; where the nodes
        one took leave another short, the counts are matched to the nodes ready now
        (``assign_counts``), which finds nodes for them all whenever any choice can."""
        constraint = self.constraint(job)
        features = self._features(members)
        shape = Shape.of(job)
        fits = sorted(((frozenset(i for i in members if expr.holds(features[i])), count, k)
                       for k, (expr, count) in enumerate(constraint.counts)),
                      key=lambda item: (len(item[0]), item[2]))
        rest = job.nodes - constraint.counted
        parts = [(nodes, count, ("count", k)) for nodes, count, k in fits]
        placed, crowded = self._place(parts, rest, shape, members, (group, job.constraint))
        if placed is None and crowded:
            placed = self._matched(job, constraint, shape, members, features, rest, group)
        if placed is None:
            first = job.partition not in self.sched.blocked
            self.sched.blocked.setdefault(job.partition, job)
            self._wait(job, constraint, shape, members, features)
            return (self.sched._resources_reason(job, shape, members) if first
                    else Reason.PRIORITY)
        self.sched._start_placed(job, task, placed, shape)
        return None

    def _matched(self, job: PendingJob, constraint: Constraint, shape: Shape,
                 members: frozenset[int], features: dict[int, frozenset[str]], rest: int,
                 group: object) -> list[tuple[int, str]] | None:
        """Nodes for a counted job by matching its counts to the nodes ready now; None
        when none fill them all (remembered while the capacity is unchanged)."""
        capacity = self.sched.capacity
        unmatched = (group, job.constraint, shape, members, capacity.state())
        if unmatched in self._unmatched:
            return None
        ready = capacity.ready_now(shape._replace(nodes=1), members)
        chosen = assign_counts(constraint.counts, {i: features[i] for i in ready})
        placed = None
        if chosen is not None:
            parts = [(frozenset(nodes), len(nodes), ("count", k))
                     for k, nodes in enumerate(chosen)]
            placed, _ = self._place(parts, rest, shape, members,
                                    (group, job.constraint, "matched"))
        if placed is None:
            self._unmatched.add(unmatched)
        return placed

    def _place(self, parts: list[tuple[frozenset[int], int, tuple[str, int]]], rest: int,
               shape: Shape, members: frozenset[int], key: tuple[object, ...]
               ) -> tuple[list[tuple[int, str]] | None, bool]:
        """Best-fit nodes now for each part in turn (its count of nodes from its set,
        none taken twice), then for the job's ``rest`` among ``members``. When a part
        finds too few: None, and whether the parts before it had taken nodes (else no
        other choice of nodes could start the job either)."""
        capacity = self.sched.capacity
        used: set[int] = set()
        placed: list[tuple[int, str]] = []
        if rest > 0:
            parts = [*parts, (members, rest, ("rest", 0))]
        for nodes, count, part in parts:
            found = capacity.place_now(shape._replace(nodes=count), nodes - used,
                                       (*key, *part, frozenset(used)))
            if found is None:
                return None, bool(used)
            used.update(index for index, _ in found)
            placed.extend(found)
        return placed, False

    def _wait(self, job: PendingJob, constraint: Constraint, shape: Shape,
              members: frozenset[int], features: dict[int, frozenset[str]]) -> None:
        """A counted job that waits: a reservation (while the partition has one to give)
        or an expected start, at the earliest time its number of nodes is free together,
        when the nodes found then satisfy its counts; else nothing (the pass does not
        search further)."""
        sched = self.sched
        reserving = sched.reserving and sched.reserved_in[job.partition] < sched.depth
        if not reserving and not (sched.depth and sched.policy.estimates):
            return
        at, where = sched.capacity.where_to_reserve(shape, members)
        if at == INF or not satisfied(constraint, [features[index] for index, _ in where]):
            return
        sched.expected[job.job_id] = at
        if reserving:  # as SchedulingPass._try_start reserves for any job
            sched.reserved_in[job.partition] += 1
            sched.limits.reserved(job)
            sched.reshaped = sched.reshaped or at <= sched.now
            sched.capacity.reserve(at, where, shape, job.job_id)
            if sched.pools is not None:
                sched.pools.reserved(where, at, shape)
            sched.reservations.append(Reservation(
                job.job_id, at, tuple(sched.capacity.nodes[i].view.name for i, _ in where)))
