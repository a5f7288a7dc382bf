"""SQLAlchemy 2 models: the schema of record (with gpusched.db.accountmodels: accounts,
users, QOS, licenses, billing and usage). Changes go through Alembic migrations."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship

from gpusched.core.mail import MAIL_TYPES, MAX_MAIL_USER
from gpusched.core.topology import LINK_KINDS
from gpusched.db.accountmodels import Account as Account
from gpusched.db.accountmodels import AccountUser as AccountUser
from gpusched.db.accountmodels import FairShareUsage as FairShareUsage
from gpusched.db.accountmodels import GpuBilling as GpuBilling
from gpusched.db.accountmodels import License as License
from gpusched.db.accountmodels import Qos as Qos
from gpusched.db.controlmodels import MAIL_STATES as MAIL_STATES
from gpusched.db.controlmodels import Leader as Leader
from gpusched.db.controlmodels import MailEvent as MailEvent
from gpusched.db.controlmodels import UserSubmitLock as UserSubmitLock
from gpusched.db.modelbase import NAMING as NAMING
from gpusched.db.modelbase import Base as Base
from gpusched.db.modelbase import idle_checks
from gpusched.db.modelbase import in_values as _in
from gpusched.db.reservations import AdvanceReservationRow as AdvanceReservationRow

JOB_STATES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
              "OUT_OF_MEMORY", "DEADLINE")
GRES_FLAGS = ("enforce-binding", "disable-binding")
NODE_COMMAND_KINDS = ("launch", "cancel", "signal", "limit", "kill", "step", "step_cancel",
                      "mig", "notice", "suspend")
STEP_STATES = ("RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY",
               "NODE_FAIL")
NODE_STATES = ("UP", "DOWN", "DRAIN")
CONTAINER_RUNTIMES = ("podman", "enroot", "apptainer")  # gpusched.messages.containers
SHARE_MODES = ("mps", "shard")  # how a GPU may be shared between jobs (None: it is not)
MAX_SHARES = 10_000  # units one shared GPU may offer
# Seconds a dynamic-MIG partition keeps between two layout changes of one GPU.
MIN_MIG_INTERVAL, MAX_MIG_INTERVAL = 60, 7 * 86_400
PARTITION_STATES = ("UP", "DOWN", "DRAIN", "INACTIVE")
class Partition(Base):
    """A named set of nodes jobs are submitted to, with its time limits."""

    __tablename__ = "partitions"
    __table_args__ = (
        CheckConstraint(_in("state", PARTITION_STATES), name="state"),
        CheckConstraint(_in("sharing", SHARE_MODES), name="sharing"),
        CheckConstraint(f"shares BETWEEN 1 AND {MAX_SHARES}", name="shares"),
        CheckConstraint(f"mig_min_interval BETWEEN {MIN_MIG_INTERVAL} AND {MAX_MIG_INTERVAL}",
                        name="mig_min_interval"),
        *idle_checks(),
    )

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    nodes: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{*}'"))
    is_default: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    max_time: Mapped[int | None] = mapped_column(Integer)
    default_time: Mapped[int | None] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(Text, server_default=text("'UP'"))
    priority_tier: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    allow_accounts: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    deny_accounts: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    max_gpus_per_job: Mapped[int | None] = mapped_column(Integer)
    # Whether its jobs go back to the queue when their GPU fails (a job may say otherwise).
    requeue: Mapped[bool] = mapped_column(Boolean, server_default=text("true"))
    # How its GPUs may be shared between jobs ("mps" or "shard"; None: whole GPUs only)
    # and the units each shared GPU offers (set exactly when ``sharing`` is).
    sharing: Mapped[str | None] = mapped_column(Text)
    shares: Mapped[int | None] = mapped_column(Integer)
    # Whether the scheduler may re-partition its nodes' idle MIG GPUs, and the seconds it
    # keeps between two layout changes of one GPU.
    dynamic_mig: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    mig_min_interval: Mapped[int] = mapped_column(Integer, server_default=text("600"))
    idle_warn_after: Mapped[int | None] = mapped_column(Integer)  # idle-GPU policy
    idle_action: Mapped[str | None] = mapped_column(Text)
    idle_action_after: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


class Node(Base):
    """A compute node, as registered by its agent."""

    __tablename__ = "nodes"
    __table_args__ = (CheckConstraint(_in("state", NODE_STATES), name="state"),
                      CheckConstraint(_in("container_runtime", CONTAINER_RUNTIMES),
                                      name="container_runtime"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text, unique=True)
    state: Mapped[str] = mapped_column(Text, server_default=text("'DOWN'"))
    reason: Mapped[str | None] = mapped_column(Text)
    run_uid: Mapped[int | None] = mapped_column(Integer)
    cpus: Mapped[int] = mapped_column(Integer, server_default=text("0"))  # 0: not counted
    memory_mb: Mapped[int] = mapped_column(Integer, server_default=text("0"))  # 0: not counted
    block: Mapped[str | None] = mapped_column(Text)  # topology block (switch, rack)
    registered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_seen: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # When the controller gave up on the node (silent for node_timeout) and ended its
    # jobs: until its agent registers again, reporting what it still runs so that runs
    # ended meanwhile are killed, it gets no work.
    lost_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Whether its agent confines jobs in cgroups, and how (or why it cannot).
    enforced: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    enforcement: Mapped[str | None] = mapped_column(Text)
    # "health" while drained by its health check (a passing check lifts it); else None.
    drained_by: Mapped[str | None] = mapped_column(Text)
    # Where other nodes and clients reach it (MASTER_ADDR of a step); None: its name.
    address: Mapped[str | None] = mapped_column(Text)
    # The container runtime its agent registered (podman, enroot, apptainer); None: none.
    container_runtime: Mapped[str | None] = mapped_column(Text)
    # The features its agent reports from its GPUs (gpusched.core.features.gpu_features).
    features: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))


class NodeFeatures(Base):
    """The features the admin configuration gives a node, by name (``[[node]]``)."""

    __tablename__ = "node_features"

    node: Mapped[str] = mapped_column(Text, primary_key=True)
    features: Mapped[list[str]] = mapped_column(ARRAY(Text))


class Gpu(Base):
    """A GPU, or a MIG slice of one (``parent_id`` set), on a node."""

    __tablename__ = "gpus"
    __table_args__ = (Index(None, "node_id", "index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(Text, unique=True)
    name: Mapped[str] = mapped_column(Text, server_default=text("''"))
    gpu_type: Mapped[str | None] = mapped_column(Text)
    mig_profile: Mapped[str | None] = mapped_column(Text)
    memory_mb: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    pci_bus_id: Mapped[str] = mapped_column(Text, server_default=text("''"))
    healthy: Mapped[bool] = mapped_column(Boolean, server_default=text("true"))
    present: Mapped[bool] = mapped_column(Boolean, server_default=text("true"))
    health_reason: Mapped[str | None] = mapped_column(Text)  # why it is out of service
    unhealthy_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The last sample its agent sent: utilisation %, memory used, Celsius, milliwatts.
    util: Mapped[int | None] = mapped_column(Integer)
    mem_used_mb: Mapped[int | None] = mapped_column(Integer)
    temperature: Mapped[int | None] = mapped_column(Integer)
    power_mw: Mapped[int | None] = mapped_column(Integer)
    sampled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # When its MIG layout last changed, as its agent's registration showed (dynamic MIG).
    mig_changed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class GpuLink(Base):
    """How two GPUs of one node are connected (NVLink, else their PCIe common ancestor)."""

    __tablename__ = "gpu_links"
    __table_args__ = (
        CheckConstraint(_in("kind", LINK_KINDS), name="kind"),
        CheckConstraint("gpu_a < gpu_b", name="ordered"),
    )

    gpu_a: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"), primary_key=True)
    gpu_b: Mapped[int] = mapped_column(ForeignKey("gpus.id", ondelete="CASCADE"), primary_key=True)
    kind: Mapped[str] = mapped_column(Text)
    nvlinks: Mapped[int] = mapped_column(Integer, server_default=text("0"))


class JobScript(Base):
    """What a job runs: its batch script, the script's arguments and the environment it
    starts with. One per submission; the tasks of an array share it."""

    __tablename__ = "job_scripts"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    script: Mapped[str] = mapped_column(Text)
    args: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    environment: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'"))


class Job(Base):
    """A batch job: its request, its state and its outcome."""

    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(_in("state", JOB_STATES), name="state"),
        CheckConstraint("gpus >= 0", name="gpus"),
        CheckConstraint("hold IN ('user', 'admin')", name="hold"),
        CheckConstraint("nodes >= 1", name="nodes"),
        CheckConstraint("umask BETWEEN 0 AND 511", name="umask"),
        CheckConstraint(_in("gres_flags", GRES_FLAGS), name="gres_flags"),
        CheckConstraint(_in("share_mode", SHARE_MODES), name="share_mode"),
        CheckConstraint("share_units > 0", name="share_units"),
        CheckConstraint("gpu_mem_mb > 0", name="gpu_mem_mb"),
        CheckConstraint("idle_action IN ('requeue', 'cancel')", name="idle_action"),
        Index(
            "ix_jobs_active", "state", "submit_time",
            postgresql_where=text("state IN ('PENDING', 'RUNNING')"),
        ),
        Index("ix_jobs_array_job_id", "array_job_id",
              postgresql_where=text("array_job_id IS NOT NULL")),
        # A client's key for one submission: sent again after a lost answer or a
        # controller's failover, it finds the job already made instead of a second one.
        Index("ix_jobs_submit_key", "uid", "submit_key", unique=True,
              postgresql_where=text("submit_key IS NOT NULL")),
        Index("ix_jobs_interactive_active", "state",
              postgresql_where=text("interactive AND state IN ('PENDING', 'RUNNING')")),
        CheckConstraint(f"mail_types <@ ARRAY[{', '.join(map(repr, MAIL_TYPES))}]",
                        name="mail_types"),
        CheckConstraint(f"char_length(mail_user) <= {MAX_MAIL_USER}", name="mail_user"),
        CheckConstraint("char_length(reservation) <= 64", name="reservation"),
        Index("ix_jobs_reservation", "reservation", postgresql_where=text(
            "reservation IS NOT NULL AND state IN ('PENDING', 'RUNNING')")),
        # The jobs whose mail events the mail job still watches (gpusched.db.mail).
        # Deleting a script looks for jobs naming it; retention finds finished jobs by age.
        Index("ix_jobs_script_id", "script_id"),
        Index("ix_jobs_finished_end_time", "end_time",
              postgresql_where=text("state NOT IN ('PENDING', 'RUNNING')")),
        Index("ix_jobs_mail_watch", "id",
              postgresql_where=text("mail_types IS NOT NULL AND mail_done_at IS NULL")),
        CheckConstraint("char_length(licenses) <= 4096", name="licenses"),
        CheckConstraint("nice BETWEEN -2147483645 AND 2147483645", name="nice"),
        CheckConstraint("open_mode IN ('append', 'truncate')", name="open_mode"),
        CheckConstraint("time_min >= 0", name="time_min"),
        CheckConstraint("octet_length(container::text) <= 1048576", name="container"),
        CheckConstraint("suspended_seconds >= 0", name="suspended_seconds"),
        CheckConstraint("char_length(constraints) <= 1024", name="constraints"),
        # The pending jobs with a -C, which every pass's snapshot reads.
        Index("ix_jobs_constrained", "id", postgresql_where=text(
            "constraints IS NOT NULL AND state = 'PENDING'")),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    uid: Mapped[int] = mapped_column(Integer)
    gid: Mapped[int] = mapped_column(Integer)
    user_name: Mapped[str] = mapped_column(Text)
    partition: Mapped[str] = mapped_column(ForeignKey("partitions.name"))
    account: Mapped[str | None] = mapped_column(Text)
    qos: Mapped[str | None] = mapped_column(Text)
    hold: Mapped[str | None] = mapped_column(Text)  # None, 'user' or 'admin'
    begin_time: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    dependency: Mapped[str | None] = mapped_column(Text)
    state: Mapped[str] = mapped_column(Text, server_default=text("'PENDING'"))
    reason: Mapped[str] = mapped_column(Text, server_default=text("'None'"))
    gpus: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    time_limit: Mapped[int | None] = mapped_column(Integer)
    submit_time: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    start_time: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    end_time: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    exit_code: Mapped[int | None] = mapped_column(Integer)
    signal: Mapped[int | None] = mapped_column(Integer)
    error_message: Mapped[str | None] = mapped_column(Text)
    # What the job runs (script, arguments, environment), kept apart from the row: the
    # pass and the queue read every pending row, and only a launch reads these. The
    # tasks of an array share their record's.
    script_id: Mapped[int] = mapped_column(ForeignKey("job_scripts.id"))
    payload: Mapped[JobScript] = relationship(lazy="select")
    work_dir: Mapped[str] = mapped_column(Text)
    output: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    umask: Mapped[int | None] = mapped_column(Integer)  # the submitter's; None: 0022
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id"))
    launched_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # An array is one PENDING record (id == array_job_id, array_tasks = the task ids still
    # pending); each task that starts is split off into a row of its own, and the last
    # one to start is the record itself. array_spec is the whole set, for the job's
    # environment.
    array_job_id: Mapped[int | None] = mapped_column(BigInteger)
    array_task_id: Mapped[int | None] = mapped_column(Integer)
    array_tasks: Mapped[str | None] = mapped_column(Text)
    array_spec: Mapped[str | None] = mapped_column(Text)
    array_max_running: Mapped[int | None] = mapped_column(Integer)
    # The shape: ``gpus`` in all over ``nodes`` nodes (the same number on each), of one of
    # ``gpu_types`` (types or MIG profiles; empty: any whole GPU), with ``cpus`` and
    # ``mem_mb`` on each node (0: not counted).
    gpu_types: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    nodes: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    cpus: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    mem_mb: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # sbatch's --nodelist (runs on exactly these nodes) and --exclude (never on these).
    nodelist: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    exclude_nodes: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    exclusive: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))  # --exclusive
    # sbatch's --signal: send warn_signal warn_seconds before the time limit, to the batch
    # script alone when warn_batch_only, else to the whole job.
    warn_signal: Mapped[int | None] = mapped_column(Integer)
    warn_seconds: Mapped[int | None] = mapped_column(Integer)
    warn_batch_only: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    # A priority an administrator fixed (gcontrol update job Priority=); None: computed.
    admin_priority: Mapped[float | None] = mapped_column(Float)
    start_kind: Mapped[str | None] = mapped_column(Text)  # immediate or backfilled
    expected_start: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    node_names: Mapped[list[str] | None] = mapped_column(ARRAY(Text))  # every node it runs on
    restarts: Mapped[int] = mapped_column(Integer, server_default=text("0"))  # times requeued
    submit_key: Mapped[str | None] = mapped_column(Text)  # see ix_jobs_submit_key
    # Set while a running job is being stopped to make way for job ``preempted_by``.
    preempted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    preempt_mode: Mapped[str | None] = mapped_column(Text)  # requeue or cancel
    preempted_by: Mapped[int | None] = mapped_column(BigInteger)
    # Whether it goes back to the queue when its GPU fails; None: its partition's default.
    requeue: Mapped[bool | None] = mapped_column(Boolean)
    gpu_failure: Mapped[str | None] = mapped_column(Text)  # set while stopping for a failed GPU
    # GPU utilisation while it ran, one sample per agent sample: the mean over its GPUs
    # of utilisation (%) and memory used (MiB) summed, and the peaks of any one GPU.
    util_samples: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    util_sum: Mapped[float] = mapped_column(Float, server_default=text("0"))
    mem_sum_mb: Mapped[float] = mapped_column(Float, server_default=text("0"))
    util_peak: Mapped[int | None] = mapped_column(Integer)
    mem_peak_mb: Mapped[int | None] = mapped_column(Integer)
    idle_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    idle: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))  # flagged idle
    # The idle-GPU policy: when the current run was warned, and what it did and why.
    idle_warned_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    idle_action: Mapped[str | None] = mapped_column(Text)  # requeue or cancel
    idle_action_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    idle_reason: Mapped[str | None] = mapped_column(Text)
    # What the cgroup of its last run measured: peak memory and CPU time (None: not).
    max_rss_bytes: Mapped[int | None] = mapped_column(BigInteger)
    cpu_usec: Mapped[int | None] = mapped_column(BigInteger)
    gres_flags: Mapped[str | None] = mapped_column(Text)  # sbatch --gres-flags
    # An allocation (galloc, gsrun outside a job): its start launches nothing; its client
    # runs steps on it, says it is alive (client_seen) and ends it.
    interactive: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    client_seen: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A share of one GPU (--gres=mps:N, --gres=shard:N): ``share_units`` units of a GPU
    # its partition shares by ``share_mode`` (``gpus`` is then 1); ``gpu_mem_mb``
    # (--gpu-mem): the GPU memory it needs. None: whole GPUs, any memory.
    share_mode: Mapped[str | None] = mapped_column(Text)
    share_units: Mapped[int | None] = mapped_column(Integer)
    gpu_mem_mb: Mapped[int | None] = mapped_column(Integer)
    # sbatch's --mail-type (gpusched.core.mail, ALL expanded; None: no mail) and
    # --mail-user (the submitting user by default); when the mail job has recorded every
    # event it will ever send for the job (an array's: its record's, for all tasks).
    mail_types: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    mail_user: Mapped[str | None] = mapped_column(Text)
    mail_done_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # -L: the licenses it asks for, canonical (gpusched.core.licenses); None: none.
    licenses: Mapped[str | None] = mapped_column(Text)
    # sbatch's --nice (None: 0), --open-mode (None: append), --time-min (seconds: the
    # least time limit backfill may cut it to) and --deadline (migration 0030).
    nice: Mapped[int | None] = mapped_column(Integer)
    open_mode: Mapped[str | None] = mapped_column(Text)
    time_min: Mapped[int | None] = mapped_column(Integer)
    deadline: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # --reservation: the advance reservation it runs in (db/reservations.py); None: none.
    reservation: Mapped[str | None] = mapped_column(Text)
    # --container-image and pyxis's other options (gpusched.messages.containers); None: none.
    container: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # gcontrol suspend: since when the running job is suspended (None: it is not), and
    # the seconds its current run was suspended before (not counted as run time).
    suspended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    suspended_seconds: Mapped[float] = mapped_column(Float, server_default=text("0"))
    # gcontrol top: ahead of the owner's other pending jobs, higher first; None: not moved.
    top_rank: Mapped[int | None] = mapped_column(BigInteger)
    # -C/--constraint, canonical (gpusched.core.features); None: none.
    constraints: Mapped[str | None] = mapped_column(Text)


class Allocation(Base):
    """A GPU held by a job, whole (``units`` None) or a share of it. The partial unique
    index makes double allocation of a whole GPU impossible."""

    __tablename__ = "allocations"
    __table_args__ = (
        Index(
            "uq_allocations_active_gpu", "gpu_id", unique=True,
            postgresql_where=text("released_at IS NULL AND units IS NULL"),
        ),
        Index("ix_allocations_released_at", "released_at"),  # a budget period's usage
    )

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id"), primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"))
    allocated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(),
                                                   primary_key=True)
    released_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A share: the units of the GPU held and the GPU memory granted (None: no limit).
    units: Mapped[int | None] = mapped_column(Integer)
    mem_mb: Mapped[int | None] = mapped_column(Integer)


class JobStep(Base):
    """A step of a job: tasks ``gsrun`` started on some of the job's nodes. ``layout`` is
    {node: [task ids]}; ``gpus`` and ``cpus`` what it holds on each node, which other
    steps of the job do not get unless one of them ``overlap``s. It ends once every node
    of it has reported (``nodes_ended``)."""

    __tablename__ = "job_steps"
    __table_args__ = (
        CheckConstraint(_in("state", STEP_STATES), name="state"),
        CheckConstraint("step_id >= 0", name="step_id"),
        CheckConstraint("ntasks > 0", name="ntasks"),
        Index("ix_job_steps_running", "job_id", postgresql_where=text("state = 'RUNNING'")),
    )

    job_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("jobs.id", ondelete="CASCADE"),
                                        primary_key=True)
    step_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    name: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(Text, server_default=text("'RUNNING'"))
    uid: Mapped[int] = mapped_column(Integer)
    node_names: Mapped[list[str]] = mapped_column(ARRAY(Text))
    layout: Mapped[dict[str, Any]] = mapped_column(JSONB)
    ntasks: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'"))
    cpus: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'"))
    overlap: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    cancelled: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    bad_exit: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    start_time: Mapped[datetime] = mapped_column(DateTime(timezone=True),
                                                 server_default=func.now())
    end_time: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    exit_code: Mapped[int | None] = mapped_column(Integer)
    signal: Mapped[int | None] = mapped_column(Integer)
    max_rss_bytes: Mapped[int | None] = mapped_column(BigInteger)
    cpu_usec: Mapped[int | None] = mapped_column(BigInteger)
    nodes_ended: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    # Each reporting node's outcome (StepEnd.outcome), in the order of nodes_ended.
    outcomes: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    error: Mapped[str | None] = mapped_column(Text)


class NodeCommand(Base):
    """Work for one node's agent: launch, cancel, signal, a new time limit, or kill a
    run the controller has ended. Stamped with the job's run (its ``restarts`` when the
    command was made), so nothing meant for an earlier run reaches a later one, and with
    the leader epoch that made it. Claimed by the agent with ``FOR UPDATE SKIP LOCKED``
    and done once the agent says so."""

    __tablename__ = "node_commands"
    __table_args__ = (
        CheckConstraint(_in("kind", NODE_COMMAND_KINDS), name="kind"),
        CheckConstraint("run >= 0", name="run"),
        Index("ix_node_commands_open", "node_id", "id", postgresql_where=text("done_at IS NULL")),
        Index("ix_node_commands_mig", "created_at", postgresql_where=text("kind = 'mig'")),
        Index("ix_node_commands_job_id", "job_id"),  # its foreign key cascades from jobs
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    run: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    kind: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'"))
    epoch: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    done_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
