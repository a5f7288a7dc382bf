"""Which GPUs of a node a job gets: the best-connected set, and MIG slices packed tight.

Links between two GPUs are ranked, higher being better: NVLink (more links, better), then
the PCIe common ancestor from nearest to farthest (same switch, same host bridge, same
NUMA node, across sockets); a pair with no known link ranks lowest. A multi-GPU job
gets the set whose worst pair is best (all-NVLink before mixed before PCIe-only), then the
one with the best links overall, then the one that leaves the GPUs still free best
connected, then the lowest indexes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from math import comb

from gpusched.core.model import GpuView, NodeView

# How two GPUs are connected, as NVML reports it: NVLink, else the nearest common PCIe
# ancestor (same switch, same host bridge, same NUMA node, across sockets).
LINK_KINDS = ("NVLINK", "PCIE_SWITCH", "PCIE_HOST_BRIDGE", "NUMA_NODE", "SYSTEM")
LINK_RANKS = {"SYSTEM": 1, "NUMA_NODE": 2, "PCIE_HOST_BRIDGE": 3, "PCIE_SWITCH": 4}
NVLINK_BASE = 10
MAX_SUBSETS = 512  # beyond this many candidate sets, sets are grown greedily


def link_rank(kind: str, nvlinks: int = 0) -> int:
    """The rank of one link: NVLink ranks above any PCIe path, more NVLinks higher."""
    if kind == "NVLINK":
        return NVLINK_BASE + max(1, nvlinks)
    return LINK_RANKS.get(kind, 0)


def _pairs_score(indexes: Sequence[int], links: Mapping[tuple[int, int], int]) -> tuple[int, int]:
    worst, total = NVLINK_BASE * 100, 0
    for i, a in enumerate(indexes):
        for b in indexes[i + 1:]:
            rank = links.get((a, b) if a < b else (b, a), 0)
            worst = min(worst, rank)
            total += rank
    return worst, total


_CACHE: dict[tuple[str, tuple[int, ...], int], tuple[Mapping[tuple[int, int], int], tuple[int, ...]]] = {}


def best_set(free: Sequence[int], count: int,
             links: Mapping[tuple[int, int], int]) -> tuple[int, ...]:
    """The ``count`` indexes of ``free`` (sorted) a job should get, by the rules above."""
    if count >= len(free) or not links:
        return tuple(free[:count])
    if comb(len(free), count) > MAX_SUBSETS:
        return _greedy(free, count, links)
    best: tuple[tuple[int, int, int, int], tuple[int, ...]] | None = None
    for chosen in combinations(free, count):
        rest = [i for i in free if i not in chosen]
        score = (*_pairs_score(chosen, links), *_pairs_score(rest, links))
        if best is None or score > best[0]:
            best = (score, chosen)
    assert best is not None
    return best[1]


def _greedy(free: Sequence[int], count: int,
            links: Mapping[tuple[int, int], int]) -> tuple[int, ...]:
    """Grow a set from each start, adding the GPU best linked to it; keep the best set."""
    best: tuple[tuple[int, int], tuple[int, ...]] | None = None
    for start in free:
        chosen = [start]
        while len(chosen) < count:
            pick = max((i for i in free if i not in chosen),
                       key=lambda i: (min(links.get((min(i, j), max(i, j)), 0) for j in chosen),
                                      -i))
            chosen.append(pick)
        ordered = tuple(sorted(chosen))
        score = _pairs_score(ordered, links)
        if best is None or score > best[0]:
            best = (score, ordered)
    assert best is not None
    return best[1]


def choose_gpus(node: NodeView, free: Sequence[GpuView], count: int,
                slices: bool) -> tuple[GpuView, ...]:
    """``count`` of the node's ``free`` units (sorted by index) for one job."""
    if slices:
        # Pack: slices of the GPU with the fewest free slices first, keeping others whole.
        per_parent: dict[int | None, int] = {}
        for unit in free:
            per_parent[unit.parent] = per_parent.get(unit.parent, 0) + 1
        ranked = sorted(free, key=lambda u: (per_parent[u.parent], u.parent or 0, u.index))
        return tuple(sorted(ranked[:count], key=lambda u: u.index))
    if count >= len(free) or not node.links or count == 0:
        return tuple(free[:count])
    indexes = tuple(unit.index for unit in free)
    key = (node.name, indexes, count)
    cached = _CACHE.get(key)
    if cached is not None and cached[0] is node.links:
        chosen = cached[1]
    else:
        chosen = best_set(indexes, count, node.links)
        if len(_CACHE) > 100_000:
            _CACHE.clear()
        _CACHE[key] = (node.links, chosen)
    wanted = set(chosen)
    return tuple(unit for unit in free if unit.index in wanted)
