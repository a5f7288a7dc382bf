"""Fragmentation-aware placement of GPU-sharing tasks (FGD, Weng et al., USENIX ATC'23).

A node's GPUs are described by how many thousandths of each are still free (1000: idle).
A task asks for CPU (thousandths of a core), memory (MiB) and GPU in the Alibaba trace's
terms: ``num_gpu == 1`` with ``0 < gpu_milli < 1000`` is a fraction of one GPU, which must
come from a single GPU with that much free; any other ``num_gpu > 0`` asks for
``num_gpu`` whole, idle GPUs; ``num_gpu == 0`` asks for no GPU. A task with a
``gpu_type`` only fits a node of that type ("" on the task: any type).

Fragmentation (the paper's measure). The fragmentation of a node with respect to one
task kind is the free GPU capacity on that node that a task of that kind could not use:

* all of the node's free GPU when the kind cannot be placed there at all (not enough CPU
  or memory, the wrong GPU type, no GPU with enough free for a fraction, too few idle
  GPUs for a whole-GPU kind), and also for a kind that asks for no GPU;
* otherwise the free parts of the GPUs that are too small for it: GPUs with less free
  than the fraction asked, or, for a whole-GPU kind, every partly used GPU.

A node's fragmentation for a workload is the sum over task kinds of that measure
weighted by the kind's popularity (its share of the tasks). FGD places a task where the
workload fragmentation of the chosen node grows least.

Growths are compared in bands of ``Workload.band`` thousandths of a GPU (80 by default:
growths within the same 0.08-GPU band count as equal); within a band best fit decides
(the node left with the least free GPU, then the tightest GPU for a fraction, then the
least free CPU), then the lowest node index, then the lowest GPU indices. Popularity is
an estimate, and differences far below one task's size are noise: on the Alibaba openb
trace (``gpusched.sim.inflation``) comparing exact growths allocates 94.7% of the GPUs
at 100% arrived demand, banded growths 95.2%. ``band=0`` compares exact growths.

Interface (used by the scheduling pass and by ``gpusched.sim.inflation``):

* ``GpuNode(cpu_milli, mem_mib, gpus, gpu_type="")``: what is free on a node;
* ``Task(cpu_milli, mem_mib, num_gpu, gpu_milli, gpu_type="")``;
* ``Workload``: task kinds with their counts (``Workload.of(tasks)`` groups identical
  tasks); ``popularity(task)``, ``fragmentation(node)``; it keeps caches keyed by node
  state, so one Workload should be reused across calls;
* ``placements(node, task)``: the GPU index tuples a task could take on the node (for
  whole GPUs one representative: the lowest idle indices, since idle GPUs are
  interchangeable); ``[]`` when it does not fit; ``[()]`` for a task without GPU;
* ``score(node, task, gpus, policy, workload)``: lower is better, in the order ``choose``
  uses (but for the node index); ``growth(node, task, gpus, workload)``: the exact growth
  of the node's workload fragmentation in thousandths of a GPU;
* ``choose(nodes, task, policy, workload=None, rng=None)``: ``(node index, gpus)`` or
  ``None``; policies ``"fgd"``, ``"bestfit"``, ``"firstfit"`` and ``"random"`` (needs an
  ``rng`` with ``randrange``, e.g. ``random.Random(seed)``);
* ``apply(node, task, gpus)``: the node's state once the task holds ``gpus``.

Nothing here is ever over-committed: ``apply`` refuses a placement that does not fit.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol

WHOLE = 1000  # thousandths in one GPU
POLICIES = ("fgd", "bestfit", "firstfit", "random")
FGD_BAND = 80  # thousandths of a GPU: growths of fragmentation this close count as equal
_CACHE_LIMIT = 200_000  # node states remembered per Workload before the cache restarts


class GpuNode(NamedTuple):
    """What is free on one node: CPU thousandths, memory MiB, and the free thousandths
    of each GPU by index (1000 = idle)."""

    cpu_milli: int
    mem_mib: int
    gpus: tuple[int, ...]
    gpu_type: str = ""


class Task(NamedTuple):
    """One task's request, as the Alibaba trace writes it (see the module text)."""

    cpu_milli: int
    mem_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_type: str = ""


class Rng(Protocol):
    def randrange(self, stop: int, /) -> int: ...


