"""The scheduling model: what a pass sees (Snapshot) and what it decides (Plan).

Everything here is plain immutable data. Times are POSIX seconds passed in by the
caller; nothing in ``gpusched.core`` reads a clock, a database or the environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from gpusched.core.budgets import Budget
from gpusched.core.fairshare import Account, UserShare
from gpusched.core.priority import PriorityWeights
from gpusched.core.reservations import AdvanceReservation


class JobState(StrEnum):
    """Job states, with Slurm's names."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"  # its node died under it (and it was not requeued)
    OUT_OF_MEMORY = "OUT_OF_MEMORY"  # the kernel's OOM killer ended it (its memory limit)
    DEADLINE = "DEADLINE"  # pending past its --deadline: it could no longer end by then
    SUSPENDED = "SUSPENDED"  # a running job stopped by gcontrol suspend (stored RUNNING)

    @property
    def short(self) -> str:
        """The two-letter code squeue prints in its ST column."""
        return _SHORT[self]

    @property
    def terminal(self) -> bool:
        """True once the job has ended and holds no resources."""
        return self not in (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED)


_SHORT = {
    JobState.PENDING: "PD",
    JobState.RUNNING: "R",
    JobState.COMPLETED: "CD",
    JobState.FAILED: "F",
    JobState.CANCELLED: "CA",
    JobState.TIMEOUT: "TO",
    JobState.NODE_FAIL: "NF",
    JobState.DEADLINE: "DL",
    JobState.OUT_OF_MEMORY: "OOM",
    JobState.SUSPENDED: "S",
}


class NodeState(StrEnum):
    """Node states as the scheduler sees them."""

    UP = "UP"
    DOWN = "DOWN"
    DRAIN = "DRAIN"


class Reason(StrEnum):
    """Why a job is pending, with Slurm's words."""

    NONE = "None"
    RESOURCES = "Resources"
    PRIORITY = "Priority"
    PARTITION_DOWN = "PartitionDown"
    QOS_MAX_GPUS_PER_USER = "QOSMaxGPUPerUserLimit"
    QOS_MAX_JOBS_PER_USER = "QOSMaxJobsPerUserLimit"
    QOS_GRP_GPUS = "QOSGrpGPULimit"
    # A GPU-hour budget of its account (or of its user there) has too little left.
    ASSOC_GRP_GRES_MINUTES = "AssocGrpGRESMinutes"
    JOB_HELD_USER = "JobHeldUser"
    JOB_HELD_ADMIN = "JobHeldAdmin"
    BEGIN_TIME = "BeginTime"
    DEPENDENCY = "Dependency"
    DEPENDENCY_NEVER_SATISFIED = "DependencyNeverSatisfied"
    JOB_ARRAY_TASK_LIMIT = "JobArrayTaskLimit"
    PARTITION_TIME_LIMIT = "PartitionTimeLimit"
    PARTITION_CONFIG = "PartitionConfig"
    ACCOUNT_NOT_ALLOWED = "AccountNotAllowed"
    LICENSES = "Licenses"  # the licenses it asks for (-L) are not free (core/licenses.py)
    DEADLINE = "DeadLine"  # it can no longer end by its --deadline (core/timecut.py)
    BAD_CONSTRAINTS = "BadConstraints"  # no node set could satisfy its -C (core/features.py)
    RESERVATION = "Reservation"  # waits for its advance reservation (core/resvpass.py)
    REQ_NODE_NOT_AVAIL = "ReqNodeNotAvail"  # room now, but it would run into a reservation


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU, or one MIG slice of a GPU, on a node.

    ``gpu_type`` is the normalised type (``a100-80gb``, ``h100-80gb``, ``l4``; ``gpu``
    when unknown). A MIG slice has its ``mig_profile`` (``1g.10gb``) and the index of
    its ``parent`` GPU; a GPU in MIG mode (``mig_mode``) is never handed out whole.
    """

    uuid: str
    index: int
    healthy: bool = True
    gpu_type: str = "gpu"
    mig_profile: str | None = None
    parent: int | None = None
    mig_mode: bool = False
    # How the GPU may be shared between jobs: None (whole GPUs only), "mps" or "shard";
    # when shared it offers ``shares`` units (its partitions' setting: an MPS count of
    # 100 makes a unit one percent). ``memory_mb``: its memory (0: not known).
    sharing: str | None = None
    shares: int = 0
    memory_mb: int = 0

    @property
    def kind(self) -> str:
        """What a request names to get this unit: its MIG profile, else its GPU type."""
        return self.mig_profile or self.gpu_type


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node: its state, its GPUs, and whose jobs its agent may run.

    ``run_uid`` is None when the agent runs as root (any user's jobs), else the one
    uid whose jobs it can run.
    """

    name: str
    state: NodeState
    gpus: tuple[GpuView, ...]
    run_uid: int | None = None
    cpus: int = 0  # 0: CPUs are not counted on this node
    memory_mb: int = 0  # 0: memory is not counted on this node
    block: str | None = None  # topology block (a switch, a rack) for multi-node jobs
    # How well two GPUs (by index, lower first) are connected: higher is better
    # (gpusched.core.topology). Pairs not listed are the worst link.
    links: Mapping[tuple[int, int], int] = field(default_factory=dict)
    features: frozenset[str] = frozenset()  # its admin's and its GPUs' (core/features.py)


