"""The FGD paper's allocation experiment (Weng et al., USENIX ATC'23, Monte-Carlo
workload inflation) on the Alibaba openb trace.

The cluster is the trace's GPU node list; tasks arrive one after another, each drawn at
random (with replacement, from a seeded generator) from the trace's task list, and never
leave. A placement policy of ``gpusched.core.fragmentation`` places each arrival; one that
fits nowhere fails and is skipped, and arrivals go on. What is measured, in percent of
the cluster's GPU capacity:

* the GPU allocated when an arrival first fails;
* the GPU allocated when the GPU asked by all arrivals so far (failed ones included)
  first reaches 100% of capacity;
* the allocation at every whole percent of arrived demand (the paper's curve).

For one seed every policy sees the same arrivals. FGD's workload (the task kinds and
their popularity) is the trace's own task list unless one is given.
"""

from __future__ import annotations

import csv
import gzip
import io
import random
import statistics
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpusched.core.fragmentation import (
    GpuNode,
    Task,
    Workload,
    apply,
    choose,
    gpu_demand,
)

NODE_FILE = "alibaba_openb_node_list_gpu_node.csv.gz"
TASK_FILE = "alibaba_openb_pod_list_default.csv.gz"
ARRIVALS = ("shuffle", "draw")


@dataclass(frozen=True, slots=True)
class Cluster:
    """The nodes (all idle), their names and the GPU capacity in thousandths."""

    names: tuple[str, ...]
    nodes: tuple[GpuNode, ...]

    @property
    def gpu_milli(self) -> int:
        return sum(sum(n.gpus) for n in self.nodes)


@dataclass(slots=True)
class Run:
    """One policy's run for one seed."""

    policy: str
    seed: int
    capacity: int  # GPU thousandths in the cluster
    arrivals: int = 0
    failures: int = 0
    first_failure_pct: float | None = None  # allocated when an arrival first failed
    first_failure_arrived_pct: float | None = None
    at_100_pct: float | None = None  # allocated when arrived demand reached 100%
    curve: list[float] = field(default_factory=list)  # allocated at arrived 1%, 2%, ...
    allocated: int = 0  # GPU thousandths held at the end
    cpu_fails: int = 0  # failed arrivals that asked for no GPU
    final: tuple[GpuNode, ...] = ()  # what is free on each node at the end


def _rows(path: Path) -> Iterable[dict[str, str]]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    yield from csv.DictReader(io.StringIO(raw.decode("utf-8")))


def _int(row: dict[str, str], key: str, path: Path, line: int) -> int:
    try:
        value = int(row[key])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{path}:{line}: column {key!r} is not a whole number: "
                         f"{row.get(key)!r}") from None
    if value < 0:
        raise ValueError(f"{path}:{line}: column {key!r} is negative: {value}")
    return value


def read_cluster(path: Path) -> Cluster:
    """The openb node list (``sn, cpu_milli, memory_mib, gpu, model``), every node idle."""
    names: list[str] = []
    nodes: list[GpuNode] = []
    for line, row in enumerate(_rows(path), start=2):
        gpus = _int(row, "gpu", path, line)
        nodes.append(GpuNode(_int(row, "cpu_milli", path, line),
                             _int(row, "memory_mib", path, line),
                             (1000,) * gpus, (row.get("model") or "").strip()))
        names.append(row.get("sn") or f"node{len(names)}")
    return Cluster(tuple(names), tuple(nodes))


def read_tasks(path: Path) -> list[Task]:
    """The openb pod list as tasks (``cpu_milli, memory_mib, num_gpu, gpu_milli,
    gpu_spec``). A ``gpu_spec`` naming one GPU model ties the task to it; a list of
    models (``A|B``) is kept as written and so matches no node."""
    tasks = []
    for line, row in enumerate(_rows(path), start=2):
        num_gpu = _int(row, "num_gpu", path, line)
        milli = _int(row, "gpu_milli", path, line)
        if num_gpu == 0:
            milli = 0
        elif milli == 0 or milli > 1000:
            raise ValueError(f"{path}:{line}: num_gpu {num_gpu} with gpu_milli {milli}")
        tasks.append(Task(_int(row, "cpu_milli", path, line), _int(row, "memory_mib", path, line),
                          num_gpu, milli, (row.get("gpu_spec") or "").strip()))
    return tasks


def arrivals(tasks: Sequence[Task], seed: int, how: str = "shuffle") -> Iterator[Task]:
    """The endless arrival stream for one seed. ``"shuffle"`` (the paper's simulator):
    every task of the trace once, in a seeded random order, then tasks drawn from the
    trace at random with replacement; ``"draw"``: draws with replacement from the start."""
    if how not in ARRIVALS:
        raise ValueError(f"arrivals are {' or '.join(ARRIVALS)}, not {how!r}")
    rng = random.Random(seed)
    if how == "shuffle":
        order = list(tasks)
        rng.shuffle(order)
        yield from order
    while True:
        yield tasks[rng.randrange(len(tasks))]


def inflate(cluster: Cluster, tasks: Sequence[Task], policy: str, seed: int,
            workload: Workload | None = None, until_pct: float = 100.0,
            max_arrivals: int | None = None, how: str = "shuffle") -> Run:
    """Arrivals (``arrivals(tasks, seed, how)``) until their GPU demand reaches
    ``until_pct`` of capacity (or ``max_arrivals``), each placed by ``policy``."""
    if not tasks:
        raise ValueError("no tasks to draw arrivals from")
    if policy == "fgd" and workload is None:
        workload = Workload.of(tasks)
    stream = arrivals(tasks, seed, how)
    policy_rng = random.Random(seed * 7919 + 1)
    nodes = list(cluster.nodes)
    capacity = cluster.gpu_milli
    if capacity <= 0:
        raise ValueError("the cluster has no GPU")
    run = Run(policy, seed, capacity)
    arrived = 0
    goal = until_pct / 100 * capacity
    next_pct = 1
    while arrived < goal and (max_arrivals is None or run.arrivals < max_arrivals):
        task = next(stream)
        demand = gpu_demand(task)
        run.arrivals += 1
        arrived += demand
        picked = choose(nodes, task, policy, workload, policy_rng)
        if picked is None:
            run.failures += 1
            run.cpu_fails += demand == 0
            if run.first_failure_pct is None:
                run.first_failure_pct = 100 * run.allocated / capacity
                run.first_failure_arrived_pct = 100 * (arrived - demand) / capacity
        else:
            index, gpus = picked
            nodes[index] = apply(nodes[index], task, gpus)
            run.allocated += demand
        while arrived * 100 >= next_pct * capacity:
            run.curve.append(100 * run.allocated / capacity)
            next_pct += 1
        if run.at_100_pct is None and arrived >= capacity:
            run.at_100_pct = 100 * run.allocated / capacity
    run.final = tuple(nodes)
    return run


@dataclass(frozen=True, slots=True)
class Spread:
    mean: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.2f} (range {self.low:.2f}-{self.high:.2f}, {self.n} seeds)"


def spread(values: Iterable[float | None]) -> Spread | None:
    """Mean and range of the values that are there (None: not reached)."""
    got = [v for v in values if v is not None]
    if not got:
        return None
    return Spread(statistics.fmean(got), min(got), max(got), len(got))
