"""Where a job step's tasks run and what each holds (pure): Slurm's block layout of
``srun`` inside an allocation.

A step runs ``ntasks`` tasks on ``nodes`` of its job's nodes. Defaults, as srun's:
neither count given, one task on each of the job's nodes; ``ntasks`` alone, as many
nodes as tasks up to the job's; ``nodes`` alone, one task per node (or
``ntasks_per_node`` each). Tasks are spread in blocks: with n tasks on N nodes the
first ``n mod N`` nodes run one more, and a node's task ids are consecutive. With
``ntasks_per_node`` k every node runs k, the last what is left.

GPUs: with ``gpus_per_task`` g each task gets g GPUs of its node of its own, in the
node's order; without it every task of a node sees all the job's GPUs there, and the
step holds them all. CPUs: with ``exact`` the step holds ``cpus_per_task`` (default 1)
per task, else all the job's CPUs on each of its nodes; a job whose CPUs are not counted
(0) holds none, so they are not checked. What other running steps hold is not given to
this one unless ``overlap``; nodes without room are passed over, and a step that fits
the job but not beside the steps running now is ``busy`` (it may wait), while one that
can never fit the job is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

MAX_TASKS_PER_STEP = 65_536
MAX_STEP_ID = 2**31 - 2
MASTER_PORT_BASE = 29_500
MASTER_PORT_SPAN = 2_000


class StepLayoutError(ValueError):
    """The step can never run in this job; the message says what and what the job has."""


class StepBusy(Exception):
    """The step fits the job, but not beside the steps that run in it now."""


@dataclass(frozen=True)
class JobNode:
    """One node of the job: its name, the job's GPUs on it (in order) and the CPUs the
    job holds there (0: not counted)."""

    name: str
    gpus: tuple[str, ...] = ()
    cpus: int = 0


@dataclass(frozen=True)
class Held:
    """What running steps hold on one node."""

    gpus: frozenset[str] = frozenset()
    cpus: int = 0


@dataclass(frozen=True)
class StepAsk:
    """A step's request; None takes the default."""

    nodes: int | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    gpus_per_task: int | None = None
    cpus_per_task: int | None = None
    exact: bool = False
    overlap: bool = False


@dataclass(frozen=True)
class Task:
    """One task: its global id (SLURM_PROCID), its id on its node (SLURM_LOCALID) and
    the GPUs it sees."""

    task_id: int
    local_id: int
    gpus: tuple[str, ...]


@dataclass(frozen=True)
class NodePart:
    """The step on one node: the node's index in the step, its tasks, and what the step
    holds there."""

    name: str
    index: int
    tasks: tuple[Task, ...]
    gpus: tuple[str, ...]
    cpus: int


@dataclass(frozen=True)
class StepLayout:
    """Where the tasks run, node by node in the step's order."""

    parts: tuple[NodePart, ...]
    ntasks: int
    holds: Mapping[str, Held] = field(default_factory=dict)

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(part.name for part in self.parts)

    @property
    def tasks_per_node(self) -> tuple[int, ...]:
        return tuple(len(part.tasks) for part in self.parts)

    def by_node(self) -> dict[str, list[int]]:
        """{node: [task ids]}, as the step's row keeps it."""
        return {part.name: [task.task_id for task in part.tasks] for part in self.parts}


