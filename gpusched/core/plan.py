"""One scheduling pass: ``plan(snapshot, now, policy) -> Plan``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

from gpusched.core.arrays import iter_tasks, task_count
from gpusched.core.budgets import BudgetBook
from gpusched.core.capacity import Capacity
from gpusched.core.dependency import task_reason
from gpusched.core.feature_starts import FeatureHooks
from gpusched.core.limits import LimitTracker
from gpusched.core.model import (
    Pending,
    PendingJob,
    Plan,
    Policy,
    Preemption,
    Reason,
    Reservation,
    Snapshot,
    Start,
    StartKind,
)
from gpusched.core.moments import Moment, MomentMixin
from gpusched.core.occupancy import Occupancy
from gpusched.core.ordering import (
    fairshare_factors,
    job_priorities,
    ordered,
    queue_order,
)
from gpusched.core.pools import UnitPools
from gpusched.core.resvholds import ReservationHooksMixin
from gpusched.core.share_starts import ShareStartsMixin
from gpusched.core.sharing import ShareBook, by_memory, cluster_shares, wants_share
from gpusched.core.timecut import capped, cut_start
from gpusched.core.units import INF, Shape
from gpusched.core.waits import WaitRulesMixin, partition_open

# The queue's order lives in core/ordering.py; callers find it here too.
__all__ = ["Moment", "SchedulingPass", "fairshare_factors", "job_priorities", "ordered",
           "plan", "queue_order"]


_PRIORITY = Reason.PRIORITY
# The share of a pass's time budget that goes to reservations (SchedulingPass.reserving).
EASY_RESERVE_SHARE = 0.5
CONSERVATIVE_RESERVE_SHARE = 0.8


class SchedulingPass(WaitRulesMixin, ShareStartsMixin, ReservationHooksMixin, MomentMixin):
    """The state of one pass as it walks the queue; ``plan`` runs one to the end.

    ``watch`` names a job whose ``Moment`` is recorded when the pass reaches it.
    """

    def __init__(self, snapshot: Snapshot, now: float, policy: Policy,
                 watch: int | None = None, occupancy: Occupancy | None = None) -> None:
        self.snapshot, self.now, self.policy, self.watch = snapshot, now, policy, watch
        self.partitions = {part.name: part for part in snapshot.partitions}
        # Partitions that hold no job back by their own rules: most, usually.
        self.open_partitions = frozenset(
            part.name for part in snapshot.partitions if partition_open(part))
        # Shared GPUs: each with a holder is held by a carrier (core/sharing.py). A kept
        # occupancy (the simulator's) must be that of snapshot.running and its carriers.
        book = ShareBook(snapshot.nodes, snapshot.running)
        self.book = book if book.any else None
        running = snapshot.running
        if self.book is not None and occupancy is None and self.book.gpus:
            running = (*running, *self.book.carriers())
        self.capacity = Capacity(snapshot.nodes, running, now, occupancy)
        self._hold_reservations()  # advance reservations' windows (core/resvholds.py)
        self.features = FeatureHooks(self)  # -C/--constraint (core/feature_starts.py)
        self.shared = cluster_shares(snapshot.nodes)
        self._init_shares()
        # Conservative backfill counts the units of interchangeable nodes (core/pools.py).
        self.pools = UnitPools(self.capacity) if policy.backfill == "conservative" else None
        self.members = self.capacity.inventory.members(snapshot.partitions)
        # Node sets of jobs that name or exclude nodes, by (partition, nodelist, exclude,
        # exclusive).
        self.restricted: dict[tuple[str, tuple[str, ...], tuple[str, ...], bool],
                              frozenset[int]] = {}
        # Partitions sharing nodes: a job starting in one passes blocked jobs of the others.
        self.overlaps = {a: [b for b in self.members if self.members[a] & self.members[b]]
                         for a in self.members}
        self.limits = LimitTracker(snapshot.qos_limits, snapshot.running, BudgetBook(
            snapshot.budgets, snapshot.accounts, snapshot.running, snapshot.nodes,
            snapshot.partitions) if snapshot.budgets else None, snapshot.licenses)
        self.limited_qos = frozenset(snapshot.qos_limits)  # a QOS without limits holds none
        self.budgeted = self.limits.budgeted  # accounts whose jobs a budget covers
        self.budgets = self.limits.budgets
        self.busy_names = set(snapshot.running_names)
        self.array_running = Counter(job.array_job_id for job in snapshot.running
                                     if job.array_job_id is not None)
        self.blocked: dict[str, PendingJob] = {}  # partition -> its first job that must wait
        self.reserved_in: Counter[str] = Counter()
        self.depth = policy.reservation_depth
        self.preempting = policy.preempt_mode != "off" and any(snapshot.qos_preempt.values())
        # Whether ``consider`` may decide for ``_try_start`` that a job waits behind the
        # blocked one (no pools or preemption, whose work that leaves out), and whether it
        # then gives the job an estimate of its start, as ``_try_start`` would.
        self.quick = self.pools is None and not self.preempting
        self.estimating = bool(self.depth and policy.estimates)
        self.max_starts = policy.max_starts_per_pass
        self.starts: list[Start] = []
        self.pending: list[Pending] = []
        self.reservations: list[Reservation] = []
        self.preemptions: list[Preemption] = []
        self.expected: dict[int, float] = {}  # job -> when it should start, if it waits
        # Sizes of jobs ``refused`` in this pass: their estimate and the state of the
        # capacity it was made in (``_behind``).
        self._refused: dict[tuple[object, ...], tuple[float, tuple[int, int, float]]] = {}
        self.moment: Moment | None = None
        self.backfill_examined = 0
        self.last_examined: int | None = None
        self.considered = 0
        self.spent: Callable[[], float] | None = None
        self.out_of_time = False
        # False once the share of the time budget that reservations may use is spent.
        # EASY reserves for a few jobs and then backfills the whole queue: half. Under
        # conservative backfill the reservations are the walk itself (each job starts,
        # or is held for), so they get most of it, and the rest still backfills.
        self.reserving = True
        self.reserve_share = (CONSERVATIVE_RESERVE_SHARE if policy.backfill == "conservative"
                              else EASY_RESERVE_SHARE)
        self.budget_asked = 0
        # Whether a job started after a reservation was made, or a reservation starts
        # now: then a later pass would see a different present (see ``arrive``).
        self.reshaped = False

    def where(self, job: PendingJob) -> tuple[frozenset[int], object]:
        """``_named_where``, narrowed to the nodes its constraint allows (-C)."""
        found = self._named_where(job)
        return self.features.where(job, *found) if job.constraint else found

    def _named_where(self, job: PendingJob) -> tuple[frozenset[int], object]:
        """The nodes ``job`` may run on, and the group whose failures it shares: its
        partition's, or for a job that names or excludes nodes, those of the partition
        it may use (a group of its own)."""
        members = self.members.get(job.partition, frozenset())
        if not job.nodelist and not job.exclude:
            return members, (job.partition, True) if job.exclusive else job.partition
        key = (job.partition, job.nodelist, job.exclude, job.exclusive)
        allowed = self.restricted.get(key)
        if allowed is None:
            index = self.capacity.index
            if job.nodelist:
                allowed = members & {index[n] for n in job.nodelist if n in index}
                if len(allowed) < len(job.nodelist):  # a named node is gone or elsewhere
                    allowed = frozenset()
            else:
                allowed = members
            allowed = self.restricted[key] = allowed - {index[n] for n in job.exclude if n in index}
        return allowed, key

    def _place_whole(self, job: PendingJob, members: frozenset[int], group: object
                     ) -> tuple[list[tuple[int, str]] | None, Shape, frozenset[int]]:
        """Where an exclusive job starts now (the smallest idle nodes that hold it), with
        its shape and nodes; else None with the shape and nodes it could start on first."""
        options = self.capacity.whole_shapes(job, members)
        for shape, nodes in options:
            placed = self.capacity.place_now(shape, nodes, (group, shape.gpus))
            if placed is not None:
                return placed, shape, nodes
        soonest = min(options, key=lambda o: self.capacity.earliest(*o)[0])
        return None, soonest[0], soonest[1]

    def backfilling(self, job: PendingJob) -> bool:
        """Whether ``job`` can only start by backfill: its partition has a blocked job
        and no reservation left to give."""
        return job.partition in self.blocked and (
            not self.reserving or self.reserved_in[job.partition] >= self.depth)

    def _try_start(self, job: PendingJob, task: int | None) -> Reason | None:
        """Start one job (or one task of an array) now; else the reason it waits.

        Without backfill the first job of a partition that must wait holds back all
        behind it. With it, a job starts wherever it fits now without delaying any
        reservation; the first jobs that must wait get reservations.
        """
        if len(self.starts) >= self.policy.max_starts_per_pass or (
                self.depth == 0 and job.partition in self.blocked):
            return Reason.PRIORITY
        members, group = self.where(job)
        if self.whole_held and not (job.gpus or job.cpus or job.mem_mb):
            members = self._off_holds(job, members)  # core/resvholds.py
        job, limit = capped(job, self.now), job.time_limit  # --deadline (core/timecut.py)
        if job.constraint and self.features.counted(job):
            return self.features.try_counted(job, task, members, group)
        if wants_share(job):
            return self._try_share(job, task, members)
        if by_memory(job):
            # A MIG slice or an MPS share with that much memory, if one is free now;
            # else a whole GPU with it (or its wait).
            if self._memory_now(job, task, members, group):
                return None
            job = replace(job, gpu_kinds=self.shared.memory.whole(job.gpu_mem_mb))
        whole: Shape | None = None
        shape: Shape | None
        pool = None if self.pools is None else self.pools.pool_for(job, members, group)
        if self.pools is not None and pool is None:
            self.pools.fence()
        if pool is not None:
            shape = Shape.of(job)
            placed = pool.place_now(shape)
        elif job.exclusive:  # every unit of its kind on each node, on idle nodes only
            placed, whole, members = self._place_whole(job, members, group)
            shape = whole if placed is not None else None
        else:
            # Most jobs of a long queue need at least what an earlier one could not have.
            shape = None if self.capacity.refused(job, group) else Shape.of(job)
            placed = None if shape is None else self.capacity.place_now(shape, members, group)
        if placed is None and job.time_min is not None and not job.exclusive:  # --time-min
            placed, shape = cut_start(job, lambda s: pool.place_now(s) if pool is not None
                                      else self.capacity.place_now(s, members, group)) or (None, shape)
        if placed is None:
            first = job.partition not in self.blocked
            self.blocked.setdefault(job.partition, job)
            # An exclusive job needs idle nodes, which stopping some jobs does not give.
            preempted = self.preempting and not job.exclusive and self._preempt(
                job, shape := shape or Shape.of(job), members)
            if preempted or (self.reserving and self.reserved_in[job.partition] < self.depth):
                # A job that preempts always holds what it freed against backfill.
                self.reserved_in[job.partition] += 1
                shape = shape or whole or Shape.of(job)
                at, where = ((pool.earliest(shape), []) if pool is not None
                             else self.capacity.where_to_reserve(shape, members))
                if at < INF:
                    self.limits.reserved(job)  # its licenses are kept for it
                    self.reshaped = self.reshaped or at <= self.now
                    if pool is not None:  # named when the plan is made
                        pool.reserve(at, shape, job.job_id, len(self.reservations))
                    else:
                        self.capacity.reserve(at, where, shape, job.job_id)
                        if self.pools is not None:
                            self.pools.reserved(where, at, shape)
                    self.reservations.append(Reservation(
                        job.job_id, at, tuple(self.capacity.nodes[i].view.name for i, _ in where)))
                self.expected[job.job_id] = at
            elif self.estimating:
                self.expected[job.job_id] = (
                    pool.earliest(Shape.of(job), check=False) if pool is not None
                    else self.capacity.estimate(shape or whole or Shape.of(job), members, group))
            return self._resources_reason(job, shape or whole or Shape.of(job), members) \
                if first else Reason.PRIORITY
        assert shape is not None  # a job is placed only once it has its shape
        self._start_placed(job, task, placed, shape)
        if shape.duration != (INF if limit is None else limit):  # cut: its new time limit
            self.starts[-1] = replace(self.starts[-1], time_limit=int(shape.duration))
        return None

    def _start_kind(self, job: PendingJob) -> StartKind:
        return (StartKind.BACKFILLED if any(p in self.blocked
                                            for p in self.overlaps[job.partition])
                else StartKind.IMMEDIATE)

    def _start_placed(self, job: PendingJob, task: int | None,
                      placed: list[tuple[int, str]], shape: Shape) -> None:
        names: list[str] = []
        uuids: list[str] = []
        for index, unit_kind in placed:
            names.append(self.capacity.nodes[index].view.name)
            uuids.extend(gpu.uuid for gpu in self.capacity.take(index, unit_kind, shape))
        if self.pools is not None:
            self.pools.started(placed)
        self._started(job, Start(job.job_id, names[0], tuple(uuids), task,
                                 self._start_kind(job), tuple(names) if len(names) > 1 else ()))

    def _started(self, job: PendingJob, start: Start) -> None:
        self.starts.append(start)
        self.limits.started(job)
        self.reshaped = self.reshaped or bool(self.reservations)
        self.busy_names.add((job.user, job.name))
        if job.array_job_id is not None:
            self.array_running[job.array_job_id] += 1

    def _preempt(self, job: PendingJob, shape: Shape, members: frozenset[int]) -> bool:
        """Stop running jobs of a QOS ``job``'s QOS may preempt, if that lets it start
        within the grace time and nothing else will; the victims lose the least work."""
        targets = self.snapshot.qos_preempt.get(job.qos or "")
        if self.policy.preempt_mode == "off" or not targets:
            return False
        soon = self.now + self.policy.preempt_grace
        if self.capacity.earliest(shape, members)[0] <= soon:
            return False  # room is coming soon enough: jobs already stopping, or ending
        found = self.capacity.victims_for(shape, members, targets)
        if found is None:
            return False
        for victim in found[1]:
            self.capacity.release_early(victim, soon)
            if self.pools is not None:
                self.pools.started((self.capacity.index[name], "") for name in
                                   victim.nodes or (victim.node,) if name in self.capacity.index)
            self.preemptions.append(Preemption(victim.job_id, job.job_id,
                                               self.policy.preempt_mode))
        return True

    def consider(self, job: PendingJob) -> None:
        """Start ``job`` (or as many tasks of an array as may start), or say why it waits.

        A job that waits for one of ``waits`` holds back nobody behind it.
        """
        if job.job_id == self.watch:
            self._record(job)
        self.last_examined = job.job_id
        self.considered += 1
        if self.backfilling(job):
            self.backfill_examined += 1
            # Most jobs of a long queue: one that only backfill could start, to which no
            # rule of ``waits`` applies, that names no nodes, is neither exclusive nor an
            # array, and needs at least what could not start in this pass (``refused``)
            # waits behind the blocked job, as ``_try_start`` would decide with no other
            # work than its estimate (when ``quick``: no pools or preemption). A job asking
            # for GPU memory alone may still find a slice or a share: not this path.
            if (self.quick and job.array_tasks is None and not job.exclusive and not job.share
                    and not job.gpu_mem_mb and not job.nodelist and not job.exclude
                    and len(self.starts) < self.max_starts and self._plain(job)
                    and not (self.whole_held and not (job.gpus or job.cpus or job.mem_mb))):
                at = self._behind(job)
                if at is not None:
                    self.pending.append(Pending(job.job_id, _PRIORITY, at if at < INF else None))
                    return
        reason = None if self._plain(job) else next(self.waits(job), None)
        if reason is None and job.array_tasks is None:
            reason = self._try_start(job, None)
        elif reason is None and job.array_tasks is not None:
            left = task_count(job.array_tasks)
            for task in iter_tasks(job.array_tasks):
                reason = (task_reason(job, task, self.snapshot, self.now)
                          or self._try_start(job, task))
                if reason is not None:
                    break
                left -= 1
                reason = next(self.waits(job), None)
                if reason is not None or not left:
                    break
            if not left:
                return
        if reason is not None:
            at = self.expected.get(job.job_id, INF)
            self.pending.append(Pending(job.job_id, reason, at if at < INF else None))

    def _behind(self, job: PendingJob) -> float | None:
        """For a job ``consider`` may decide quickly: None if it is not ``refused``, else
        when it should start (INF: unknown), also kept in ``expected``. With estimates,
        jobs of one size share the answer, remembered while no start, reservation or
        preemption has changed the capacity since (``refused`` stays true until
        ``advance``)."""
        capacity = self.capacity
        if not self.estimating:  # nothing to share but ``refused``, which is cheap
            return self.expected.get(job.job_id, INF) \
                if capacity.refused(job, job.partition) else None
        key = (job.partition, job.gpu_kinds, job.nodes, job.gpus, job.cpus, job.mem_mb,
               job.time_limit, job.uid if capacity.restricted else 0)
        stamp = capacity.state()
        known = self._refused.get(key)
        if known is None:
            if not capacity.refused(job, job.partition):
                return None
        elif known[1] == stamp:
            self.expected[job.job_id] = known[0]
            return known[0]
        at = capacity.estimate(Shape.of(job), self.members.get(job.partition, frozenset()),
                               job.partition)
        self._refused[key] = (at, stamp)
        self.expected[job.job_id] = at
        return at

    def _exhausted(self, job: PendingJob) -> bool:
        """Whether the pass must stop before ``job``: its time (asked every 32 jobs) or
        its count of jobs examined for backfill alone is spent. A share of the time
        (``reserve_share``) goes to reservations; after that the pass only backfills, so
        the tail is still reached."""
        if self.out_of_time:
            return True
        if self.spent is not None and self.considered % 32 == 0 and self.considered \
                and self.considered != self.budget_asked:
            self.budget_asked = self.considered
            used = self.spent()
            self.reserving = self.reserving and used < self.reserve_share
            self.out_of_time = used >= 1.0
            if self.out_of_time:
                return True
        limit = self.policy.backfill_max_jobs
        return limit is not None and self.backfilling(job) and self.backfill_examined >= limit

    def run(self, order: Sequence[PendingJob], resume_after: int | None = None,
            spent: Callable[[], float] | None = None) -> Plan:
        """Consider the jobs of ``order`` in turn; the decisions made.

        ``spent()`` tells what part of its time budget the pass has used (the core reads
        no clock). From ``reserve_share`` of it on (half under EASY, 0.8 under
        conservative backfill), no more reservations are made; the pass stops
        early when all of it is used, or when it has
        examined ``policy.backfill_max_jobs`` jobs for backfill alone; the jobs not
        examined keep their reasons and expected starts, and the plan says where it
        stopped. Given that job as ``resume_after``, the next pass examines for backfill
        first the jobs after it, then the ones before: every job gets its turn.
        """
        self.spent = spent
        after = next((i for i, job in enumerate(order) if job.job_id == resume_after), -1) \
            if resume_after is not None else -1
        deferred: list[PendingJob] = []
        stopped = False
        # Without a time budget or a count of jobs, nothing stops the pass early.
        bounded = spent is not None or self.policy.backfill_max_jobs is not None \
            or self.out_of_time
        for position, job in enumerate(order):
            if position <= after and self.backfilling(job):
                deferred.append(job)
                continue
            if bounded and self._exhausted(job):
                stopped = True
                deferred.extend(order[position:])
                break
            self.consider(job)
        resume = self.last_examined if stopped else None
        for job in deferred:
            if self._exhausted(job):
                resume = self.last_examined if resume is None else resume
                self._keep_reason(job)
                continue
            self.consider(job)
        if self.pools is not None:
            self.pools.name(self.reservations)
        return Plan(starts=tuple(self.starts), pending=tuple(self.pending),
                    reservations=tuple(self.reservations),
                    preemptions=tuple(self.preemptions), resume_after=resume)

    @property
    def extendable(self) -> bool:
        """Whether ``arrive`` may add jobs to this pass: no job started after a
        reservation was made, and no reservation starts at once."""
        return not self.reshaped and not self.out_of_time and self.spent is None

    def arrive(self, now: float, jobs: Sequence[PendingJob]) -> Plan:
        """Consider ``jobs`` that arrived since this pass ran; only the new decisions.

        They are what a fresh pass at ``now`` would decide, provided that the pass is
        ``extendable``, that the new jobs come after every job this pass examined in
        queue order (first come, first served), and that no running job has ended or
        passed its time limit since. A fresh pass would then make the same decisions for
        the jobs examined here: their resources and reservations are the same, and the
        moments resources come back have not changed (its own starts count as running
        jobs; none of them started after a reservation, which a fresh pass would have
        had to work around). So it reaches the new jobs with exactly the state this pass
        left. The simulator relies on this to let arrivals cost only their own jobs.
        """
        if not self.extendable:
            raise ValueError("this pass cannot be extended: start a fresh one")
        self.now = now
        self.capacity.advance(now)
        self._refused.clear()
        starts, pending, reservations = (len(self.starts), len(self.pending),
                                         len(self.reservations))
        for job in jobs:
            self.consider(job)
        if self.pools is not None:
            self.pools.name(self.reservations)
        return Plan(starts=tuple(self.starts[starts:]), pending=tuple(self.pending[pending:]),
                    reservations=tuple(self.reservations[reservations:]))

    def close(self) -> None:
        """Done with this pass: break the reference cycles it holds (hooks that point
        back at it, start orders whose recompute closes over its capacity), so that
        reference counting frees it and its copies of nodes at once rather than the
        cyclic collector later. Nothing may be asked of it afterwards."""
        vars(self.capacity).clear()
        vars(self).clear()

    def _keep_reason(self, job: PendingJob) -> None:
        self.pending.append(Pending(job.job_id, job.reason if job.reason is not Reason.NONE
                                    else Reason.PRIORITY, job.expected_start))


def plan(snapshot: Snapshot, now: float, policy: Policy, resume_after: int | None = None,
         spent: Callable[[], float] | None = None) -> Plan:
    """Decide which pending jobs start now, where, and why the others wait.

    Jobs are taken in priority order (``queue_order``) and placed best fit; see
    ``SchedulingPass`` for backfill, reservations and who waits and why.
    """
    if snapshot.advance_reservations:  # jobs in one run in a pass of their own
        from gpusched.core.resvpass import plan_with_reservations
        return plan_with_reservations(snapshot, now, policy, resume_after, spent)[0]
    scheduling = SchedulingPass(snapshot, now, policy)
    try:
        return scheduling.run(queue_order(snapshot, now, policy), resume_after, spent)
    finally:
        scheduling.close()
