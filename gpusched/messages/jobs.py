"""What a user sends about a job: the submission (``POST /v1/jobs``) and a change to it
(``POST /v1/jobs/{id}/update``), each parsed once, purely, into a frozen message.

What needs the database (the partition, account and QOS, whether named nodes and
dependency jobs exist, the site's limits) is ``gpusched.db.submit``'s part.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from gpusched.core import bounds, outputs
from gpusched.core.arrays import ArrayError, ArraySpec, parse_array
from gpusched.core.dependency import (
    Dependency,
    DependencyError,
    format_dependency,
    parse_dependency,
)
from gpusched.core.features import ConstraintError, check_request, parse_constraint
from gpusched.core.licenses import (
    MAX_LICENSES_TEXT,
    LicenseError,
    Licenses,
    format_licenses,
    parse_licenses,
)
from gpusched.core.mail import (
    MAX_MAIL_USER,
    MailError,
    check_mail_user,
    parse_mail_types,
)
from gpusched.core.shapes import ShapeError, parse_kinds
from gpusched.core.signals import DEFAULT_WARN_SECONDS, MAX_WARN_SECONDS, WarnSignal
from gpusched.errors import UsageError
from gpusched.messages.agent import GRES_FLAGS
from gpusched.messages.containers import ContainerRequest
from gpusched.messages.fields import (
    Body,
    as_object,
    bounded,
    flag,
    integer,
    one_of,
    optional_integer,
    path,
    shown,
    string_map,
    strings,
    text,
    typed,
    words,
)
from gpusched.messages.reservations import reservation_name
from gpusched.messages.schedflags import FIELDS as SCHED_FIELDS
from gpusched.messages.schedflags import MAX_NICE, SchedFlags

UNLIMITED = "UNLIMITED"  # a time limit: none at all (where the partition allows it)
MAX_ARRAY_TEXT = 10_000  # characters of an --array value
MAX_GPU_TYPES = 64  # acceptable GPU types or MIG profiles of one job
MAX_SUBMIT_KEY = 64  # characters of a submission's key
_SUBMIT_KEY = re.compile(r"[!-~]{1,%d}" % MAX_SUBMIT_KEY)  # printable ASCII, no space
# What an allocation stores as its script: it is never run (an interactive job launches
# nothing; its client runs steps on it).
ALLOCATION_SCRIPT = "#!/bin/sh\n# an allocation (galloc or gsrun): nothing runs here\n"
BEGIN_EXPECTED = "an ISO 8601 time with a zone, such as 2026-12-24T18:30:00+00:00"
# The fields of POST /v1/jobs (docs/api.md); any other is refused.
SUBMIT_FIELDS = frozenset({
    "script", "args", "name", "gpus", "gpu_types", "nodes", "cpus", "mem_mb", "gres_flags",
    "nodelist", "exclude", "warn_signal", "time_limit", "partition", "account", "qos", "hold", "exclusive",
    "requeue", "begin_time", "dependency", "array", "work_dir", "environment", "output",
    "error", "umask", "submit_key", "interactive", "reservation",
    "share_mode", "share", "gpu_mem_mb", "mail_type", "mail_user", "licenses", "constraint", "container"})
SHARE_MODES = ("mps", "shard")  # --gres=mps:N, --gres=shard:N
MAX_SHARE = 10_000  # units of one GPU a job may ask for (a partition offers at most as many)
MAX_GPU_MEM_MB = 16 * 1024 * 1024  # --gpu-mem: 16 TiB
UPDATE_FIELDS = frozenset({"time_limit", "partition", "qos", "priority", "name", "dependency",
                           "nodes", "gpus_per_node", "nice"})


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
        script, args, env = _request_text(body)
        gpus = integer(body, "gpus", 0, 0, bounds.MAX_GPUS, "a whole number of GPUs")
        name = text(body, "name", bounds.MAX_NAME, "a job name") or "job"
        work_dir = path(body, "work_dir", "an absolute directory path")
        if not work_dir or not work_dir.startswith("/"):
            raise UsageError(f"work_dir: expected an absolute directory path, got "
                             f"{shown(work_dir)}")
        output, error = _output_pattern(body, "output"), _output_pattern(body, "error")
        umask = optional_integer(body, "umask", 0, 0o777, "a file mode creation mask")
        array = _array(typed(body, "array", str, None, "task ids such as 0-99 or 1,3,5-9%4"))
        partition = text(body, "partition", bounds.PATH_MAX, "a partition name")
        account = text(body, "account", bounds.MAX_WORD, "an account")
        qos = text(body, "qos", bounds.MAX_WORD, "a QOS name")
        nodelist, exclude = _node_choice(body)
        warn = _warn_signal(body)
        kinds, nodes, cpus, mem_mb = _shape(body, gpus, len(nodelist) or 1)
        exclusive = flag(body, "exclusive")
        share_mode, share, gpu_mem_mb = _share(body, gpus, nodes, exclusive)
        if share_mode is not None or gpu_mem_mb is not None:
            gpus = 1
        _check_partition_list(partition)
        if interactive and array is not None:
            raise UsageError("array: an interactive allocation cannot be a job array")
        mail_types, mail_user = _mail(body)
        return cls(
            script=script, work_dir=work_dir, args=tuple(args), environment=env, name=name,
            gpus=gpus, gpu_types=kinds, nodes=nodes, cpus=cpus, mem_mb=mem_mb,
            nodelist=nodelist, exclude=exclude, warn_signal=warn,
            time_limit=parse_time_limit(body.get("time_limit")), partition=partition,
            account=account, qos=qos, hold=flag(body, "hold"),
            exclusive=exclusive, share_mode=share_mode, share=share, gpu_mem_mb=gpu_mem_mb,
            requeue=typed(body, "requeue", bool, None, "true, false or null"),
            begin_time=_begin_time(body.get("begin_time")),
            dependency=_dependency(typed(body, "dependency", str, None, "a dependency")),
            array=array, output=output, error=error, umask=umask,
            flags=SchedFlags.of_submission(body, parse_time_limit(body.get("time_limit")),
                                           _begin_time(body.get("begin_time"))),
            submit_key=_submit_key(body.get("submit_key")),
            gres_flags=None if body.get("gres_flags") is None
            else one_of(body, "gres_flags", GRES_FLAGS), interactive=interactive,
            reservation=reservation_name(body),
            mail_types=mail_types, mail_user=mail_user, licenses=_licenses(body),
            constraint=_constraint(body, nodes, exclusive or share_mode is not None
                                   or gpu_mem_mb is not None),
            container=_container(body, interactive))

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
            dependency=_dependency(typed(body, "dependency", str, None, "a dependency")),
            nodes=optional_integer(body, "nodes", 1, bounds.MAX_NODES, "a number of nodes"),
            gpus_per_node=optional_integer(body, "gpus_per_node", 0, bounds.MAX_GPUS,
                                           "GPUs per node"),
            nice=optional_integer(body, "nice", -MAX_NICE, MAX_NICE, "a nice adjustment"))

    def to_json(self) -> dict[str, Any]:
        """The change as the endpoint takes it: the fields given, and only those."""
        values = {"time_limit": self.time_limit, "partition": self.partition,
                  "qos": self.qos, "priority": self.priority, "name": self.name,
                  "dependency": format_dependency(self.dependency) if self.dependency else None,
                  "nodes": self.nodes, "gpus_per_node": self.gpus_per_node, "nice": self.nice}
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


def _request_text(body: Body) -> tuple[str, list[str], dict[str, str]]:
    """The script, its arguments and the environment, within their bounds."""
    script = typed(body, "script", str, None, "the batch script text")
    if script is None or not script.startswith("#!"):
        raise UsageError("This does not look like a batch script: the first line must start "
                         "with #! followed by the path to an interpreter")
    args, env = strings(body, "args"), string_map(body, "environment")
    return (bounded(bounds.check_script, script), bounded(bounds.check_args, args),
            bounded(bounds.check_environment, env))


def _output_pattern(body: Body, key: str) -> str | None:
    """An output file pattern (``%j`` and friends), within its bounds."""
    pattern = path(body, key, "a file name pattern")
    if pattern is not None:
        problem = outputs.output_pattern_error(pattern)
        if problem is not None:
            raise UsageError(f"{key}: {problem}")
    return pattern


def _submit_key(value: object) -> str | None:
    """A submission's key: 1 to 64 printable ASCII characters, no space; or None."""
    if value is None:
        return None
    if not isinstance(value, str) or not _SUBMIT_KEY.fullmatch(value):
        raise UsageError(f"submit_key: expected 1 to {MAX_SUBMIT_KEY} printable ASCII "
                         f"characters (no space), got {shown(value)}")
    return value