def is_fraction(task: Task) -> bool:
    """A share of one GPU (``num_gpu == 1`` and ``0 < gpu_milli < 1000``)."""
    return task.num_gpu == 1 and 0 < task.gpu_milli < WHOLE


def gpu_demand(task: Task) -> int:
    """The task's GPU request in thousandths of a GPU."""
    if task.num_gpu <= 0:
        return 0
    return task.gpu_milli if is_fraction(task) else task.num_gpu * WHOLE


def _type_ok(node: GpuNode, task: Task) -> bool:
    return not task.gpu_type or task.gpu_type == node.gpu_type


def placements(node: GpuNode, task: Task) -> list[tuple[int, ...]]:
    """The GPU index tuples ``task`` could take on ``node`` (see the module text)."""
    if task.cpu_milli > node.cpu_milli or task.mem_mib > node.mem_mib:
        return []
    if task.num_gpu <= 0:
        return [()]
    if not _type_ok(node, task):
        return []
    if is_fraction(task):
        need = task.gpu_milli
        return [(i,) for i, free in enumerate(node.gpus) if free >= need]
    idle = [i for i, free in enumerate(node.gpus) if free >= WHOLE]
    return [tuple(idle[: task.num_gpu])] if len(idle) >= task.num_gpu else []


def apply(node: GpuNode, task: Task, gpus: Sequence[int]) -> GpuNode:
    """The node once ``task`` holds ``gpus``; ValueError if that over-commits anything."""
    if task.cpu_milli > node.cpu_milli or task.mem_mib > node.mem_mib:
        raise ValueError("the task's CPU or memory does not fit the node")
    free = list(node.gpus)
    if task.num_gpu <= 0:
        if gpus:
            raise ValueError("a task without GPU takes no GPU")
    else:
        if not _type_ok(node, task):
            raise ValueError("the task asks for another GPU type")
        each = task.gpu_milli if is_fraction(task) else WHOLE
        if len(gpus) != task.num_gpu or len(set(gpus)) != len(gpus):
            raise ValueError(f"the task takes {task.num_gpu} distinct GPU(s), not {gpus!r}")
        for i in gpus:
            if not 0 <= i < len(free) or free[i] < each:
                raise ValueError(f"GPU {i} has not {each} thousandths free")
            free[i] -= each
    return GpuNode(node.cpu_milli - task.cpu_milli, node.mem_mib - task.mem_mib,
                   tuple(free), node.gpu_type)


def kind_fragmentation(node: GpuNode, kind: Task) -> int:
    """The free GPU thousandths on ``node`` that a task of ``kind`` could not use,
    computed plainly from the definition (the module text)."""
    total = sum(node.gpus)
    if kind.num_gpu <= 0 or not placements(node, kind):
        return total
    if is_fraction(kind):
        return sum(free for free in node.gpus if free < kind.gpu_milli)
    return sum(free for free in node.gpus if free < WHOLE)


