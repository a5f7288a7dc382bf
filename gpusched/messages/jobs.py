"""What a user sends about a job: the submission (``POST /v1/jobs``) and a change to it
(``POST /v1/jobs/{id}/update``), each parsed once, purely, into a frozen message.

What needs the database (the partition, account and QOS, whether named nodes and
dependency jobs exist, the site's limits) is ``gpusched.db.submit``'s part.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from gpusched.core import bounds
from gpusched.core.arrays import ArraySpec, parse_array
from gpusched.core.dependency import (
    Dependency,
    format_dependency,
)
from gpusched.core.licenses import (
    Licenses,
    format_licenses,
)
from gpusched.core.signals import WarnSignal
from gpusched.errors import UsageError
from gpusched.messages import jobparts as parts
from gpusched.messages.agent import GRES_FLAGS
from gpusched.messages.containers import ContainerRequest
from gpusched.messages.fields import (
    as_object,
    flag,
    integer,
    one_of,
    optional_integer,
    path,
    shown,
    text,
    typed,
)
from gpusched.messages.jobparts import MAX_GPU_MEM_MB, MAX_SHARE, SHARE_MODES
from gpusched.messages.reservations import reservation_name
from gpusched.messages.schedflags import FIELDS as SCHED_FIELDS
from gpusched.messages.schedflags import MAX_NICE, SchedFlags

__all__ = ["ALLOCATION_SCRIPT", "MAX_GPU_MEM_MB", "MAX_SHARE", "SHARE_MODES", "SUBMIT_FIELDS",
           "UNLIMITED", "UPDATE_FIELDS", "JobRequest", "JobUpdate", "parse_time_limit"]

UNLIMITED = "UNLIMITED"  # a time limit: none at all (where the partition allows it)
# What an allocation stores as its script: it is never run (an interactive job launches
# nothing; its client runs steps on it).
ALLOCATION_SCRIPT = "#!/bin/sh\n# an allocation (galloc or gsrun): nothing runs here\n"
# The fields of POST /v1/jobs (docs/api.md); any other is refused.
SUBMIT_FIELDS = frozenset({
    "script", "args", "name", "gpus", "gpu_types", "nodes", "cpus", "mem_mb", "gres_flags",
    "nodelist", "exclude", "warn_signal", "time_limit", "partition", "account", "qos", "hold", "exclusive",
    "requeue", "begin_time", "dependency", "array", "work_dir", "environment", "output",
    "error", "umask", "submit_key", "interactive", "reservation",
    "share_mode", "share", "gpu_mem_mb", "mail_type", "mail_user", "licenses", "constraint", "container"})
UPDATE_FIELDS = frozenset({"time_limit", "partition", "qos", "priority", "name", "dependency",
                           "nodes", "gpus_per_node", "nice", "constraint", "reservation"})


# sbatch's --nice, --priority, --open-mode, --time-min and --deadline (messages/schedflags.py).
SUBMIT_FIELDS = SUBMIT_FIELDS | frozenset(SCHED_FIELDS)


@dataclass(frozen=True)
class JobRequest:
    """A job as its user asks for it (``POST /v1/jobs``), every field within its bounds.

    ``time_limit`` is seconds, ``UNLIMITED``, or None for the partition's default;
    ``partition`` may be a comma list (the first that takes the job); ``nodes`` is the
    nodelist's length when the request names nodes but no count.
    """

    script: str
    work_dir: str
    args: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)
    name: str = "job"
    gpus: int = 0
    gpu_types: tuple[str, ...] = ()
    nodes: int = 1
    cpus: int = 0
    mem_mb: int = 0
    nodelist: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    warn_signal: WarnSignal | None = None
    time_limit: int | str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    hold: bool = False
    exclusive: bool = False
    requeue: bool | None = None
    begin_time: datetime | None = None
    dependency: tuple[Dependency, ...] = ()
    array: str | None = None  # as sent: its canonical form may be longer (array_spec)
    output: str | None = None
    error: str | None = None
    umask: int | None = None
    # Chosen by the client, one per submission: the same key sent again (a lost answer,
    # a failover) by the same user gives the job already stored instead of another.
    submit_key: str | None = None
    # sbatch's --gres-flags: whether the job's CPUs must be (enforce-binding) or need not
    # be (disable-binding) close to its GPUs; None: the node's default.
    gres_flags: str | None = None
    # An allocation (galloc, gsrun outside a job): nothing is launched when it starts;
    # its client runs steps on it and ends it. The script may be left out.
    interactive: bool = False
    # A share of one GPU (--gres=mps:N, --gres=shard:N): ``share`` units of a GPU shared
    # by ``share_mode``; ``gpu_mem_mb`` (--gpu-mem) the GPU memory it needs, with a share
    # its memory limit. Either makes the job one GPU (``gpus`` 1) on one node.
    share_mode: str | None = None
    share: int | None = None
    gpu_mem_mb: int | None = None
    # sbatch's --mail-type, ALL expanded (empty: no mail), and --mail-user (None: the
    # submitting user), both checked by gpusched.core.mail.
    mail_types: tuple[str, ...] = ()
    mail_user: str | None = None
    # sbatch's -L: (license, count) pairs sorted by name (gpusched.core.licenses).
    licenses: Licenses = ()
    flags: SchedFlags = SchedFlags()  # --nice, --priority, --open-mode, --time-min, --deadline
    reservation: str | None = None  # --reservation: an advance reservation's name
    # sbatch's -C/--constraint in its canonical text (gpusched.core.features); None: none.
    constraint: str | None = None
    # pyxis's --container-* options (gpusched.messages.containers); None: no container.
    container: ContainerRequest | None = None

    @classmethod
    def parse(cls, raw: object) -> JobRequest:
        """Check every field's type and bounds; the first fault is a UsageError."""
        body = as_object(raw, "the submission")
        unknown = sorted(set(body) - SUBMIT_FIELDS)
        if unknown:
            raise UsageError(f"unknown field {shown(unknown[0])} in the submission")
        interactive = flag(body, "interactive")
        if interactive and body.get("script") is None:
            body = {**body, "script": ALLOCATION_SCRIPT}
        script, args, env = parts.request_text(body)
        gpus = integer(body, "gpus", 0, 0, bounds.MAX_GPUS, "a whole number of GPUs")
        name = text(body, "name", bounds.MAX_NAME, "a job name") or "job"
        work_dir = path(body, "work_dir", "an absolute directory path")
        if not work_dir or not work_dir.startswith("/"):
            raise UsageError(f"work_dir: expected an absolute directory path, got "
                             f"{shown(work_dir)}")
        output, error = parts.output_pattern(body, "output"), parts.output_pattern(body, "error")
        umask = optional_integer(body, "umask", 0, 0o777, "a file mode creation mask")
        array = parts.array(typed(body, "array", str, None, "task ids such as 0-99 or 1,3,5-9%4"))
        partition = text(body, "partition", bounds.PATH_MAX, "a partition name")
        account = text(body, "account", bounds.MAX_WORD, "an account")
        qos = text(body, "qos", bounds.MAX_WORD, "a QOS name")
        nodelist, exclude = parts.node_choice(body)
        warn = parts.warn_signal(body)
        kinds, nodes, cpus, mem_mb = parts.shape(body, gpus, len(nodelist) or 1)
        exclusive = flag(body, "exclusive")
        share_mode, share, gpu_mem_mb = parts.share(body, gpus, nodes, exclusive)
        if share_mode is not None or gpu_mem_mb is not None:
            gpus = 1
        parts.check_partition_list(partition)
        if interactive and array is not None:
            raise UsageError("array: an interactive allocation cannot be a job array")
        mail_types, mail_user = parts.mail(body)
        return cls(
            script=script, work_dir=work_dir, args=tuple(args), environment=env, name=name,
            gpus=gpus, gpu_types=kinds, nodes=nodes, cpus=cpus, mem_mb=mem_mb,
            nodelist=nodelist, exclude=exclude, warn_signal=warn,
            time_limit=parse_time_limit(body.get("time_limit")), partition=partition,
            account=account, qos=qos, hold=flag(body, "hold"),
            exclusive=exclusive, share_mode=share_mode, share=share, gpu_mem_mb=gpu_mem_mb,
            requeue=typed(body, "requeue", bool, None, "true, false or null"),
            begin_time=parts.begin_time(body.get("begin_time")),
            dependency=parts.dependency(typed(body, "dependency", str, None, "a dependency")),
            array=array, output=output, error=error, umask=umask,
            flags=SchedFlags.of_submission(body, parse_time_limit(body.get("time_limit")),
                                           parts.begin_time(body.get("begin_time"))),
            submit_key=parts.submit_key(body.get("submit_key")),
            gres_flags=None if body.get("gres_flags") is None
            else one_of(body, "gres_flags", GRES_FLAGS), interactive=interactive,
            reservation=reservation_name(body),
            mail_types=mail_types, mail_user=mail_user, licenses=parts.licenses(body),
            constraint=parts.constraint(body, nodes, parts.whole_or_shared(
                exclusive, share_mode, gpu_mem_mb)),
            container=parts.container(body, interactive))

    def to_json(self) -> dict[str, Any]:
        """The request as ``POST /v1/jobs`` takes it."""
        warn = self.warn_signal
        return {
            "script": self.script, "args": list(self.args),
            "environment": dict(self.environment), "name": self.name, "gpus": self.gpus,
            "gpu_types": list(self.gpu_types), "nodes": self.nodes, "cpus": self.cpus,
            "mem_mb": self.mem_mb, "nodelist": list(self.nodelist),
            "exclude": list(self.exclude),
            "warn_signal": None if warn is None else {
                "signal": warn.number, "seconds": warn.seconds, "batch_only": warn.batch_only},
            "time_limit": self.time_limit, "partition": self.partition,
            "account": self.account, "qos": self.qos, "hold": self.hold,
            "exclusive": self.exclusive, "requeue": self.requeue,
            "begin_time": None if self.begin_time is None else self.begin_time.isoformat(),
            "dependency": self.dependency_text, "array": self.array,
            "work_dir": self.work_dir, "output": self.output, "error": self.error,
            "umask": self.umask, "submit_key": self.submit_key, "gres_flags": self.gres_flags,
            "interactive": self.interactive, "share_mode": self.share_mode,
            "share": self.share, "gpu_mem_mb": self.gpu_mem_mb,
            "mail_type": list(self.mail_types), "mail_user": self.mail_user,
            "reservation": self.reservation,
            "licenses": format_licenses(self.licenses) or None, **self.flags.to_json(),
            "constraint": self.constraint,
            "container": None if self.container is None else self.container.to_json(),
        }

    @cached_property
    def array_spec(self) -> ArraySpec | None:
        """The array's task ids, canonical, and its cap; None for a single job."""
        return None if self.array is None else parse_array(self.array)

    @property
    def dependency_text(self) -> str | None:
        """The dependency as stored: ``afterok:12:13,singleton``; None without one."""
        if not self.dependency:
            return None
        return format_dependency(self.dependency)

    @property
    def dependency_job_ids(self) -> set[int]:
        """Every job the dependency names."""
        return {j for clause in self.dependency for j in clause.job_ids}