@dataclass(frozen=True, slots=True)
class PartitionView:
    """A partition: a named, ordered set of nodes."""

    name: str
    nodes: tuple[str, ...]
    up: bool = True
    tier: int = 0
    max_time: int | None = None  # seconds; None: no limit
    allow_accounts: frozenset[str] | None = None  # None: every account
    deny_accounts: frozenset[str] = frozenset()
    max_gpus_per_job: int | None = None
    sharing: str | None = None  # how its GPUs may be shared: None, "mps" or "shard"
    shares: int = 0  # units each GPU offers when shared


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A job waiting to be placed."""

    job_id: int
    partition: str
    gpus: int
    uid: int
    submit_time: float
    time_limit: int | None = None
    reason: Reason = Reason.NONE
    user: str = ""
    account: str | None = None
    qos: str | None = None
    hold: str | None = None  # "user" or "admin"
    begin_time: float | None = None
    dependency: str | None = None  # sbatch's --dependency text, validated at submit
    name: str = ""
    array_job_id: int | None = None
    array_tasks: str | None = None  # an array's pending task ids (canonical text)
    array_max_running: int | None = None
    # The shape: ``gpus`` of one of ``gpu_kinds`` (any whole GPU when empty), ``cpus``
    # and ``mem_mb`` on each of ``nodes`` nodes.
    gpu_kinds: tuple[str, ...] = ()
    nodes: int = 1
    cpus: int = 0
    mem_mb: int = 0
    expected_start: float | None = None  # as the last pass left it
    # sbatch's --nodelist (it runs on exactly these nodes) and --exclude (never on these).
    nodelist: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    priority: float | None = None  # fixed by an administrator; None: multifactor
    exclusive: bool = False  # sbatch --exclusive: whole nodes, shared with no other job
    # A share of one GPU instead of whole GPUs (``gpus`` is then 1): ``share`` units of a
    # GPU shared by ``share_mode`` ("mps" or "shard"; --gres=mps:N, --gres=shard:N).
    # ``gpu_mem_mb`` (--gpu-mem): GPU memory it needs; without a share mode it may get a
    # MIG slice, an MPS share or a whole GPU with that much memory.
    share: int = 0
    share_mode: str | None = None
    gpu_mem_mb: int = 0
    licenses: tuple[tuple[str, int], ...] = ()  # -L: (name, count), sorted by name
    reservation: str | None = None  # --reservation: the advance reservation it runs in
    constraint: str | None = None  # -C/--constraint, canonical (core/features.py)
    top: int | None = None  # gcontrol top: ahead of its owner's other jobs, higher first
    nice: int = 0  # --nice: positive lowers its priority (core/ordering.py)
    time_min: int | None = None  # --time-min, seconds (core/timecut.py)
    deadline: float | None = None  # --deadline, epoch seconds

    @property
    def total_gpus(self) -> int:
        """GPUs over all of its nodes."""
        return self.gpus * self.nodes

    @property
    def eligible_time(self) -> float:
        """When the job could first run: age is counted from here."""
        return self.submit_time if self.begin_time is None else max(self.submit_time, self.begin_time)


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding GPUs on a node."""

    job_id: int
    node: str
    gpu_uuids: tuple[str, ...]
    user: str = ""
    account: str | None = None
    qos: str | None = None
    array_job_id: int | None = None
    end_time: float | None = None  # when its time limit ends it; None: no limit
    cpus: int = 0  # per node
    mem_mb: int = 0  # per node
    nodes: tuple[str, ...] = ()  # every node of a multi-node job (else just ``node``)
    start_time: float | None = None
    preempting: bool = False  # already told to make way for a preempting job
    exclusive: bool = False  # holds its nodes whole until it ends
    # Shares of GPUs it holds, as (GPU UUID, units, GPU memory MB); those GPUs are not
    # in ``gpu_uuids``, which lists the GPUs it holds whole.
    shares: tuple[tuple[str, int, int], ...] = ()
    licenses: tuple[tuple[str, int], ...] = ()  # -L: what it holds until it ends
    reservation: str | None = None  # the advance reservation it runs in