def _array(value: str | None) -> str | None:
    """An ``--array`` value that parses, as it was sent."""
    if value is None:
        return None
    if len(value) > MAX_ARRAY_TEXT:
        raise UsageError(f"array: {len(value)} characters, more than the {MAX_ARRAY_TEXT} "
                         "allowed")
    try:
        parse_array(value)
    except ArrayError as exc:
        raise UsageError(str(exc)) from None
    return value


def _node_choice(body: Body) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The nodes a job names (it runs on exactly those) and those it excludes."""
    nodelist = tuple(dict.fromkeys(words(body, "nodelist", bounds.MAX_LIST, "node names")))
    exclude = tuple(dict.fromkeys(words(body, "exclude", bounds.MAX_LIST, "node names")))
    both = sorted(set(nodelist) & set(exclude))
    if both:
        raise UsageError(f"node {both[0]} is both named (nodelist) and excluded")
    count = body.get("nodes")
    if nodelist and count is not None and count != len(nodelist):
        raise UsageError(f"nodes: the job names {len(nodelist)} node(s) in its nodelist, so it "
                         f"runs on {len(nodelist)}, not {shown(count)}")
    return nodelist, exclude


def _warn_signal(body: Body) -> WarnSignal | None:
    """``warn_signal``: {"signal": N, "seconds": S, "batch_only": B}, or null."""
    warn = typed(body, "warn_signal", dict, None,
                 'an object {"signal", "seconds", "batch_only"}')
    if warn is None:
        return None
    unknown = sorted(str(k) for k in set(warn) - {"signal", "seconds", "batch_only"})
    if unknown:
        raise UsageError(f"warn_signal: unknown key {unknown[0]!r}")
    number = typed(warn, "signal", int, None, "a signal number")
    if number is None or not 1 <= number < signal.NSIG:
        raise UsageError("warn_signal.signal: expected a signal number from 1 to "
                         f"{signal.NSIG - 1}")
    seconds = typed(warn, "seconds", int, DEFAULT_WARN_SECONDS, "seconds before the time limit")
    if not 0 <= seconds <= MAX_WARN_SECONDS:
        raise UsageError(f"warn_signal.seconds: expected 0 to {MAX_WARN_SECONDS}, got {seconds}")
    return WarnSignal(number, seconds, flag(warn, "batch_only"))


def _shape(body: Body, gpus: int, default_nodes: int) -> tuple[tuple[str, ...], int, int, int]:
    """GPU types, nodes, and CPUs and memory per node, validated."""
    types = typed(body, "gpu_types", list, [], "a list of GPU types or MIG profiles")
    if len(types) > MAX_GPU_TYPES or not all(
            isinstance(t, str) and len(t) <= bounds.MAX_WORD for t in types):
        raise UsageError(f"gpu_types: expected a list of at most {MAX_GPU_TYPES} GPU types or "
                         "MIG profiles")
    try:
        kinds = parse_kinds("|".join(types), "gpu_types", repr(types)) if types else ()
    except ShapeError as exc:
        raise UsageError(str(exc)) from None
    if len(kinds) > MAX_GPU_TYPES:  # a type may hold several: "a100|h100"
        raise UsageError(f"gpu_types: expected a list of at most {MAX_GPU_TYPES} GPU types or "
                         "MIG profiles")
    nodes = integer(body, "nodes", default_nodes, 1, bounds.MAX_NODES, "a number of nodes")
    cpus = integer(body, "cpus", 0, 0, bounds.MAX_CPUS, "CPUs per node")
    mem_mb = integer(body, "mem_mb", 0, 0, bounds.MAX_MEM_MB, "MiB of memory per node")
    if gpus % nodes:
        raise UsageError(f"gpus: {gpus} GPUs cannot be spread evenly over {nodes} nodes")
    if kinds and gpus == 0:
        raise UsageError("gpu_types: a GPU type needs a number of GPUs (--gpus TYPE:N)")
    return kinds, nodes, cpus, mem_mb


def _share(body: Body, gpus: int, nodes: int,
           exclusive: bool) -> tuple[str | None, int | None, int | None]:
    """``share_mode`` and ``share`` (both or neither) and ``gpu_mem_mb``: a share of one GPU
    and the GPU memory a job needs. Either asks for one GPU on one node: not with more
    GPUs, more nodes or --exclusive."""
    mode = None if body.get("share_mode") is None else one_of(body, "share_mode", SHARE_MODES)
    share = optional_integer(body, "share", 1, MAX_SHARE, "units of one GPU")
    if (mode is None) != (share is None):
        raise UsageError("share_mode: give it with share (units of one GPU), or neither"
                         if share is not None else
                         f"share: a {mode} request needs share, the units of one GPU it asks for")
    memory = optional_integer(body, "gpu_mem_mb", 1, MAX_GPU_MEM_MB, "MB of GPU memory")
    if mode is None and memory is None:
        return None, None, None
    what = (f"a share of one GPU (share_mode {mode})" if mode is not None
            else "GPU memory (gpu_mem_mb)")
    if gpus > 1:
        raise UsageError(f"gpus: {what} is one GPU, not {gpus}")
    if nodes > 1:
        raise UsageError(f"nodes: {what} is on one node, not {nodes}")
    if exclusive:
        raise UsageError(f"exclusive: {what} cannot take whole nodes")
    return mode, share, memory


def _constraint(body: Body, nodes: int, whole_or_shared: bool) -> str | None:
    """``constraint``: sbatch's -C text, canonical (null or absent: none); counts may
    not name more nodes than the job has, nor go with --exclusive or a GPU share."""
    value = typed(body, "constraint", str, None, "node features such as \"a100&nvlink\"")
    if value is None:
        return None
    try:
        parsed = parse_constraint(value)
        check_request(parsed, nodes)
    except ConstraintError as err:
        raise UsageError(f"constraint: {err.message.removeprefix('--constraint: ')}") from None
    if parsed.counts and nodes > 1 and whole_or_shared:
        raise UsageError("constraint: node counts (a*N) are not taken with --exclusive, "
                         "--gpu-mem or a GPU share")
    return parsed.text()


def _licenses(body: Body) -> Licenses:
    """``licenses``: sbatch's -L text, ``name[:N][,name[:N]...]`` (null or absent: none)."""
    value = text(body, "licenses", MAX_LICENSES_TEXT, "licenses such as \"matlab:2,ansys\"")
    if value is None:
        return ()
    try:
        return parse_licenses(value)
    except LicenseError as err:
        raise UsageError(f"licenses: {err.message.removeprefix('--licenses: ')}") from None