class Workload:
    """Task kinds and how many tasks of each a typical workload has.

    ``fragmentation(node)`` is the popularity-weighted fragmentation of the node (in
    thousandths of a GPU). Internally it is computed as the node's free GPU less what
    the kinds that fit can use, in integers (counts, not shares), so equal states give
    exactly equal values; results are cached by node state.
    """

    def __init__(self, kinds: Iterable[tuple[Task, int]], band: int = FGD_BAND) -> None:
        if band < 0:
            raise ValueError(f"the band must not be negative: {band}")
        self.band = band
        merged: Counter[Task] = Counter()
        for task, count in kinds:
            if count < 0:
                raise ValueError(f"a task kind's count must not be negative: {count}")
            if count:
                merged[Task(*task)] += count
        self.kinds: tuple[tuple[Task, int], ...] = tuple(
            sorted(merged.items(), key=lambda kc: (-kc[1], kc[0])))
        self.total = sum(merged.values())
        gpu_kinds = [(t, c) for t, c in self.kinds if t.num_gpu > 0]
        # Kinds that fit a node's CPU and memory are those whose request is at most what
        # is free: the ranks of the free amounts among the requests decide which, so
        # the eligible kinds are cached by (CPU rank, memory rank, GPU type).
        self._cpu_values = sorted({t.cpu_milli for t, _ in gpu_kinds})
        self._mem_values = sorted({t.mem_mib for t, _ in gpu_kinds})
        self._gpu_kinds = gpu_kinds
        self._eligible: dict[tuple[int, int, str],
                             tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
        self._frag: dict[tuple[Any, ...], int] = {}

    @classmethod
    def of(cls, tasks: Iterable[Task], weigh: str = "count", band: int = FGD_BAND) -> Workload:
        """The workload whose kinds are the distinct tasks given. ``weigh="count"``: a
        kind's popularity is its share of the tasks (the paper's definition);
        ``"gpu"``: its share of the GPU asked (count times GPU thousandths), which
        makes rare large tasks count as much as the GPU they need (kinds without GPU
        then weigh nothing; they never change a choice anyway)."""
        counts = Counter(Task(*t) for t in tasks)
        if weigh == "count":
            return cls(counts.items(), band)
        if weigh == "gpu":
            return cls(((task, count * gpu_demand(task)) for task, count in counts.items()), band)
        raise ValueError(f"a workload weighs kinds by count or gpu, not {weigh!r}")

    def popularity(self, task: Task) -> float:
        """The share of the workload's tasks that are of this kind."""
        return dict(self.kinds).get(Task(*task), 0) / self.total if self.total else 0.0

    def _eligible_levels(self, cpu_rank: int, mem_rank: int, gpu_type: str
                         ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        key = (cpu_rank, mem_rank, gpu_type)
        hit = self._eligible.get(key)
        if hit is not None:
            return hit
        cpu_cap = self._cpu_values[cpu_rank - 1] if cpu_rank else -1
        mem_cap = self._mem_values[mem_rank - 1] if mem_rank else -1
        fractions: Counter[int] = Counter()
        wholes: Counter[int] = Counter()
        for task, count in self._gpu_kinds:
            if task.cpu_milli > cpu_cap or task.mem_mib > mem_cap:
                continue
            if task.gpu_type and task.gpu_type != gpu_type:
                continue
            if is_fraction(task):
                fractions[task.gpu_milli] += count
            else:
                wholes[task.num_gpu] += count
        levels = (tuple(sorted(fractions.items(), reverse=True)), tuple(sorted(wholes.items())))
        self._eligible[key] = levels
        return levels

    def scaled_fragmentation(self, node: GpuNode) -> int:
        """``fragmentation(node)`` times the number of tasks in the workload (exact)."""
        cpu_rank = bisect_right(self._cpu_values, node.cpu_milli)
        mem_rank = bisect_right(self._mem_values, node.mem_mib)
        gpus = tuple(sorted(node.gpus, reverse=True))
        key = (cpu_rank, mem_rank, node.gpu_type, gpus)
        value = self._frag.get(key)
        if value is not None:
            return value
        fractions, wholes = self._eligible_levels(cpu_rank, mem_rank, node.gpu_type)
        free_total = sum(gpus)
        usable = 0  # count-weighted GPU thousandths the fitting kinds can use
        # Fractional kinds in decreasing size: the GPUs with at least that much free
        # are a growing prefix of the GPUs sorted by free capacity.
        j, prefix, n = 0, 0, len(gpus)
        for need, count in fractions:
            while j < n and gpus[j] >= need:
                prefix += gpus[j]
                j += 1
            if not prefix:
                continue
            usable += count * prefix
        if wholes:
            idle = 0
            while idle < n and gpus[idle] >= WHOLE:
                idle += 1
            for want, count in wholes:
                if want > idle:
                    break
                usable += count * idle * WHOLE
        value = free_total * self.total - usable
        if len(self._frag) >= _CACHE_LIMIT:
            self._frag.clear()
        self._frag[key] = value
        return value

    def fragmentation(self, node: GpuNode) -> float:
        """The node's fragmentation for this workload, in thousandths of a GPU."""
        return self.scaled_fragmentation(node) / self.total if self.total else 0.0

    def band_of(self, scaled_growth: int) -> int:
        """The band of a growth given as ``scaled_fragmentation`` differences."""
        if not self.band:
            return scaled_growth
        return scaled_growth // (self.band * self.total) if self.total else 0


def _fit_key(node: GpuNode, task: Task, gpus: Sequence[int]) -> tuple[int, int, int]:
    """Best fit's order: free GPU left on the node, then on the chosen GPU (fractions),
    then free CPU left; smaller is better."""
    left = sum(node.gpus) - gpu_demand(task)
    own = node.gpus[gpus[0]] - task.gpu_milli if is_fraction(task) else 0
    return left, own, node.cpu_milli - task.cpu_milli


def growth(node: GpuNode, task: Task, gpus: Sequence[int], workload: Workload) -> float:
    """How much placing ``task`` on ``gpus`` grows the node's workload fragmentation, in
    thousandths of a GPU (negative: it shrinks)."""
    after = apply(node, task, gpus)
    if not workload.total:
        return 0.0
    return (workload.scaled_fragmentation(after)
            - workload.scaled_fragmentation(node)) / workload.total


def score(node: GpuNode, task: Task, gpus: Sequence[int], policy: str,
          workload: Workload | None = None) -> tuple[int, ...]:
    """How good placing ``task`` on ``gpus`` of ``node`` is; lower is better, compared as
    tuples of integers (exact at any size).

    ``"bestfit"``: free GPU thousandths left on the node, then the chosen GPU's leftover
    (fractions), then the CPU left. ``"fgd"``: the band of the fragmentation growth
    (``band=0``: the exact growth, scaled) ahead of the best-fit score, so that scores
    order placements as ``choose`` does. ``gpus`` must be one of ``placements(node, task)``.
    """
    fit = _fit_key(node, task, gpus)
    if policy == "bestfit":
        return fit
    if policy == "fgd":
        if workload is None:
            raise ValueError("fgd scores against a workload")
        after = apply(node, task, gpus)
        grown = workload.scaled_fragmentation(after) - workload.scaled_fragmentation(node)
        return (workload.band_of(grown), *fit)
    raise ValueError(f"score knows fgd and bestfit, not {policy!r}")


def _candidates(node: GpuNode, task: Task) -> list[tuple[int, ...]]:
    """Placements that differ in the state they leave: for a fraction, one GPU (the
    lowest index) per distinct free amount."""
    options = placements(node, task)
    if len(options) <= 1 or not is_fraction(task):
        return options
    seen: set[int] = set()
    out = []
    for option in options:
        free = node.gpus[option[0]]
        if free not in seen:
            seen.add(free)
            out.append(option)
    return out


def choose(nodes: Sequence[GpuNode], task: Task, policy: str,
           workload: Workload | None = None,
           rng: Rng | None = None) -> tuple[int, tuple[int, ...]] | None:
    """Where ``policy`` places ``task``: ``(node index, GPU indices)``, or None when it
    fits nowhere. Deterministic for all policies but ``"random"`` (given its ``rng``)."""
    task = Task(*task)
    if policy == "firstfit":
        for index, node in enumerate(nodes):
            options = placements(node, task)
            if options:
                return index, options[0]
        return None
    if policy == "random":
        if rng is None:
            raise ValueError("the random policy needs an rng")
        fitting = [i for i, node in enumerate(nodes) if placements(node, task)]
        if not fitting:
            return None
        index = fitting[rng.randrange(len(fitting))]
        options = placements(nodes[index], task)
        return index, options[rng.randrange(len(options))]
    if policy not in ("bestfit", "fgd"):
        raise ValueError(f"unknown placement policy {policy!r}; known: {', '.join(POLICIES)}")
    if policy == "fgd" and workload is None:
        raise ValueError("fgd chooses against a workload")
    # Nodes in the same state score alike: the lowest index of each state stands for it.
    first: dict[GpuNode, int] = {}
    for index, node in enumerate(nodes):
        if node not in first:
            first[node] = index
    best_key: tuple[Any, ...] | None = None
    best = None
    for node, index in first.items():
        options = _candidates(node, task)
        if not options:
            continue
        before = (workload.scaled_fragmentation(node)
                  if workload is not None and policy == "fgd" else 0)
        for gpus in options:
            fit = _fit_key(node, task, gpus)
            key: tuple[Any, ...]
            if workload is not None and policy == "fgd":
                grown = workload.scaled_fragmentation(apply(node, task, gpus)) - before
                key = (workload.band_of(grown), fit, index, gpus)
            else:
                key = (fit, index, gpus)
            if best_key is None or key < best_key:
                best_key, best = key, (index, gpus)
    return best
