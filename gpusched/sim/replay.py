"""Replay a trace through the scheduler's own pass, with a virtual clock.

The loop keeps the pending and running jobs a controller would keep in its database,
and at every moment something happens (jobs arrive, jobs end) it builds a ``Snapshot``
and calls ``gpusched.core.plan`` exactly as the controller's scheduler does: every
decision comes from the core. A started job ends after its real run time, or at its
time limit when it runs past it (TIMEOUT; ``kill=False`` lets it run on).
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpusched.core.capacity import Capacity
from gpusched.core.fairshare import ROOT, Account, UserShare, accrue, decay
from gpusched.core.model import (
    PACKINGS,
    PendingJob,
    Policy,
    RunningJob,
    Snapshot,
    StartKind,
)
from gpusched.core.occupancy import Occupancy
from gpusched.core.plan import SchedulingPass, queue_order
from gpusched.core.priority import PriorityWeights
from gpusched.core.sharing import ShareBook, SharedGpu
from gpusched.core.units import INF, Shape, any_could_start_counted
from gpusched.core.usage import gpu_fraction
from gpusched.errors import UsageError
from gpusched.sim.cluster import SimCluster
from gpusched.sim.traces import TraceJob

ORDERS = ("fcfs", "multifactor")
BACKFILLS = ("none", "easy", "conservative")
# Multifactor as a controller runs it by default (gpusched.config.SchedulerConfig).
MULTIFACTOR = PriorityWeights(job_size=0.0)
FCFS = PriorityWeights(age=0.0, fairshare=0.0, job_size=0.0, partition=0.0, qos=0.0)


@dataclass(frozen=True)
class SimPolicy:
    """What one simulation runs: the queue order, the backfill mode, and how deep it
    reserves (None: the mode's own)."""

    order: str = "fcfs"
    backfill: str = "easy"
    reservations: int | None = None
    kill: bool = True  # a job running past its time limit is ended there (TIMEOUT)
    half_life: float = 7 * 86400.0  # fair-share usage decay, for multifactor
    packing: str = "bestfit"  # where a share of a GPU starts (core/sharing.py)

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise UsageError(f"unknown policy {self.order!r}; expected one of {', '.join(ORDERS)}")
        if self.backfill not in BACKFILLS:
            raise UsageError(f"unknown backfill {self.backfill!r}; expected one of "
                             f"{', '.join(BACKFILLS)}")
        if self.packing not in PACKINGS:
            raise UsageError(f"unknown packing {self.packing!r}; expected one of "
                             f"{', '.join(PACKINGS)}")

    @property
    def name(self) -> str:
        """A label such as ``fcfs/easy``."""
        depth = "" if self.reservations is None else f"/{self.reservations}"
        return f"{self.order}/{self.backfill}{depth}"

    def core(self) -> Policy:
        """The core policy a pass runs with."""
        return Policy(weights=FCFS if self.order == "fcfs" else MULTIFACTOR,
                      backfill=self.backfill, reservations=self.reservations,
                      backfill_max_jobs=None, preempt_mode="off",
                      estimates=False, max_starts_per_pass=2**62, packing=self.packing)

    @classmethod
    def parse(cls, text: str, base: SimPolicy) -> SimPolicy:
        """A policy from ``ORDER``, ``BACKFILL`` or ``ORDER/BACKFILL[/DEPTH]``; what is
        not named comes from ``base``."""
        order, backfill, depth = base.order, base.backfill, base.reservations
        parts = [p.strip() for p in text.strip().split("/")]
        if not parts or not all(parts) or len(parts) > 3:
            raise UsageError(f"invalid policy {text!r}: expected ORDER, BACKFILL or "
                             "ORDER/BACKFILL[/RESERVATIONS], e.g. fcfs/easy")
        if len(parts) == 1:
            if parts[0] in ORDERS:
                order = parts[0]
            elif parts[0] in BACKFILLS:
                backfill = parts[0]
            else:
                raise UsageError(f"invalid policy {text!r}: {parts[0]!r} is neither an order "
                                 f"({', '.join(ORDERS)}) nor a backfill ({', '.join(BACKFILLS)})")
        else:
            order, backfill = parts[0], parts[1]
            if len(parts) == 3:
                if not parts[2].isdigit():
                    raise UsageError(f"invalid policy {text!r}: reservations {parts[2]!r} is "
                                     "not a number")
                depth = int(parts[2])
        return cls(order, backfill, depth, base.kill, base.half_life, base.packing)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What happened to one job."""

    job_id: int
    submit: float
    start: float
    end: float
    gpus: float  # GPUs it held (all nodes); a share of one GPU as its fraction
    state: str  # COMPLETED or TIMEOUT
    nodes: tuple[str, ...]
    gpu_uuids: tuple[str, ...]
    backfilled: bool

    @property
    def wait(self) -> float:
        """Seconds from submit to start."""
        return self.start - self.submit

    @property
    def run(self) -> float:
        """Seconds it ran."""
        return self.end - self.start


@dataclass
class SimResult:
    """The outcome of one simulation."""

    policy: SimPolicy
    cluster_gpus: int
    records: list[JobRecord]
    never: list[int]  # jobs no node set of the cluster can ever hold
    passes: int
    wall_s: float
    # (time, GPUs busy, jobs pending) after each moment's pass
    timeline: list[tuple[float, float, int]] = field(default_factory=list)


# How the replay shares a cluster's GPUs when a trace asks for fractions of them:
# thousandths of a GPU, with no rule on whose jobs share one.
TRACE_SHARING = ("shard", 1000)


def job_shape(job: TraceJob, gpus_per_node: int, partition: str) -> PendingJob:
    """The pending job a trace job becomes: P GPUs over ceil(P / G) nodes, the same
    number on each (rounded up), and its CPUs and memory shared out the same way; a
    fraction of a GPU, a share of one (TRACE_SHARING)."""
    if job.gpu_milli:
        return PendingJob(
            job_id=job.job_id, partition=partition, gpus=1, uid=0, submit_time=job.submit,
            time_limit=job.time_limit, user=job.user, account=job.group,
            name=f"j{job.job_id}", cpus=job.cpus, mem_mb=job.mem_mb,
            share=job.gpu_milli, share_mode=TRACE_SHARING[0])
    nodes = max(1, math.ceil(job.gpus / gpus_per_node))
    return PendingJob(
        job_id=job.job_id, partition=partition, gpus=math.ceil(job.gpus / nodes), uid=0,
        submit_time=job.submit, time_limit=job.time_limit, user=job.user,
        account=job.group, name=f"j{job.job_id}", nodes=nodes,
        cpus=math.ceil(job.cpus / nodes), mem_mb=math.ceil(job.mem_mb / nodes))


class FitsEver:
    """Whether the empty cluster could ever hold a job, by the core's own reckoning.

    Nodes alike (the same units, CPUs, memory and user) answer alike, so one empty node
    of each sort is asked whether a job's shape fits it, and the job fits ever when its
    partition has enough nodes of the sorts that say yes: a question costs the sorts of
    node, not the nodes (a trace's own cluster has thousands of nodes and few sorts).
    """

    def __init__(self, cluster: SimCluster) -> None:
        self.capacity = Capacity(cluster.nodes, (), 0.0)
        self.partitions = {part.name: part for part in cluster.partitions}
        # partition -> (a node of each sort, how many of that sort it has)
        self.sorts: dict[str, list[tuple[int, int]]] = {}
        for part in cluster.partitions:
            alike: dict[tuple[object, ...], list[int]] = {}
            for name in part.nodes:
                index = self.capacity.index.get(name)
                if index is not None:
                    node = self.capacity.nodes[index]
                    sort = (tuple(sorted(node.total.items())), tuple(sorted(node.slices)),
                            node.cpus, node.mem, node.view.run_uid)
                    alike.setdefault(sort, []).append(index)
            self.sorts[part.name] = [(nodes[0], len(nodes)) for nodes in alike.values()]
        self.known: dict[tuple[object, ...], bool] = {}

    def __call__(self, pending: PendingJob) -> bool:
        """Whether ``pending`` could start on the empty cluster."""
        part = self.partitions[pending.partition]
        if not part.up or (part.max_time is not None
                           and (pending.time_limit or INF) > part.max_time):
            return False
        # On empty nodes a shape fits for any time or never: its limit does not matter.
        key = (pending.partition, pending.gpu_kinds, pending.gpus, pending.nodes,
               pending.cpus, pending.mem_mb, pending.uid)
        known = self.known.get(key)
        if known is None:
            known = self.known[key] = self._nodes_hold(pending)
        return known

    def _nodes_hold(self, pending: PendingJob) -> bool:
        capacity, shape = self.capacity, Shape.of(pending)
        kinds = capacity.matching(shape.kinds) if shape.gpus else [""]
        holding = 0
        for index, count in self.sorts[pending.partition]:
            node = capacity.nodes[index]
            if capacity._usable(node, shape) and any(
                    (not kind or node.total.get(kind, 0) >= shape.gpus)
                    and node.earliest(kind, shape, 0.0) < INF for kind in kinds):
                holding += count
        return holding >= shape.nodes


class Replay:
    """One simulation in progress: the virtual clock, the queue and the running jobs."""

    def __init__(self, cluster: SimCluster, policy: SimPolicy, shortcuts: bool = True) -> None:
        self.cluster, self.policy, self.shortcuts = cluster, policy, shortcuts
        self.core = policy.core()
        self.pending: dict[int, PendingJob] = {}
        self.running: dict[int, RunningJob] = {}
        self.trace_jobs: dict[int, TraceJob] = {}
        self.ends: list[tuple[float, int]] = []  # heap of (end time, job id)
        self.records: list[JobRecord] = []
        self.busy = 0.0  # GPUs held, shares as fractions
        self.passes = 0
        self.timeline: list[tuple[float, float, int]] = []
        # Fair-share (multifactor): decayed usage per (user, account) and when it was.
        self.usage: dict[tuple[str, str], tuple[float, float]] = {}
        self.accounts: dict[str, Account] = {}
        self.users: dict[tuple[str, str], UserShare] = {}
        # The last pass, while arrivals alone may extend it (SchedulingPass.arrive):
        # first come, first served, nothing ended since, no job past its limit.
        self.last: SchedulingPass | None = None
        self.arrived: list[PendingJob] = []
        self.incremental = shortcuts and policy.order == "fcfs" and policy.kill
        # What the running jobs hold, kept between passes and told of each start and
        # end, so that a pass does not set up every node again. Not with --no-kill (a
        # job past its limit is given a new end at every pass), nor for conservative
        # backfill, whose pools change the nodes they hold in place.
        self.occupancy = (Occupancy.kept_for(cluster.nodes) if shortcuts and policy.kill
                          and policy.backfill != "conservative" else None)
        # Free GPUs per node and the (GPUs per node, nodes) of waiting jobs: a moment
        # where no waiting job could have its GPUs needs no pass, as it would start none.
        self.node_of = {gpu.uuid: node.name for node in cluster.nodes for gpu in node.gpus}
        self.free_on = {node.name: len(node.gpus) for node in cluster.nodes}
        # with_free[n]: how many nodes have n GPUs free.
        self.with_free = [0] * (cluster.max_gpus_per_node + 1)
        for free in self.free_on.values():
            self.with_free[free] += 1
        self.shapes: Counter[tuple[int, int]] = Counter()
        # Shared GPUs (core/sharing.py): each with a holder has a carrier in the kept
        # occupancy, as a pass would add from the running jobs' shares.
        self.book = ShareBook(cluster.nodes)
        self.share_pending = 0

    def submit(self, job: TraceJob, pending: PendingJob) -> None:
        """A job arrives."""
        self.trace_jobs[job.job_id] = job
        self.pending[job.job_id] = pending
        self.arrived.append(pending)
        self.shapes[(pending.gpus, pending.nodes)] += 1
        self.share_pending += bool(pending.share)
        if self.policy.order == "multifactor" and pending.account:
            self.accounts.setdefault(pending.account, Account(pending.account, ROOT))
            key = (pending.user, pending.account)
            self.users.setdefault(key, UserShare(*key))

    def end_due(self, now: float) -> None:
        """Jobs whose end is at or before ``now`` end."""
        while self.ends and self.ends[0][0] <= now:
            at, job_id = heapq.heappop(self.ends)
            run = self.running.pop(job_id)
            self._drop_last()
            if self.occupancy is not None:
                self.occupancy.remove(run)
            self.busy -= _held(run)
            self._free_units(run.gpu_uuids, 1)
            for uuid, _, _ in run.shares:
                self._reshare(uuid, lambda: self.book.release(uuid, job_id))
            if self.policy.order == "multifactor" and run.account and run.start_time is not None:
                key = (run.user, run.account)
                used, when = self.usage.get(key, (0.0, at))
                self.usage[key] = (decay(used, at - when, self.policy.half_life)
                                   + accrue(0.0, at - run.start_time, self.policy.half_life,
                                            _held(run)), at)

    def schedule(self, now: float) -> None:
        """One pass at ``now``: start what the core decides."""
        arrived, self.arrived = self.arrived, []
        if self.shortcuts and not any_could_start_counted(self.with_free, self.shapes) and not (
                self.share_pending and any(g.room for g in self.book.gpus.values())):
            self._drop_last()
            return
        if self.last is not None and self.incremental and self.last.extendable:
            decisions = self.last.arrive(now, arrived)
        else:
            self.passes += 1
            snapshot = Snapshot(
                nodes=self.cluster.nodes, partitions=self.cluster.partitions,
                pending=tuple(self.pending.values()), running=self._running(now),
                accounts=tuple(self.accounts.values()), user_shares=tuple(self.users.values()),
                usage=self._usage(now))
            scheduling = SchedulingPass(snapshot, now, self.core, occupancy=self.occupancy)
            decisions = scheduling.run(queue_order(snapshot, now, self.core))
            self._drop_last()
            self.last = scheduling
        for start in decisions.starts:
            self._start(start.job_id, now, start.node, start.nodes or (start.node,),
                        start.gpu_uuids, start.kind is StartKind.BACKFILLED, start.shares)

    def _drop_last(self) -> None:
        """Forget the last pass and free it at once (``SchedulingPass.close``): letting
        the cyclic collector find passes costs the replay more than they do."""
        last, self.last = self.last, None
        if last is not None:
            last.close()

    def _free_units(self, uuids: Sequence[str], more: int) -> None:
        """Each of these GPUs is free (``more`` 1) or taken (-1) on its node."""
        free_on, with_free, node_of = self.free_on, self.with_free, self.node_of
        for uuid in uuids:
            node = node_of[uuid]
            free = free_on[node]
            with_free[free] -= 1
            with_free[free + more] += 1
            free_on[node] = free + more

    def _running(self, now: float) -> tuple[RunningJob, ...]:
        if self.policy.kill:
            return tuple(self.running.values())
        # A job past its limit is expected to end at any moment.
        return tuple(job if job.end_time is None or job.end_time >= now
                     else RunningJob(job.job_id, job.node, job.gpu_uuids, job.user,
                                     job.account, end_time=now, nodes=job.nodes,
                                     start_time=job.start_time, shares=job.shares)
                     for job in self.running.values())

    def _usage(self, now: float) -> dict[tuple[str, str], float]:
        if self.policy.order != "multifactor":
            return {}
        half = self.policy.half_life
        usage = {key: decay(used, now - when, half) for key, (used, when) in self.usage.items()}
        for run in self.running.values():  # what running jobs have used so far
            if run.account and run.start_time is not None:
                key = (run.user, run.account)
                usage[key] = usage.get(key, 0.0) + accrue(
                    0.0, now - run.start_time, half, _held(run))
        return usage

    def _start(self, job_id: int, now: float, node: str, nodes: tuple[str, ...],
               uuids: tuple[str, ...], backfilled: bool,
               shares: tuple[tuple[str, int, int], ...] = ()) -> None:
        pending = self.pending.pop(job_id)
        job = self.trace_jobs.pop(job_id)
        limit_end = now + job.time_limit
        end = now + job.run_time
        state = "COMPLETED"
        if self.policy.kill and job.run_time > job.time_limit:
            end, state = limit_end, "TIMEOUT"
        whole = uuids if not shares else tuple(
            uuid for uuid in uuids if uuid not in {s[0] for s in shares})
        running = self.running[job_id] = RunningJob(
            job_id, node, whole, pending.user, pending.account, end_time=limit_end,
            cpus=pending.cpus, mem_mb=pending.mem_mb, nodes=nodes if len(nodes) > 1 else (),
            start_time=now, shares=shares)
        if self.occupancy is not None:
            self.occupancy.add(running)
        held = _held(running)
        self.busy += held
        self._free_units(whole, -1)
        for uuid, units, mem in shares:
            self._reshare(uuid, lambda: self.book.hold(uuid, job_id, pending.user, units, mem,
                                                       limit_end))
        self.share_pending -= bool(pending.share)
        shape = (pending.gpus, pending.nodes)
        self.shapes[shape] -= 1
        if not self.shapes[shape]:
            del self.shapes[shape]
        heapq.heappush(self.ends, (end, job_id))
        self.records.append(JobRecord(job_id, pending.submit_time, now, end, held, state,
                                      nodes, uuids, backfilled))

    def _reshare(self, uuid: str, change: Callable[[], SharedGpu | None]) -> None:
        """Change who holds a share of GPU ``uuid`` (``change`` tells the book), and
        keep its carrier in the kept occupancy, and its count as free, up to date."""
        before = self.book.gpus.get(uuid)
        old = None if before is None else self.book.carrier(before)
        after = change()
        new = None if after is None else self.book.carrier(after)
        if old == new:
            return
        if self.occupancy is not None:
            if old is not None:
                self.occupancy.remove(old)
            if new is not None:
                self.occupancy.add(new)
        if old is None or new is None:
            self._free_units((uuid,), -1 if old is None else 1)


def _held(run: RunningJob) -> float:
    """GPUs ``run`` holds: its whole ones, and its shares as fractions of theirs."""
    if not run.shares:
        return len(run.gpu_uuids)
    return len(run.gpu_uuids) + sum(gpu_fraction(units, TRACE_SHARING[1])
                                    for _, units, _ in run.shares)


def simulate(jobs: Sequence[TraceJob], cluster: SimCluster, policy: SimPolicy,
             progress: Callable[[int], None] | None = None,
             shortcuts: bool = True) -> SimResult:
    """Replay ``jobs`` (in submit order) on ``cluster`` under ``policy``.

    ``progress(n)`` is told each time ``n`` more jobs have arrived. ``shortcuts=False``
    runs a fresh pass, set up from nothing, at every moment: the same decisions, slowly
    (tests hold the shortcuts to it).

    While it runs, what was alive before (the trace, the cluster) is kept out of the
    cyclic collector's walks (``gc.freeze``) and put back after, unless the process had
    frozen objects of its own (a controller does), which then stay frozen: the replay
    makes and drops many objects, and each full collection would walk the whole trace.
    """
    thaw = not gc.get_freeze_count()
    gc.freeze()
    try:
        return _replay(jobs, cluster, policy, progress, shortcuts)
    finally:
        if thaw:
            gc.unfreeze()


def _replay(jobs: Sequence[TraceJob], cluster: SimCluster, policy: SimPolicy,
            progress: Callable[[int], None] | None, shortcuts: bool) -> SimResult:
    began = time.perf_counter()
    if any(job.gpu_milli for job in jobs):
        cluster = cluster.shared(*TRACE_SHARING)
    replay = Replay(cluster, policy, shortcuts)
    gpus_per_node = cluster.max_gpus_per_node
    never: list[int] = []
    fits_ever = FitsEver(cluster)
    arrivals = sorted(jobs, key=lambda j: (j.submit, j.job_id))
    i, total = 0, len(arrivals)
    while i < total or replay.ends:
        now = min(arrivals[i].submit if i < total else INF,
                  replay.ends[0][0] if replay.ends else INF)
        replay.end_due(now)
        arrived = 0
        while i < total and arrivals[i].submit <= now:
            job = arrivals[i]
            i += 1
            arrived += 1
            pending = job_shape(job, gpus_per_node, cluster.default_partition)
            if fits_ever(pending):
                replay.submit(job, pending)
            else:
                never.append(job.job_id)
        if progress is not None and arrived:
            progress(arrived)
        if replay.arrived or (replay.pending and replay.last is None):
            replay.schedule(now)
        replay.timeline.append((now, replay.busy, len(replay.pending)))
    if replay.pending:  # cannot happen: every job kept fits the empty cluster
        raise AssertionError(f"{len(replay.pending)} jobs never started")
    replay.records.sort(key=lambda r: r.job_id)
    return SimResult(policy, cluster.gpus, replay.records, never, replay.passes,
                     time.perf_counter() - began, replay.timeline)