@dataclass(frozen=True)
class JobUpdate:
    """A change to a job (``POST /v1/jobs/{id}/update``): ``changes`` names the fields
    given; a null partition or QOS means the default one, a null priority the computed
    one, a null time limit the partition's default."""

    changes: frozenset[str]
    time_limit: int | str | None = None
    partition: str | None = None
    qos: str | None = None
    priority: float | None = None
    name: str | None = None
    dependency: tuple[Dependency, ...] = ()  # none: no dependency any more
    nodes: int | None = None
    gpus_per_node: int | None = None
    nice: int | None = None  # None: 0
    constraint: str | None = None  # -C, canonical; None: none any more
    reservation: str | None = None  # --reservation; None: none any more

    @classmethod
    def parse(cls, raw: object) -> JobUpdate:
        """Check the fields given; the first fault is a UsageError."""
        body = as_object(raw, "update")
        unknown = sorted(set(body) - UPDATE_FIELDS)
        if unknown or not body:
            named = [k if k.isprintable() and len(k) <= 40 else shown(k) for k in unknown[:5]]
            raise UsageError(f"update: expected some of {', '.join(sorted(UPDATE_FIELDS))}"
                             + (f"; unknown: {', '.join(named)}" if unknown else "")
                             + (", ..." if len(unknown) > 5 else ""))
        return cls(
            changes=frozenset(body),
            time_limit=parse_time_limit(body.get("time_limit")),
            partition=text(body, "partition", bounds.MAX_WORD, "a partition name"),
            qos=text(body, "qos", bounds.MAX_WORD, "a QOS name"),
            priority=_priority(body.get("priority")),
            name=text(body, "name", bounds.MAX_NAME, "a job name"),
            dependency=parts.dependency(typed(body, "dependency", str, None, "a dependency")),
            nodes=optional_integer(body, "nodes", 1, bounds.MAX_NODES, "a number of nodes"),
            gpus_per_node=optional_integer(body, "gpus_per_node", 0, bounds.MAX_GPUS,
                                           "GPUs per node"),
            nice=optional_integer(body, "nice", -MAX_NICE, MAX_NICE, "a nice adjustment"),
            # Its syntax here; what the job's nodes make of it, in db/jobupdate.py.
            constraint=parts.constraint(body, bounds.MAX_NODES, False),
            reservation=reservation_name(body))

    def to_json(self) -> dict[str, Any]:
        """The change as the endpoint takes it: the fields given, and only those."""
        values = {"time_limit": self.time_limit, "partition": self.partition,
                  "qos": self.qos, "priority": self.priority, "name": self.name,
                  "dependency": format_dependency(self.dependency) if self.dependency else None,
                  "nodes": self.nodes, "gpus_per_node": self.gpus_per_node, "nice": self.nice,
                  "constraint": self.constraint, "reservation": self.reservation}
        return {key: values[key] for key in sorted(self.changes)}


def parse_time_limit(value: object) -> int | str | None:
    """Seconds (1 to MAX_TIME_LIMIT), ``UNLIMITED``, or None for the partition's default."""
    if value is None:
        return None
    if value == UNLIMITED:
        return UNLIMITED
    if not isinstance(value, int) or isinstance(value, bool):
        raise UsageError(f"time_limit: expected seconds or \"UNLIMITED\", got {shown(value)}")
    if not 0 < value <= bounds.MAX_TIME_LIMIT:
        raise UsageError(f"time_limit: expected seconds from 1 to {bounds.MAX_TIME_LIMIT}, "
                         f"got {value}")
    return value


def _priority(value: object) -> float | None:
    """``priority``: a number >= 0 that replaces the computed priority, or null to go
    back to it."""
    if value is None:
        return None
    try:
        number = float(value) if isinstance(value, int | float) and \
            not isinstance(value, bool) else None
    except OverflowError:  # an integer of hundreds of digits
        number = None
    if number is None or not 0 <= number < float("inf"):
        raise UsageError(f"priority: expected a number of 0 or more, or null, got "
                         f"{shown(value)}")
    return number