def counts(ask: StepAsk, job_nodes: int) -> tuple[int, list[int]]:
    """How many nodes the step uses and how many tasks each runs, before it is placed;
    a request the job can never meet is a StepLayoutError."""
    nodes, ntasks, per_node = ask.nodes, ask.ntasks, ask.ntasks_per_node
    if job_nodes < 1:
        raise StepLayoutError("the job holds no nodes")
    if nodes is not None and nodes > job_nodes:
        raise StepLayoutError(f"--nodes {nodes}: the job has {_plural(job_nodes, 'node')}")
    if per_node is not None:
        if nodes is None:
            nodes = job_nodes if ntasks is None else -(-ntasks // per_node)
        if ntasks is None:
            ntasks = nodes * per_node
    elif nodes is None:
        nodes = job_nodes if ntasks is None else min(ntasks, job_nodes)
    if ntasks is None:
        ntasks = nodes
    if nodes > job_nodes:
        raise StepLayoutError(f"{ntasks} tasks at {per_node} per node need {nodes} nodes; "
                              f"the job has {job_nodes}")
    if ntasks < nodes:
        raise StepLayoutError(f"--ntasks {ntasks} is fewer than --nodes {nodes}")
    if ntasks > MAX_TASKS_PER_STEP:
        raise StepLayoutError(f"--ntasks {ntasks}: at most {MAX_TASKS_PER_STEP} tasks")
    if per_node is not None:
        if ntasks > nodes * per_node:
            raise StepLayoutError(f"--ntasks {ntasks} with --ntasks-per-node {per_node} needs "
                                  f"more than --nodes {nodes}")
        sizes = []
        left = ntasks
        for _ in range(nodes):
            sizes.append(min(per_node, left))
            left -= sizes[-1]
        if sizes[-1] == 0:
            raise StepLayoutError(f"--ntasks {ntasks} with --ntasks-per-node {per_node} leaves "
                                  f"a node of --nodes {nodes} without a task")
        return nodes, sizes
    base, extra = divmod(ntasks, nodes)
    return nodes, [base + (1 if i < extra else 0) for i in range(nodes)]


def layout(job_nodes: Sequence[JobNode], ask: StepAsk,
           held: Mapping[str, Held] | None = None) -> StepLayout:
    """Place a step on its job's nodes; StepLayoutError if the job can never run it,
    StepBusy if it must wait for running steps to end."""
    nodes, sizes = counts(ask, len(job_nodes))
    alone = _place(job_nodes, ask, sizes, {})
    if alone is None:
        raise StepLayoutError(_why_not(job_nodes, ask, sizes))
    chosen = alone
    if not ask.overlap and held:
        placed = _place(job_nodes, ask, sizes, held)
        if placed is None:
            raise StepBusy("the job's resources are held by its running steps")
        chosen = placed
    holds = {part.name: Held(frozenset(part.gpus), part.cpus) for part in chosen}
    return StepLayout(tuple(chosen), sum(sizes), holds)


def _place(job_nodes: Sequence[JobNode], ask: StepAsk, sizes: list[int],
           held: Mapping[str, Held]) -> list[NodePart] | None:
    """The first nodes in the job's order with room for the next block of tasks."""
    chosen: list[NodePart] = []
    next_task = 0
    for node in job_nodes:
        size = sizes[len(chosen)]
        part = _place_on(node, ask, size, held.get(node.name, Held()), len(chosen), next_task)
        if part is None:
            continue
        chosen.append(part)
        next_task += size
        if len(chosen) == len(sizes):
            return chosen
    return None


def _why_not(job_nodes: Sequence[JobNode], ask: StepAsk, sizes: list[int]) -> str:
    """One line: what the step needs that the job does not hold."""
    biggest, ntasks = max(sizes), sum(sizes)
    if ask.gpus_per_task and any(len(node.gpus) < biggest * ask.gpus_per_task
                                 for node in job_nodes):
        return (f"{ntasks} tasks with --gpus-per-task {ask.gpus_per_task} need "
                f"{biggest * ask.gpus_per_task} GPUs on a node for {biggest} tasks; the job "
                f"has {_per_node(job_nodes, lambda node: len(node.gpus), 'GPU')}")
    cpus = _cpus_per_task(ask)
    return (f"{ntasks} tasks of {_plural(cpus, 'CPU')} need {biggest * cpus} CPUs on a node "
            f"for {biggest} tasks; the job holds "
            f"{_per_node(job_nodes, lambda node: node.cpus, 'CPU')}")


def _place_on(node: JobNode, ask: StepAsk, size: int, held: Held, index: int,
              first_task: int) -> NodePart | None:
    """The step's part on ``node`` with ``size`` tasks, or None if running steps leave
    no room there."""
    free_gpus = [gpu for gpu in node.gpus if gpu not in held.gpus]
    if ask.gpus_per_task:
        need = size * ask.gpus_per_task
        if len(free_gpus) < need:
            return None
        gpus = tuple(free_gpus[:need])
        g = ask.gpus_per_task
        tasks = tuple(Task(first_task + i, i, gpus[i * g:(i + 1) * g]) for i in range(size))
    else:
        if len(free_gpus) < len(node.gpus):
            return None  # the step would see GPUs another step holds
        gpus = node.gpus
        tasks = tuple(Task(first_task + i, i, gpus) for i in range(size))
    cpus = 0
    if node.cpus:
        cpus = size * _cpus_per_task(ask) if ask.exact else node.cpus
        if cpus > node.cpus - held.cpus:
            return None
    return NodePart(node.name, index, tasks, gpus, cpus)


def _cpus_per_task(ask: StepAsk) -> int:
    return ask.cpus_per_task or 1


def master_port(job_id: int, step_id: int) -> int:
    """The rendezvous port a step's tasks get as MASTER_PORT (unless set already)."""
    return MASTER_PORT_BASE + (job_id * 31 + step_id) % MASTER_PORT_SPAN


def tasks_per_node_text(sizes: Sequence[int]) -> str:
    """Slurm's compressed count list: ``[3, 3, 3, 1]`` -> ``3(x3),1``."""
    out: list[str] = []
    i = 0
    while i < len(sizes):
        j = i
        while j < len(sizes) and sizes[j] == sizes[i]:
            j += 1
        out.append(str(sizes[i]) if j - i == 1 else f"{sizes[i]}(x{j - i})")
        i = j
    return ",".join(out)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _per_node(job_nodes: Sequence[JobNode], amount: Callable[[JobNode], int],
              noun: str) -> str:
    """``node1: 4 GPUs, node2: 4 GPUs`` (the first 8 nodes)."""
    shown = ", ".join(f"{node.name}: {_plural(amount(node), noun)}" for node in job_nodes[:8])
    return shown + (", ..." if len(job_nodes) > 8 else "")
