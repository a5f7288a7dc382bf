"""Dynamic MIG: the layouts MIG GPUs may take, and which one an idle GPU should take so that
waiting jobs can start. Pure: no I/O, no clock (the caller passes ``now``).

**Geometry.** A MIG GPU (A100 40/80 GB, H100 80 GB) has 8 memory slices and 7 compute
slices. A GPU instance of a profile covers ``size`` consecutive memory slices from a start
its profile allows, instances never overlap, and a profile has at most ``instances`` of
itself on one GPU (``nvidia-smi mig -lgipp`` lists the same placements). So
``3g.40gb + 2g.20gb + 1g.10gb + 1g.10gb`` fits an A100 80 GB (3g at 4, 2g at 0, 1g at 2
and 3) but ``3g.40gb + 4g.40gb + 1g.10gb`` does not. :func:`check_layout` says why a
layout does not fit; :func:`best_placement` places one, keeping as many instances where
they already are as it can.

**Decision** (:func:`plan_layouts`), for one node:

1. Every free slice (on the node's MIG GPUs, not allocated to a job) of a profile that
   jobs wait for is *claimed* for them, first on GPUs that may not change now, then on
   the others in UUID order. Demand left over is *unmet*.
2. A GPU may change only if it is *idle* (no slice allocated, no process), its model is
   known, and its layout last changed at least ``min_interval`` seconds ago. A busy GPU
   is never changed.
3. Unmet demand that has waited at least ``min_wait`` seconds is served longest-waiting
   first (then the most slices, then the profile name). For each GPU that may change, in
   UUID order: keep its claimed slices, add as many unmet slices as fit (in that order),
   then put back as many of its other current slices as still fit (largest first), so a
   layout changes no more than the demand needs. A GPU to which nothing unmet could be
   added keeps its layout.
4. The result maps the UUID of each GPU to change to its target layout, largest profile
   first. Same input, same output.

GPUs of several nodes may be planned together (UUIDs are unique): demand is then met once
over them, not once per node. :func:`mig_gpus` and :func:`waiting_demand` build the
planner's input from a pass's snapshot (``NodeView``, ``RunningJob``, ``PendingJob``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

from gpusched.core.model import GpuView, NodeView, PendingJob, Reason, RunningJob
from gpusched.core.shapes import is_mig_profile

MEMORY_SLICES = 8


class Profile(NamedTuple):
    """A GPU-instance profile of one GPU model."""

    name: str  # 1g.10gb
    slices: int  # compute slices
    size: int  # memory slices a placement covers
    starts: tuple[int, ...]  # where a placement may start
    instances: int  # at most this many on one GPU
    memory_mb: int


def _model(names: tuple[str, str, str, str, str, str],
           memory: tuple[int, int, int, int, int, int]) -> Mapping[str, Profile]:
    shapes = ((1, 1, (0, 1, 2, 3, 4, 5, 6), 7), (1, 2, (0, 2, 4, 6), 4), (2, 2, (0, 2, 4), 3),
              (3, 4, (0, 4), 2), (4, 4, (0,), 1), (7, 8, (0,), 1))
    return {name: Profile(name, slices, size, starts, instances, mb)
            for name, (slices, size, starts, instances), mb in zip(names, shapes, memory, strict=True)}


#: The MIG profiles of each GPU model (as ``gpusched.agent.nvml.gpu_type`` names models).
MODELS: Mapping[str, Mapping[str, Profile]] = {
    "a100-40gb": _model(("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
                        (4864, 9856, 9856, 19968, 19968, 40192)),
    "a100-80gb": _model(("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
                        (9728, 19968, 19968, 40192, 40192, 80896)),
    "h100-80gb": _model(("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
                        (9856, 19968, 19968, 40320, 40320, 80896)),
}

MAX_INSTANCES = 7


class LayoutError(ValueError):
    """A layout that the GPU model cannot take."""


def _order(profiles: Mapping[str, Profile], layout: Iterable[str]) -> list[str]:
    """Largest first (memory slices, then compute slices), then by name."""
    return sorted(layout, key=lambda p: (-profiles[p].size, -profiles[p].slices, p))


def check_layout(model: str, layout: Sequence[str]) -> None:
    """Raises LayoutError saying why ``layout`` (profile names) does not fit ``model``."""
    profiles = MODELS.get(model)
    if profiles is None:
        raise LayoutError(f"GPU model {model!r} cannot be re-partitioned here "
                          f"(known: {', '.join(sorted(MODELS))})")
    if not isinstance(layout, (list, tuple)) or not all(isinstance(p, str) for p in layout):
        raise LayoutError("a layout is a list of MIG profile names")
    if len(layout) > MAX_INSTANCES:
        raise LayoutError(f"a layout has at most {MAX_INSTANCES} instances, not {len(layout)}")
    unknown = sorted({p for p in layout if p not in profiles})
    if unknown:
        raise LayoutError(f"{', '.join(map(repr, unknown))} is not a MIG profile of {model} "
                          f"(its profiles: {', '.join(profiles)})")
    for name, count in sorted(Counter(layout).items()):
        if count > profiles[name].instances:
            raise LayoutError(f"{model} takes at most {profiles[name].instances} x {name}, "
                              f"not {count}")
    slices = sum(profiles[p].slices for p in layout)
    if slices > 7:
        raise LayoutError(f"{' + '.join(_order(profiles, layout))} needs {slices} compute "
                          f"slices; {model} has 7")
    if next(placements(model, layout), None) is None:
        raise LayoutError(f"{' + '.join(_order(profiles, layout))} cannot be placed on {model}: "
                          "its instances' memory slices would overlap")


def fits(model: str, layout: Sequence[str]) -> bool:
    """Whether ``model`` can take ``layout``."""
    try:
        check_layout(model, layout)
    except LayoutError:
        return False
    return True


def placements(model: str, layout: Sequence[str]) -> Iterator[tuple[tuple[str, int], ...]]:
    """Every way to place ``layout`` on an empty GPU: ``(profile, start)`` pairs, largest
    profile first; instances of one profile in increasing start order. Nothing when the
    model or a profile is unknown."""
    profiles = MODELS.get(model)
    if profiles is None or any(p not in profiles for p in layout) or len(layout) > MAX_INSTANCES:
        return
    if any(n > profiles[p].instances for p, n in Counter(layout).items()):
        return
    order = _order(profiles, layout)
    chosen: list[tuple[str, int]] = []

    def place(i: int, used: int) -> Iterator[tuple[tuple[str, int], ...]]:
        if i == len(order):
            yield tuple(chosen)
            return
        prof = profiles[order[i]]
        lowest = chosen[-1][1] + 1 if i and order[i - 1] == order[i] else 0
        for start in prof.starts:
            mask = ((1 << prof.size) - 1) << start
            if start < lowest or used & mask:
                continue
            chosen.append((prof.name, start))
            yield from place(i + 1, used | mask)
            chosen.pop()

    yield from place(0, 0)


def best_placement(model: str, layout: Sequence[str], current: Iterable[tuple[str, int]] = ()
                   ) -> tuple[tuple[str, int], ...] | None:
    """A placement of ``layout`` that keeps as many of the ``current`` instances
    (``(profile, start)``) where they are as any does; None when it does not fit."""
    now = Counter(current)
    best: tuple[tuple[str, int], ...] | None = None
    best_kept = -1
    for option in placements(model, layout):
        kept = sum((Counter(option) & now).values())
        if kept > best_kept:
            best, best_kept = option, kept
            if kept == len(option):
                break
    return best


class MigGpu(NamedTuple):
    """A GPU in MIG mode on the node, as the planner sees it."""

    uuid: str  # the parent GPU's UUID
    model: str  # a100-80gb (gpu_type of its name)
    layout: tuple[str, ...]  # the profiles of its MIG slices now
    in_use: tuple[str, ...] = ()  # the profiles of its slices allocated to jobs
    processes: bool = False  # a process runs on it or on one of its slices
    changed_at: float | None = None  # when its layout last changed (None: not known to)

    @property
    def busy(self) -> bool:
        return bool(self.in_use) or self.processes


class MigDemand(NamedTuple):
    """Slices of one profile that pending jobs wait for."""

    profile: str  # 1g.10gb
    slices: int  # how many slices of it the waiting jobs need in all
    waited: float  # seconds the longest-waiting of them has waited


def _free(gpu: MigGpu) -> Counter[str]:
    return Counter(gpu.layout) - Counter(gpu.in_use)


def may_change(gpu: MigGpu, now: float, min_interval: float) -> bool:
    """Idle, of a known model, and not changed in the last ``min_interval`` seconds."""
    if gpu.busy or gpu.model not in MODELS:
        return False
    return gpu.changed_at is None or now - gpu.changed_at >= min_interval


def plan_layouts(gpus: Sequence[MigGpu], demand: Sequence[MigDemand], now: float,
                 min_interval: float, min_wait: float = 0.0) -> dict[str, tuple[str, ...]]:
    """The GPUs to re-partition and their target layouts (see the module's rule)."""
    wanted: Counter[str] = Counter()
    waited: dict[str, float] = {}
    for d in demand:
        if d.slices > 0:
            wanted[d.profile] += d.slices
            waited[d.profile] = max(waited.get(d.profile, d.waited), d.waited)
    changeable = sorted((g for g in gpus if may_change(g, now, min_interval)), key=lambda g: g.uuid)
    fixed = sorted((g for g in gpus if not may_change(g, now, min_interval)), key=lambda g: g.uuid)

    # 1. Free slices go to the demand first, on GPUs that cannot change before the others.
    claimed: dict[str, Counter[str]] = {}
    for gpu in [*fixed, *changeable]:
        take = _free(gpu) & wanted
        claimed[gpu.uuid] = take
        wanted -= take

    # 3. What is left, longest-waiting first.
    unmet = sorted(((p, n) for p, n in wanted.items() if n > 0 and waited[p] >= min_wait),
                   key=lambda pn: (-waited[pn[0]], -pn[1], pn[0]))
    left = dict(unmet)
    targets: dict[str, tuple[str, ...]] = {}
    for gpu in changeable:
        if not any(left.values()):
            break
        profiles = MODELS[gpu.model]
        layout = list(claimed[gpu.uuid].elements())
        added = 0
        for profile, _ in unmet:
            while left[profile] > 0 and profile in profiles and fits(gpu.model, [*layout, profile]):
                layout.append(profile)
                left[profile] -= 1
                added += 1
        if not added:
            continue
        spare = Counter(gpu.layout) - claimed[gpu.uuid]
        for profile in _order(profiles, (p for p in spare.elements() if p in profiles)):
            if fits(gpu.model, [*layout, profile]):
                layout.append(profile)
        target = tuple(_order(profiles, layout))
        if Counter(target) != Counter(gpu.layout):
            targets[gpu.uuid] = target
    return targets


# Pending reasons of jobs that wait for resources (not for a hold, a dependency, a time).
_WAITING = frozenset({Reason.NONE, Reason.RESOURCES, Reason.PRIORITY})


def mig_gpus(node: NodeView, running: Iterable[RunningJob],
             changed_at: Mapping[str, float] | None = None,
             processes: Collection[str] = ()) -> list[MigGpu]:
    """The node's GPUs in MIG mode, for :func:`plan_layouts`: each one's slices, those
    that running jobs hold (whole or a share of), when its layout last changed
    (``changed_at``, by GPU UUID) and whether ``processes`` (UUIDs of GPUs or slices
    with a process) names it or a slice. A GPU that is unhealthy, or has an unhealthy
    slice, is left out: it is never changed and its slices meet no demand."""
    if not any(gpu.mig_mode for gpu in node.gpus):
        return []
    held: set[str] = set()
    for job in running:
        if node.name == job.node or node.name in job.nodes:
            held.update(job.gpu_uuids)
            held.update(uuid for uuid, _, _ in job.shares)
    busy = set(processes)
    slices_of: dict[int, list[GpuView]] = {}
    for gpu in node.gpus:
        if gpu.parent is not None and gpu.mig_profile:
            slices_of.setdefault(gpu.parent, []).append(gpu)
    found: list[MigGpu] = []
    for gpu in node.gpus:
        if not gpu.mig_mode or gpu.parent is not None:
            continue
        slices = slices_of.get(gpu.index, [])
        if not gpu.healthy or not all(s.healthy for s in slices):
            continue
        found.append(MigGpu(
            gpu.uuid, gpu.gpu_type, tuple(s.mig_profile or "" for s in slices),
            tuple(s.mig_profile or "" for s in slices if s.uuid in held),
            gpu.uuid in busy or gpu.uuid in held or any(s.uuid in busy for s in slices),
            (changed_at or {}).get(gpu.uuid)))
    return found


def waiting_demand(jobs: Iterable[PendingJob], now: float) -> list[MigDemand]:
    """The MIG slices pending jobs wait for: jobs that ask for one MIG profile
    (``--gpus 1g.10gb:2``), are not held and wait for resources (not for a dependency, a
    begin time or a limit), by profile; ``waited`` counts from each job's eligible time."""
    slices: Counter[str] = Counter()
    waited: dict[str, float] = {}
    for job in jobs:
        if len(job.gpu_kinds) != 1 or not is_mig_profile(job.gpu_kinds[0]) or job.gpus <= 0:
            continue
        if job.hold is not None or job.reason not in _WAITING or job.eligible_time > now:
            continue
        profile = job.gpu_kinds[0]
        slices[profile] += job.gpus
        waited[profile] = max(waited.get(profile, 0.0), now - job.eligible_time)
    return [MigDemand(p, slices[p], waited[p]) for p in sorted(slices)]
