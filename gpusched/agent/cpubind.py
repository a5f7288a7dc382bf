"""Which CPUs a job gets on its node: pure choice, no I/O (the agent reads the inputs).

Slurm's ``--gres-flags`` semantics: by default CPUs near the job's GPUs (their NUMA
nodes) are preferred and others used when too few are free; ``enforce-binding`` takes
only CPUs near the GPUs or fails the launch; ``disable-binding`` ignores NUMA.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass


class BindingError(Exception):
    """--gres-flags=enforce-binding cannot be met; the message says why."""


@dataclass(frozen=True)
class CpuChoice:
    """The CPUs chosen (None: no cpuset is set) and the NUMA nodes they lie on; ``note``
    says why there is no cpuset, for the job's supervisor log."""

    cpus: tuple[int, ...] | None
    mems: tuple[int, ...] | None = None
    note: str | None = None


def nodes_of(cpus: Collection[int], numa_cpus: Mapping[int, Collection[int]]) -> set[int]:
    """The NUMA nodes holding any of ``cpus``."""
    return {node for node, members in numa_cpus.items() if set(members) & set(cpus)}


def choose_cpus(count: int, available: Collection[int], held: Collection[int],
                gpu_numa: Collection[int], numa_cpus: Mapping[int, Collection[int]],
                gres_flags: str | None = None) -> CpuChoice:
    """Pick ``count`` CPUs of ``available`` not ``held`` by other jobs.

    ``gpu_numa`` are the NUMA nodes of the job's GPUs (empty: unknown or no GPUs) and
    ``numa_cpus`` each NUMA node's CPUs. Lowest numbers first within a preference, so
    that the choice is the same for the same input. Raises BindingError only under
    ``enforce-binding``; otherwise too few free CPUs means no cpuset at all.
    """
    enforce = gres_flags == "enforce-binding"
    if count <= 0:
        return CpuChoice(None, note="the job counts no CPUs: no cpuset")
    free = set(available) - set(held)
    near: set[int] = set()
    if gres_flags != "disable-binding":
        for node in gpu_numa:
            near |= set(numa_cpus.get(node, ()))
    if enforce:
        if not near:
            raise BindingError("--gres-flags=enforce-binding: the NUMA node of the job's "
                               "GPUs is not known on this node")
        if len(free & near) < count:
            raise BindingError(
                f"--gres-flags=enforce-binding: {count} CPUs asked, "
                f"{len(free & near)} free near the job's GPUs (NUMA node"
                f"{'s' if len(set(gpu_numa)) > 1 else ''} "
                f"{','.join(str(n) for n in sorted(set(gpu_numa)))})")
    if count > len(free):
        return CpuChoice(None, note=f"{count} CPUs asked but {len(free)} free on this node: "
                                    "no cpuset")
    ordered = sorted(free & near) + sorted(free - near)
    chosen = tuple(sorted(ordered[:count]))
    mems = tuple(sorted(nodes_of(chosen, numa_cpus))) or None
    return CpuChoice(chosen, mems)


def parse_cpulist(text: str, limit: int = 1 << 16) -> set[int]:
    """``0-3,8,10-11`` -> {0,1,2,3,8,10,11}; ValueError when it is not a CPU list or
    names a CPU of ``limit`` or more."""
    found: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if not 0 <= first <= last < limit:
            raise ValueError(f"not a CPU list: {text.strip()!r:.80}")
        found.update(range(first, last + 1))
    return found
