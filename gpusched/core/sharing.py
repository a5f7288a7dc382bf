"""Shares of GPUs during a pass: which GPUs are shared and by whom, and where a job
asking for a share of one GPU (``PendingJob.share``) starts.

A GPU that may be shared (``GpuView.sharing``: "mps" or "shard") offers ``shares``
units. To the rest of a pass (matching, the timeline, reservations) a GPU with any
share taken is simply held, by one stand-in running job, its *carrier*, until the last
of its holders' time limits: whole-GPU jobs cannot have it before then, and a
reservation counting on it counts on that time. Within the carrier's span the
``ShareBook`` counts what each holder takes: units, GPU memory, and for MPS whose jobs
they are (an MPS server serves one user: jobs of different users share a GPU by MPS
only where the policy allows it).

A share job starts on a GPU that already has room (a partly used GPU) or on a free
whole GPU of a node that shares the way it asks, whichever the packing policy scores
best (``Policy.packing``: "bestfit" leaves the least room on the GPU, so partly used
GPUs fill up first and whole GPUs stay whole; "fgd" keeps the fragmentation of the
node's free GPU capacity, as the pending jobs would see it, lowest). Starting on a free
GPU is starting a one-GPU job there (the usual checks keep every reservation whole);
starting on a partly used GPU past its carrier's end moves the carrier's end, allowed
only when one unit of that GPU's kind is free for the extra time, reservations taken.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from gpusched.core.model import GpuView, NodeView, PartitionView, PendingJob, RunningJob
from gpusched.core.units import INF

SHARE_MODES = ("mps", "shard")


def shared_node(node: NodeView, mode: str, shares: int, memory_mb: int = 0) -> NodeView:
    """``node`` with its whole GPUs (not MIG slices, nor GPUs split into them) shared by
    ``mode``, ``shares`` units each (and, given, ``memory_mb`` of memory each)."""
    return replace(node, gpus=tuple(
        gpu if gpu.mig_profile is not None or gpu.mig_mode
        else replace(gpu, sharing=mode, shares=shares, memory_mb=memory_mb or gpu.memory_mb)
        for gpu in node.gpus))


def share_nodes(nodes: tuple[NodeView, ...], partitions: Iterable[PartitionView]
                ) -> tuple[NodeView, ...]:
    """``nodes`` with the whole GPUs of each node in a partition that shares its GPUs
    marked so (the first such partition by name: admin apply refuses a node shared two
    ways)."""
    sharing: dict[str, tuple[str, int]] = {}
    for part in partitions:
        if part.sharing is not None and part.shares > 0:
            for name in part.nodes:
                sharing.setdefault(name, (part.sharing, part.shares))
    if not sharing:
        return nodes
    return tuple(shared_node(node, *sharing[node.name]) if node.name in sharing else node
                 for node in nodes)


def carrier_id(position: int) -> int:
    """The job id of the carrier of the GPU at ``position`` (its place among every GPU of
    the snapshot's nodes, in order): negative, below the -1 a pass gives its own starts."""
    return -2 - position


@dataclass(slots=True)
class SharedGpu:
    """One shared GPU with at least one holder."""

    uuid: str
    node: str
    gpu: GpuView
    carrier: int  # the carrier's job id
    used: int = 0  # units taken
    mem_used: int = 0  # GPU memory taken (MB)
    end: float = 0.0  # the latest holder's end (INF: one has no time limit)
    users: set[str] = field(default_factory=set)
    # job id -> (units, GPU memory MB, end, user) of each holder
    holders: dict[int, tuple[int, int, float, str]] = field(default_factory=dict)

    @property
    def room(self) -> int:
        """Units still free on it."""
        return self.gpu.shares - self.used


def units_for(gpu: GpuView, job: PendingJob) -> int:
    """The units of ``gpu`` that ``job`` takes: its share, or for a job that asks only
    for GPU memory, the part of the GPU's units its memory is (0: not known, or more
    than the GPU has)."""
    if job.share:
        return job.share
    if not gpu.memory_mb or not gpu.shares or job.gpu_mem_mb > gpu.memory_mb:
        return 0
    return max(1, -(-job.gpu_mem_mb * gpu.shares // gpu.memory_mb))


def share_memory(gpu: GpuView, units: int, asked_mb: int) -> int:
    """The GPU memory (MB) a share of ``units`` of ``gpu`` gets: what the job asked for,
    else its part of the GPU's memory (0 when that is not known)."""
    if asked_mb:
        return asked_mb
    if gpu.memory_mb and gpu.shares:
        return gpu.memory_mb * units // gpu.shares
    return 0


class ClusterShares:
    """What never changes between passes over the same nodes: where each GPU is (and
    its place among all), how each node shares its GPUs, and the memory of each kind."""

    def __init__(self, nodes: Sequence[NodeView]) -> None:
        self.where: dict[str, tuple[str, GpuView, int]] = {}
        self.sharing_nodes: dict[str, str] = {}
        self.units = 0  # the units a shared GPU offers (the first one's), 0: none shared
        position = 0
        for node in nodes:
            for gpu in node.gpus:
                self.where[gpu.uuid] = (node.name, gpu, position)
                position += 1
                if gpu.sharing in SHARE_MODES and gpu.shares > 0 and not gpu.mig_mode \
                        and gpu.mig_profile is None:
                    self.sharing_nodes.setdefault(node.name, gpu.sharing)
                    self.units = self.units or gpu.shares
        self._nodes = nodes

    @functools.cached_property
    def memory(self) -> KindMemory:
        """The memory of each kind of unit: worked out when a job asks for GPU memory."""
        return KindMemory(self._nodes)


_last_shares: tuple[Sequence[NodeView], ClusterShares] | None = None


def cluster_shares(nodes: Sequence[NodeView]) -> ClusterShares:
    """The ClusterShares of ``nodes``; the same tuple as last time gives the same one
    back (a pass costs what it looks at, not the size of the cluster)."""
    global _last_shares
    last = _last_shares
    if isinstance(nodes, tuple) and last is not None and last[0] is nodes:
        return last[1]
    built = ClusterShares(nodes)
    if isinstance(nodes, tuple):
        _last_shares = (nodes, built)
    return built


class ShareBook:
    """The shared GPUs of a cluster, and their carriers."""

    def __init__(self, nodes: Sequence[NodeView], running: Iterable[RunningJob] = ()) -> None:
        facts = cluster_shares(nodes)
        self.where = facts.where  # uuid -> (node, GPU, position)
        self.sharing_nodes = facts.sharing_nodes  # node -> its share mode
        self.gpus: dict[str, SharedGpu] = {}
        # room -> the shared GPUs with that many units free, by UUID; and the same for
        # the GPUs of each user alone (MPS serves one user unless the policy allows more)
        self.by_room: dict[int, dict[str, SharedGpu]] = {}
        self.by_owner: dict[str, dict[int, dict[str, SharedGpu]]] = {}
        for job in running:
            if job.shares:
                end = INF if job.end_time is None else job.end_time
                for uuid, units, mem in job.shares:
                    self.hold(uuid, job.job_id, job.user, units, mem, end)

    @property
    def any(self) -> bool:
        """Whether any GPU of the cluster may be shared."""
        return bool(self.sharing_nodes)

    def hold(self, uuid: str, job_id: int, user: str, units: int, mem: int,
             end: float) -> SharedGpu | None:
        """Count a holder's share of GPU ``uuid`` (None: no such GPU)."""
        found = self.where.get(uuid)
        if found is None:
            return None
        shared = self.gpus.get(uuid)
        if shared is None:
            node, gpu, position = found
            shared = self.gpus[uuid] = SharedGpu(uuid, node, gpu, carrier_id(position))
        else:
            self._unroom(shared)
        shared.used += units
        shared.mem_used += mem
        shared.end = max(shared.end, end)
        shared.users.add(user)
        shared.holders[job_id] = (units, mem, end, user)
        self._room(shared)
        return shared

    def _room(self, shared: SharedGpu) -> None:
        self.by_room.setdefault(shared.room, {})[shared.uuid] = shared
        if len(shared.users) == 1:
            owner = next(iter(shared.users))
            self.by_owner.setdefault(owner, {}).setdefault(shared.room, {})[shared.uuid] = shared

    def _unroom(self, shared: SharedGpu) -> None:
        bucket = self.by_room[shared.room]
        del bucket[shared.uuid]
        if not bucket:
            del self.by_room[shared.room]
        if len(shared.users) == 1:
            owner = next(iter(shared.users))
            rooms = self.by_owner[owner]
            bucket = rooms[shared.room]
            del bucket[shared.uuid]
            if not bucket:
                del rooms[shared.room]
                if not rooms:
                    del self.by_owner[owner]

    def rooms(self, user: str | None) -> dict[int, dict[str, SharedGpu]]:
        """The shared GPUs by room: all of them, or (``user``) those of that user alone."""
        if user is None:
            return self.by_room
        return self.by_owner.get(user, {})

    def release(self, uuid: str, job_id: int) -> SharedGpu | None:
        """Job ``job_id`` gave back its share of GPU ``uuid``: the GPU as it is left (None:
        no holder is left, and it is no longer shared)."""
        shared = self.gpus.get(uuid)
        if shared is None or job_id not in shared.holders:
            raise ValueError(f"job {job_id} holds no share of GPU {uuid}")
        units, mem, _, _ = shared.holders.pop(job_id)
        self._unroom(shared)
        if not shared.holders:
            del self.gpus[uuid]
            return None
        shared.used -= units
        shared.mem_used -= mem
        shared.end = max(end for _, _, end, _ in shared.holders.values())
        shared.users = {user for _, _, _, user in shared.holders.values()}
        self._room(shared)
        return shared

    def carrier(self, shared: SharedGpu) -> RunningJob:
        """The stand-in running job that holds ``shared`` whole until its last holder's end."""
        return RunningJob(shared.carrier, shared.node, (shared.uuid,),
                          end_time=None if shared.end == INF else shared.end)

    def carriers(self) -> list[RunningJob]:
        """A carrier for every shared GPU with a holder."""
        return [self.carrier(shared) for shared in self.gpus.values()]

    def room_for(self, shared: SharedGpu, job: PendingJob, multi_user: bool) -> int:
        """The units ``job`` takes on ``shared`` if it fits there (its mode, its units and
        memory, and for MPS its user); else 0."""
        gpu = shared.gpu
        units = units_for(gpu, job)
        if gpu.sharing != job.share_mode or not units or units > shared.room:
            return 0
        if gpu.sharing == "mps" and not multi_user and shared.users != {job.user}:
            return 0
        if gpu.memory_mb and shared.mem_used + share_memory(gpu, units, job.gpu_mem_mb) \
                > gpu.memory_mb:
            return 0
        return units

    def fits_whole(self, gpu: GpuView, job: PendingJob) -> int:
        """The units a share for ``job`` takes of a free whole ``gpu`` (0: it does not fit)."""
        units = units_for(gpu, job)
        if gpu.sharing != job.share_mode or not units or units > gpu.shares:
            return 0
        if gpu.memory_mb and share_memory(gpu, units, job.gpu_mem_mb) > gpu.memory_mb:
            return 0
        return units


def wants_share(job: PendingJob) -> bool:
    """Whether ``job`` asks for a share of one GPU."""
    return job.share > 0 and job.share_mode in SHARE_MODES


def by_memory(job: PendingJob) -> bool:
    """Whether ``job`` asks only for GPU memory: a MIG slice, an MPS share or a whole
    GPU with that much (core/share_starts.py tries them in that order)."""
    return job.gpu_mem_mb > 0 and not job.share and job.share_mode is None


# A kind of unit no request names: asking for it, a job waits (nothing has the memory).
NO_KIND = "(no GPU with that memory)"


class KindMemory:
    """The GPU memory of each kind of unit (a GPU type, a MIG profile) in a cluster: the
    least of its units' (a kind whose memory no unit reports counts as having any)."""

    def __init__(self, nodes: Sequence[NodeView]) -> None:
        self._slices: dict[str, int] = {}
        self._whole: dict[str, int] = {}
        self._asked: dict[tuple[bool, int], tuple[str, ...]] = {}
        for node in nodes:
            for gpu in node.gpus:
                if gpu.mig_mode:
                    continue
                kinds = self._slices if gpu.mig_profile is not None else self._whole
                known = kinds.get(gpu.kind)
                memory = gpu.memory_mb or 0
                kinds[gpu.kind] = memory if known is None else (
                    min(known, memory) if known and memory else known or memory)

    def _fitting(self, slices: bool, mem_mb: int) -> tuple[str, ...]:
        found = self._asked.get((slices, mem_mb))
        if found is None:
            kinds = self._slices if slices else self._whole
            # Smallest first, for best fit; unknown memory last.
            fit = sorted((memory or float("inf"), kind) for kind, memory in kinds.items()
                         if not memory or memory >= mem_mb)
            found = self._asked[(slices, mem_mb)] = tuple(kind for _, kind in fit)
        return found

    def slices(self, mem_mb: int) -> tuple[str, ...]:
        """The MIG profiles with at least ``mem_mb`` MB, smallest first."""
        return self._fitting(True, mem_mb)

    def whole(self, mem_mb: int) -> tuple[str, ...]:
        """What a job asking for ``mem_mb`` MB of GPU memory waits for when no slice or
        share is free: the GPU types with that much, and the MIG profiles too (NO_KIND
        when nothing has it)."""
        return (self._fitting(False, mem_mb) + self._fitting(True, mem_mb)) or (NO_KIND,)
