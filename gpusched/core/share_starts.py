"""A pass's starts of jobs that ask for a share of one GPU (see core/sharing.py for the
model): the candidates on the nodes a job may use, the packing choice among them, and
the changes a start makes to the pass's resources."""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

from gpusched.core.fragmentation import WHOLE, GpuNode, Task, Workload, score
from gpusched.core.model import (
    GpuView,
    PendingJob,
    Reason,
    Reservation,
    Snapshot,
    Start,
    StartKind,
)
from gpusched.core.sharing import ShareBook, SharedGpu, cluster_shares, share_memory
from gpusched.core.units import INF, Shape

if TYPE_CHECKING:
    from collections import Counter

    from gpusched.core.capacity import Capacity
    from gpusched.core.model import Policy
    from gpusched.core.pools import UnitPools
    from gpusched.core.sharing import ClusterShares


class ShareChoice(NamedTuple):
    """Where a share starts: on node ``node`` (its index), on the partly used GPU
    ``shared``, or (None) on a free whole GPU of ``kind`` there."""

    score: tuple[float, ...]
    node: int
    kind: str
    shared: SharedGpu | None
    units: int


def _cpu_mem(job: PendingJob, duration: float) -> Shape:
    return Shape((), 0, job.cpus, job.mem_mb, 1, duration, job.uid)


def share_choices(capacity: Capacity, book: ShareBook, job: PendingJob,
                  members: frozenset[int], multi_user: bool,
                  packing: FgdPacking | None = None) -> list[ShareChoice]:
    """Where ``job``'s share could start now without delaying a reservation, best fit
    first: least room left on the GPU (a partly used GPU before a free one, so whole GPUs
    stay whole), then the node with fewest free GPUs, then the node's order. The best
    partly used GPU alone when there is one; else, of the free GPUs, the best node's for
    each GPU kind (found by walking the nodes by free units of that kind, fewest first).

    With ``packing`` (packing "fgd"), the places are ranked by FGD instead (the growth
    of the node's fragmentation for that workload, core/fragmentation.py; best fit breaks
    ties): every partly used GPU with room, and on free GPUs the first usable node of
    each count of free units of each kind (nodes with as many free are alike but for
    their shared GPUs, which the first list covers)."""
    if packing is not None:
        return _fgd_choices(capacity, book, job, members, multi_user, packing)
    # Partly used GPUs, least room first: the first room with a GPU that takes the share
    # holds the best fit (of that room's GPUs, the node with fewest free GPUs).
    for room in _partly_used(capacity, book, job, members, multi_user):
        if room:
            return [min(room, key=lambda choice: choice.score)]  # a free GPU leaves more
    found = [choice for kind in capacity.kinds if kind not in capacity.slice_kinds
             for choice in _free(capacity, book, job, members, kind, every_count=False)]
    found.sort(key=lambda choice: choice.score)
    return found


def _partly_used(capacity: Capacity, book: ShareBook, job: PendingJob,
                 members: frozenset[int], multi_user: bool) -> Iterator[list[ShareChoice]]:
    """The partly used GPUs that take ``job``'s share now, room by room (least first):
    for each room, those of its GPUs on nodes that take the share and whose longer hold
    (if the share ends after the GPU's carrier) delays no reservation."""
    end = capacity.now + (INF if job.time_limit is None else float(job.time_limit))
    usable = _usable_for(capacity, book, job, members)
    rooms = book.rooms(job.user if job.share_mode == "mps" and not multi_user else None)
    for room in sorted(r for r in rooms if r >= (job.share or 1)):
        found = []
        for shared in rooms[room].values():
            index = capacity.index.get(shared.node)
            units = book.room_for(shared, job, multi_user) if index is not None else 0
            where = capacity.kind_of.get(shared.uuid) if units else None
            if where is None or index is None or not usable(index):
                continue
            node = capacity.nodes[index]
            if end > shared.end and index in capacity.reserved_nodes and not node.fits(
                    where[1], Shape((where[1],), 1, 0, 0, 1, end - shared.end, job.uid),
                    shared.end):
                continue  # holding the GPU longer would delay a reservation
            left = (shared.room - units) / shared.gpu.shares
            found.append(ShareChoice((left, node.free_gpus(), index, shared.gpu.index),
                                     index, where[1], shared, units))
        yield found