def _mail(body: Body) -> tuple[tuple[str, ...], str | None]:
    """``mail_type`` (a list of sbatch's type names) and ``mail_user`` (a user name or
    one mail address: nothing that could split or add a mail header)."""
    names = typed(body, "mail_type", list, [], "a list of mail types such as [\"END\", \"FAIL\"]")
    user = text(body, "mail_user", MAX_MAIL_USER, "a user name or a mail address")
    try:
        return parse_mail_types(names), None if user is None else check_mail_user(user)
    except MailError as exc:
        raise UsageError(str(exc)) from None


def _check_partition_list(text: str | None) -> None:
    """A comma list of partitions (sbatch -p a,b) names no empty one."""
    if text is not None and "," in text and not all(n.strip() for n in text.split(",")):
        raise UsageError(f"partition: an empty name in {text!r}")


def _begin_time(value: object) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise UsageError(f"begin_time: expected {BEGIN_EXPECTED}, got {shown(value)}")
    try:
        begin = datetime.fromisoformat(value) if len(value) <= 64 else None
    except ValueError:
        begin = None
    if begin is None or begin.tzinfo is None:
        raise UsageError(f"begin_time: expected {BEGIN_EXPECTED}, got {shown(value)}")
    return begin


def _dependency(text: str | None) -> tuple[Dependency, ...]:
    """The clauses of a --dependency value; whether the jobs exist is the database's part."""
    if text is None or not text.strip():
        return ()
    try:
        return parse_dependency(text)
    except DependencyError as exc:
        raise UsageError(str(exc)) from None


def _container(body: Body, interactive: bool) -> ContainerRequest | None:
    """``container``: the job's container (None: none); an allocation runs nothing in one."""
    if body.get("container") is None:
        return None
    if interactive:
        raise UsageError("container: an interactive allocation runs nothing in a container")
    return ContainerRequest.parse(body["container"])