@dataclass(frozen=True, slots=True)
class QosLimits:
    """Limits of one QOS; None means no limit."""

    max_gpus_per_user: int | None = None
    max_jobs_per_user: int | None = None
    grp_gpus: int | None = None  # GPUs all running jobs of one account may hold


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scheduling pass needs, loaded in bulk."""

    nodes: tuple[NodeView, ...]
    partitions: tuple[PartitionView, ...]
    pending: tuple[PendingJob, ...]
    running: tuple[RunningJob, ...] = ()
    accounts: tuple[Account, ...] = ()
    user_shares: tuple[UserShare, ...] = ()
    usage: Mapping[tuple[str, str], float] = field(default_factory=dict)
    qos_priority: Mapping[str, int] = field(default_factory=dict)
    qos_limits: Mapping[str, QosLimits] = field(default_factory=dict)
    # Jobs (by id) and array tasks (array id, task id) named by dependencies: their
    # states, and when they began (or ended without beginning), for after:ID+MIN.
    job_states: Mapping[int | tuple[int, int], JobState] = field(default_factory=dict)
    job_began: Mapping[int | tuple[int, int], float] = field(default_factory=dict)
    qos_preempt: Mapping[str, frozenset[str]] = field(default_factory=dict)  # QOS -> QOS it may preempt
    running_names: frozenset[tuple[str, str]] = frozenset()  # (user, job name) of running jobs
    budgets: tuple[Budget, ...] = ()  # GPU-hour budgets, with what their periods used
    licenses: Mapping[str, int] = field(default_factory=dict)  # the cluster's, by name
    advance_reservations: tuple[AdvanceReservation, ...] = ()  # core/reservations.py


@dataclass(frozen=True, slots=True)
class Policy:
    """Tunable behaviour of a pass."""

    max_starts_per_pass: int = 10_000
    weights: PriorityWeights = field(default_factory=PriorityWeights)
    fairshare: str = "fair_tree"  # or "classic"
    backfill: str = "easy"  # "none" (strict priority order per partition), or "conservative"
    # Blocked jobs per partition that get a reservation: None for the mode's own
    # (none 0, easy 1, conservative all).
    reservations: int | None = None
    # At most this many jobs are examined after the reserved ones; the next pass goes
    # on from where this one stopped (Slurm's bf_continue). None: no limit.
    backfill_max_jobs: int | None = None
    # A job that cannot start may stop running jobs of a QOS its own QOS may preempt:
    # "requeue" them (back to the queue, keeping their submit time), "cancel" them, or
    # "off". They get ``preempt_grace`` seconds between the warning signal and the kill.
    preempt_mode: str = "requeue"
    preempt_grace: float = 30.0
    # Whether waiting jobs without a reservation get an expected start (gqueue --start);
    # a caller that only wants the starts (the simulator) turns it off.
    estimates: bool = True
    # How a job asking for a share of one GPU is placed (core/sharing.py): "bestfit" or
    # "fgd" (fragmentation-aware); and whether jobs of different users may share one
    # GPU by MPS (one MPS server then serves them all).
    packing: str = "bestfit"
    mps_multi_user: bool = False

    @property
    def reservation_depth(self) -> float:
        """How many blocked jobs of one partition get a reservation."""
        if self.reservations is not None:
            return self.reservations
        return {"none": 0, "easy": 1}.get(self.backfill, float("inf"))


PACKINGS = ("bestfit", "fgd")  # Policy.packing


class StartKind(StrEnum):
    """How a job came to start: in priority order, or backfilled past a blocked one."""

    IMMEDIATE = "immediate"
    BACKFILLED = "backfilled"


@dataclass(frozen=True, slots=True)
class Start:
    """Decision: start ``job_id`` on ``node`` with exactly ``gpu_uuids``.

    For an array's pending record, ``array_task_id`` names the task that starts. A
    multi-node job lists all of its ``nodes`` (``node`` is the first, where its batch
    script runs); ``gpu_uuids`` are then the GPUs of all of them.
    """

    job_id: int
    node: str
    gpu_uuids: tuple[str, ...]
    array_task_id: int | None = None
    kind: StartKind = StartKind.IMMEDIATE
    nodes: tuple[str, ...] = ()
    # A share start: (GPU UUID, units, GPU memory MB) of the shared GPU it gets (that GPU
    # is then its one entry in ``gpu_uuids`` too).
    shares: tuple[tuple[str, int, int], ...] = ()
    time_limit: int | None = None  # its limit cut down by --time-min (None: as it was)


@dataclass(frozen=True, slots=True)
class Reservation:
    """Decision: ``job_id`` is expected to start at ``start_time`` on ``nodes``; no job
    started now may delay that."""

    job_id: int
    start_time: float
    nodes: tuple[str, ...]


class Pending(NamedTuple):
    """Decision: ``job_id`` stays pending, for ``reason``; expected to start at
    ``expected_start`` (its reservation, else the earliest its resources are free after
    every reservation; None when that is not known). A NamedTuple: a pass makes one for
    nearly every job it examines."""

    job_id: int
    reason: Reason
    expected_start: float | None = None


@dataclass(frozen=True, slots=True)
class Preemption:
    """Decision: stop running ``job_id`` (``mode`` requeue or cancel) to make way for ``by``."""

    job_id: int
    by: int
    mode: str


@dataclass(frozen=True, slots=True)
class Plan:
    """The outcome of one pass: the decisions, in the order they were made."""

    starts: tuple[Start, ...] = field(default_factory=tuple)
    pending: tuple[Pending, ...] = field(default_factory=tuple)
    reservations: tuple[Reservation, ...] = field(default_factory=tuple)
    preemptions: tuple[Preemption, ...] = field(default_factory=tuple)
    resume_after: int | None = None  # the last job examined when the pass stopped early