def _free(capacity: Capacity, book: ShareBook, job: PendingJob, members: frozenset[int],
          kind: str, every_count: bool) -> Iterator[ShareChoice]:
    """Free GPUs of ``kind`` that take ``job``'s share now, walking the nodes by their
    free units of that kind, fewest first: the first node that takes it, or with
    ``every_count`` the first of each count."""
    duration = INF if job.time_limit is None else float(job.time_limit)
    whole = Shape((kind,), 1, job.cpus, job.mem_mb, 1, duration, job.uid)
    usable = _usable_for(capacity, book, job, members)
    buckets = capacity.buckets[kind]
    for count in range(1, len(buckets)):
        for index in buckets[count]:
            node = capacity.nodes[index]
            gpu = node.free[kind][0]
            units = book.fits_whole(gpu, job)
            if units and usable(index) and capacity._fits_now(node, kind, whole):
                left = (gpu.shares - units) / gpu.shares
                yield ShareChoice((left, node.free_gpus(), index, gpu.index), index, kind,
                                  None, units)
                if not every_count:
                    return
                break


def _fgd_choices(capacity: Capacity, book: ShareBook, job: PendingJob,
                 members: frozenset[int], multi_user: bool,
                 packing: FgdPacking) -> list[ShareChoice]:
    """share_choices ranked by FGD (see there)."""
    found = [choice for room in _partly_used(capacity, book, job, members, multi_user)
             for choice in room]
    found += [choice for kind in capacity.kinds if kind not in capacity.slice_kinds
              for choice in _free(capacity, book, job, members, kind, every_count=True)]
    ranked = []
    for choice in found:
        gpu = choice.shared.gpu if choice.shared is not None \
            else capacity.nodes[choice.node].free[choice.kind][0]
        grows = packing.growth(capacity, book, choice.node, gpu, choice.units)
        ranked.append(choice._replace(score=(*grows, *choice.score)))
    ranked.sort(key=lambda choice: choice.score)
    return ranked


# CPUs and memory a node that does not count them is taken to have, for packing.
_UNCOUNTED = 10**9


class FgdPacking:
    """FGD for one pass: the queue's typical tasks, and what was worked out for them --
    each node's view (until the node changes) and the growth of fragmentation of each
    state (states alike whatever the node)."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._views: dict[int, tuple[int, tuple[tuple[int, ...], dict[str, int], int, int]]] = {}
        self._growth: dict[tuple[object, ...], tuple[int, ...]] = {}

    def growth(self, capacity: Capacity, book: ShareBook, index: int, gpu: GpuView,
               units: int) -> tuple[int, ...]:
        """How much a share of ``units`` of ``gpu`` on node ``index`` grows the node's
        fragmentation for the workload: its FGD score (core/fragmentation.score)."""
        version = capacity._version.get(index, 0)
        seen = self._views.get(index)
        if seen is None or seen[0] != version:
            seen = self._views[index] = (version, _packing_view(capacity, book, index))
        milli, place, cpus, mem = seen[1]
        task = Task(0, 0, 1, min(WHOLE, max(1, units * WHOLE // max(1, gpu.shares))))
        state = tuple(sorted(milli))
        chosen = milli[place[gpu.uuid]]
        key = (state, chosen, cpus, mem, task)
        found = self._growth.get(key)
        if found is None:
            found = self._growth[key] = score(GpuNode(cpus, mem, state), task,
                                              (state.index(chosen),), "fgd", self.workload)
        return found


def _packing_view(capacity: Capacity, book: ShareBook, index: int
                  ) -> tuple[tuple[int, ...], dict[str, int], int, int]:
    """Node ``index`` as core/fragmentation.py sees it: the free thousandths of each of
    its whole GPUs, the place of each GPU in that list, its free CPU thousandths and
    memory."""
    node = capacity.nodes[index]
    free = {gpu.uuid for units in node.free.values() for gpu in units}
    milli: list[int] = []
    place: dict[str, int] = {}
    for gpu in node.view.gpus:
        if gpu.mig_mode or gpu.mig_profile is not None:
            continue
        place[gpu.uuid] = len(milli)
        shared = book.gpus.get(gpu.uuid)
        if shared is not None:
            milli.append(shared.room * WHOLE // max(1, gpu.shares))
        else:
            milli.append(WHOLE if gpu.uuid in free else 0)
    cpus = node.cpus if node.cpus < INF else _UNCOUNTED
    mem = node.mem if node.mem < INF else _UNCOUNTED
    return tuple(milli), place, int(cpus * 1000), int(mem)


def pending_workload(pending: Iterable[PendingJob], shares: int) -> Workload:
    """The typical tasks of a queue, for FGD: each share as thousandths of a GPU of
    ``shares`` units, each whole-GPU job as its GPUs on one node (CPUs and memory are
    left out: a pass checks them itself)."""
    tasks = []
    for job in pending:
        if job.share:
            tasks.append(Task(0, 0, 1, min(WHOLE, max(1, job.share * WHOLE // max(1, shares)))))
        elif job.gpus:
            tasks.append(Task(0, 0, job.gpus, WHOLE))
    return Workload.of(tasks)


def _usable_for(capacity: Capacity, book: ShareBook, job: PendingJob,
                members: frozenset[int]) -> Callable[[int], bool]:
    """Whether a node may take ``job``'s share: one of its nodes, sharing its way, not
    held whole, and with its CPUs and memory free for its whole time."""
    duration = INF if job.time_limit is None else float(job.time_limit)
    cpu_mem = _cpu_mem(job, duration)
    names, mode = book.sharing_nodes, job.share_mode

    def usable(index: int) -> bool:
        node = capacity.nodes[index]
        return (index in members and names.get(node.view.name) == mode
                and index not in capacity.whole and capacity._usable(node, cpu_mem)
                and capacity._fits_now(node, "", cpu_mem))

    return usable


def start_share(capacity: Capacity, book: ShareBook, job: PendingJob,
                choice: ShareChoice, task: int | None, kind: StartKind) -> Start:
    """Start ``job``'s share where ``choice`` says: take its CPUs and memory, and the
    free GPU (which gets a carrier) or a longer hold of the partly used one."""
    duration = INF if job.time_limit is None else float(job.time_limit)
    end = capacity.now + duration
    index, units = choice.node, choice.units
    shared = choice.shared
    if shared is None:
        gpu = capacity.take(index, choice.kind, Shape((choice.kind,), 1, 0, 0, 1, duration,
                                                      job.uid))[0]
        held = book.hold(gpu.uuid, job.job_id, job.user, units,
                         share_memory(gpu, units, job.gpu_mem_mb), end)
        assert held is not None  # a GPU of the snapshot's nodes
        shared = held
        if end < INF:  # the carrier's release is the one take() made for the GPU
            _move_release(capacity, index, choice.kind, (end, -1), (end, shared.carrier))
    else:
        before = shared.end
        mem = share_memory(shared.gpu, units, job.gpu_mem_mb)
        book.hold(shared.uuid, job.job_id, job.user, units, mem, end)
        if end > before:
            _move_release(capacity, index, choice.kind, (before, shared.carrier),
                          None if end == INF else (end, shared.carrier))
    capacity.take(index, "", _cpu_mem(job, duration))  # its CPUs and memory; started here
    mem = share_memory(shared.gpu, units, job.gpu_mem_mb)
    return Start(job.job_id, capacity.nodes[index].view.name, (shared.uuid,), task, kind,
                 shares=((shared.uuid, units, mem),))


def _move_release(capacity: Capacity, index: int, kind: str, old: tuple[float, int],
                  new: tuple[float, int] | None) -> None:
    """Move the release of one unit of ``kind`` at ``old`` (time, job id) on node
    ``index`` to ``new`` (None: never released)."""
    node = capacity._own_units(index)
    releases = node.releases
    for position, (at, k, gpus, cpus, mem, owner) in enumerate(releases):
        if at == old[0] and k == kind and gpus == 1 and not cpus and not mem \
                and owner == old[1]:
            del releases[position]
            break
    if new is not None:
        insort(releases, (new[0], kind, 1, 0.0, 0.0, new[1]))
    capacity._touched(index)


def reserve_share(capacity: Capacity, book: ShareBook, job: PendingJob,
                  members: frozenset[int]) -> tuple[float, Reservation | None]:
    """A reservation for a blocked share job: a free whole GPU of a node sharing its way,
    held from the earliest time one is (a whole GPU holds any share)."""
    duration = INF if job.time_limit is None else float(job.time_limit)
    sharing = frozenset(i for i in members
                        if book.sharing_nodes.get(capacity.nodes[i].view.name) == job.share_mode)
    shape = Shape(job.gpu_kinds, 1, job.cpus, job.mem_mb, 1, duration, job.uid)
    at, where = capacity.where_to_reserve(shape, sharing)
    if at >= INF:
        return at, None
    capacity.reserve(at, where, shape, job.job_id)
    return at, Reservation(job.job_id, at, tuple(capacity.nodes[i].view.name for i, _ in where))


class ShareStartsMixin:
    """The part of a scheduling pass (core/plan.py) that starts jobs asking for a share of
    one GPU, or only for GPU memory."""

    book: ShareBook | None
    capacity: Capacity
    shared: ClusterShares
    policy: Policy
    pools: UnitPools | None
    blocked: dict[str, PendingJob]
    reserving: bool
    reserved_in: Counter[str]
    depth: float
    reshaped: bool
    reservations: list[Reservation]
    expected: dict[int, float]
    now: float
    # Shares that could not start in this pass, by (nodes, mode, user when it matters),
    # as (units, GPU memory, CPUs, memory, duration); and the present they were seen at.
    _share_failed: dict[tuple[object, ...], list[tuple[float, ...]]]
    _share_seen: tuple[float, int] | None
    _packing: FgdPacking | None  # with packing "fgd"

    def _init_shares(self) -> None:
        """The pass's share state, none yet (its __init__ calls this)."""
        self._share_failed, self._share_seen, self._packing = {}, None, None
    snapshot: Snapshot

    def _started(self, job: PendingJob, start: Start) -> None:
        raise NotImplementedError

    def _start_kind(self, job: PendingJob) -> StartKind:
        raise NotImplementedError

    def _start_placed(self, job: PendingJob, task: int | None,
                      placed: list[tuple[int, str]], shape: Shape) -> None:
        raise NotImplementedError

    def _share_choices(self, job: PendingJob, members: frozenset[int]) -> list[ShareChoice]:
        """share_choices, unless a share needing no more of anything failed before in
        this pass on these nodes (resources only shrink within a pass; a preemption or a
        later present forgets the failures)."""
        book = self.book
        if book is None:
            return []
        capacity = self.capacity
        if self._share_seen != (capacity.now, capacity._gave_back):
            self._share_seen = (capacity.now, capacity._gave_back)
            self._share_failed = {}
        key = (members, job.share_mode, job.user if job.share_mode == "mps"
               and not self.policy.mps_multi_user else None)
        need = (job.share, job.gpu_mem_mb, job.cpus, job.mem_mb,
                INF if job.time_limit is None else float(job.time_limit))
        failed = self._share_failed.get(key)
        if failed is not None and any(all(n >= f for n, f in zip(need, before))
                                      for before in failed):
            return []
        if self.policy.packing == "fgd" and self._packing is None:
            self._packing = FgdPacking(pending_workload(
                self.snapshot.pending, cluster_shares(self.snapshot.nodes).units))
        choices = share_choices(capacity, book, job, members, self.policy.mps_multi_user,
                                self._packing)
        if not choices:
            self._share_failed.setdefault(key, []).append(need)
        return choices

    def _share_moment(self, job: PendingJob, members: frozenset[int]
                      ) -> tuple[bool, tuple[str, int] | None]:
        """For an explanation: whether ``job``'s share has a place now, and the shared GPU
        of its mode (and, for MPS, its user's) with most room on its nodes."""
        book = self.book
        if book is None:
            return False, None
        fits = bool(share_choices(self.capacity, book, job, members, self.policy.mps_multi_user))
        index = self.capacity.index
        rooms = book.rooms(job.user if job.share_mode == "mps"
                           and not self.policy.mps_multi_user else None)
        for room in sorted(rooms, reverse=True):
            for shared in rooms[room].values():
                if shared.gpu.sharing == job.share_mode and index.get(shared.node) in members:
                    return fits, (shared.node, room)
        return fits, None

    def _try_share(self, job: PendingJob, task: int | None,
                   members: frozenset[int]) -> Reason | None:
        """``_try_start`` for a job asking for a share of one GPU (core/share_starts.py):
        best placement now, else a reservation (first jobs that must wait) or an estimate."""
        book = self.book
        choices = self._share_choices(job, members)
        if not choices or book is None:
            first = job.partition not in self.blocked
            self.blocked.setdefault(job.partition, job)
            if book is not None and self.reserving \
                    and self.reserved_in[job.partition] < self.depth:
                self.reserved_in[job.partition] += 1
                at, reservation = reserve_share(self.capacity, book, job, members)
                if reservation is not None:
                    self.reshaped = self.reshaped or at <= self.now
                    self.reservations.append(reservation)
                self.expected[job.job_id] = at
            return Reason.RESOURCES if first else Reason.PRIORITY
        if self.pools is not None:
            self.pools.started([(choices[0].node, "")])
        self._started(job, start_share(self.capacity, book, job, choices[0], task,
                                       self._start_kind(job)))
        return None

    def _memory_now(self, job: PendingJob, task: int | None, members: frozenset[int],
                    group: object) -> bool:
        """Start a job that asks only for GPU memory on a MIG slice with that much, else
        on a share of a GPU shared by MPS, if either is free now."""
        for profile in self.shared.memory.slices(job.gpu_mem_mb):  # the smallest that holds it
            shape = Shape.of(replace(job, gpu_kinds=(profile,)))
            placed = self.capacity.place_now(shape, members, (group, profile))
            if placed is not None:
                self._start_placed(job, task, placed, shape)
                return True
        if self.book is not None:
            shared = replace(job, share_mode="mps")
            choices = self._share_choices(shared, members)
            if choices:
                self._started(job, start_share(self.capacity, self.book, shared, choices[0],
                                               task, self._start_kind(job)))
                return True
        return False
