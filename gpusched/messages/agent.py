"""What the controller and a node's agent send each other about jobs: the launch order
(an element of ``launches`` in ``GET /agent/v1/work``) and the per-node command (the
end report and the health report are gpusched.messages.reports'), each parsed once into a frozen
message by the side that receives it.

The agent runs as root, so an order is bounded field by field before any of it is used;
a bad order fails its job, never the agent. The bounds are those of the data, not the
submit policy: an output pattern that submit would refuse still launches (its padding
is capped when it is expanded), as the agent must run what an older controller stored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpusched.core import bounds
from gpusched.core.arrays import MAX_TASK_ID, MAX_TASKS, ArrayError, runs
from gpusched.core.signals import MAX_WARN_SECONDS
from gpusched.errors import UsageError
from gpusched.messages.containers import ContainerRequest
from gpusched.messages.fields import (
    MAX_UID,
    Body,
    as_object,
    bounded,
    flag,
    integer,
    one_of,
    optional_integer,
    path,
    refuse_unknown,
    required_integer,
    required_text,
    shown,
    string_map,
    strings,
    typed,
    words,
)
from gpusched.messages.jobfacts import JobFacts
from gpusched.messages.reports import END_FIELDS as END_FIELDS
from gpusched.messages.reports import HEALTH_FIELDS as HEALTH_FIELDS
from gpusched.messages.reports import MAX_BYTES as MAX_BYTES
from gpusched.messages.reports import MAX_EPOCH as MAX_EPOCH
from gpusched.messages.reports import MAX_ERROR_INPUT as MAX_ERROR_INPUT
from gpusched.messages.reports import MAX_ERROR_TEXT as MAX_ERROR_TEXT
from gpusched.messages.reports import MAX_HEALTH_REASON as MAX_HEALTH_REASON
from gpusched.messages.reports import MAX_SIGNAL as MAX_SIGNAL
from gpusched.messages.reports import OUTCOMES as OUTCOMES
from gpusched.messages.reports import JobEnd as JobEnd
from gpusched.messages.reports import NodeHealth as NodeHealth
from gpusched.messages.reports import epoch_seconds as epoch_seconds
from gpusched.messages.reports import error_text as error_text
from gpusched.messages.reports import kept_error as kept_error
from gpusched.messages.schedflags import OPEN_MODES

MAX_ARRAY_SPEC = 8 * MAX_TASKS  # characters of a canonical task list ("0-9,12,15-99:3")
GRES_FLAGS = ("enforce-binding", "disable-binding")
COMMAND_KINDS = ("launch", "cancel", "signal", "limit", "kill", "step", "step_cancel",
                 "notice", "suspend")
MAX_NOTICE = 1000  # characters of a notice's line
SHARE_MODES = ("mps", "shard")
MAX_SHARE_UNITS = 10_000  # units one shared GPU may offer (an MPS count of 100: percents)
MAX_GPU_MEM_MB = 16 * 1024 * 1024  # MB of GPU memory one share may hold (16 TiB)
_HEX_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# A GPU's UUID as NVML gives it: GPU-<uuid>, MIG-<uuid>, or a MIG device's older
# MIG-GPU-<uuid>/<gi>/<ci> form.
GPU_UUID = re.compile(rf"(GPU-{_HEX_UUID}|MIG-{_HEX_UUID}|MIG-GPU-{_HEX_UUID}/\d{{1,3}}/\d{{1,3}})")

LAUNCH_FIELDS = frozenset({
    "job_id", "restarts", "node", "name", "user", "uid", "gid", "script", "args", "work_dir",
    "environment", "output", "error", "open_mode", "umask", "time_limit", "warn_signal", "warn_seconds",
    "warn_batch_only", "gpu_uuids", "node_names", "array_job_id", "array_task_id",
    "array_spec", "cpus", "mem_mb", "gres_flags", "share", "job", "container"})
SHARE_FIELDS = frozenset({"mode", "gpu_uuid", "units", "of", "mem_mb"})
COMMAND_FIELDS = frozenset({"kind", "node", "job_id", "run", "seq", "payload"})


@dataclass(frozen=True, slots=True)
class ShareGrant:
    """The share of one GPU a job holds on this node, as the controller granted it.

    ``mode`` is how the GPU is shared: "mps" (the agent runs the GPU's MPS control
    daemon and limits the job to ``units`` of the ``of`` units the GPU offers, and to
    ``mem_mb`` MB of its memory; 0: no memory limit) or "shard" (the job gets the GPU
    with no limit, as Slurm's shards). ``gpu_uuid`` is the order's only GPU.
    """

    mode: str
    gpu_uuid: str
    units: int
    of: int
    mem_mb: int = 0

    @classmethod
    def parse(cls, raw: object) -> ShareGrant:
        """Check every field's type and bounds; the first fault is a UsageError."""
        body = as_object(raw, "the share")
        refuse_unknown(body, SHARE_FIELDS, "the share")
        mode = one_of(body, "mode", SHARE_MODES)
        gpu_uuid = required_text(body, "gpu_uuid", bounds.MAX_WORD, "a GPU UUID")
        if not GPU_UUID.fullmatch(gpu_uuid):
            raise UsageError(f"gpu_uuid: expected a GPU UUID (GPU- or MIG- and a UUID), got "
                             f"{shown(gpu_uuid)}")
        of = required_integer(body, "of", 1, MAX_SHARE_UNITS, "the units the GPU offers")
        return cls(mode=mode, gpu_uuid=gpu_uuid,
                   units=required_integer(body, "units", 1, of, "units of the GPU"), of=of,
                   mem_mb=integer(body, "mem_mb", 0, 0, MAX_GPU_MEM_MB, "MB of GPU memory"))

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "gpu_uuid": self.gpu_uuid, "units": self.units,
                "of": self.of, "mem_mb": self.mem_mb}


@dataclass(frozen=True)
class LaunchOrder:
    """Start one run of a job on this node: everything its supervisor needs.

    ``run`` counts the job's restarts (``restarts`` on the wire): a requeued job comes
    back under the same id as a new run. ``node_names`` are all the job's nodes (empty:
    this one alone); ``output``/``error`` are patterns relative to ``work_dir``.
    ``cpus`` and ``mem_mb`` are what the job holds on this node (0: not counted, so not
    limited); ``gres_flags`` is sbatch's ``--gres-flags`` (None: the node's default).
    ``share`` is the part of its one GPU a job that shares it holds (None: whole GPUs;
    absent from the wire then).
    """

    job_id: int
    node: str
    name: str
    user: str
    uid: int
    gid: int
    script: str
    work_dir: str
    run: int = 0
    args: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)
    output: str | None = None
    error: str | None = None
    umask: int | None = None
    time_limit: int | None = None
    warn_signal: int | None = None
    warn_seconds: int | None = None
    warn_batch_only: bool = False
    gpu_uuids: tuple[str, ...] = ()
    node_names: tuple[str, ...] = ()
    array_job_id: int | None = None
    array_task_id: int | None = None
    array_spec: str | None = None
    cpus: int = 0
    mem_mb: int = 0
    gres_flags: str | None = None
    open_mode: str | None = None  # --open-mode: append (None: the same) or truncate
    share: ShareGrant | None = None
    job: JobFacts | None = None  # what the job's Slurm variables show (messages.jobfacts)
    container: ContainerRequest | None = None  # --container-image and the rest (pyxis's)

    @classmethod
    def parse(cls, raw: object) -> LaunchOrder:
        """Check every field's type and bounds; the first fault is a UsageError."""
        body = as_object(raw, "the launch order")
        refuse_unknown(body, LAUNCH_FIELDS, "the launch order")
        work_dir = path(body, "work_dir", "an absolute directory path")
        if not work_dir or not work_dir.startswith("/"):
            raise UsageError(f"work_dir: expected an absolute directory path, got "
                             f"{shown(work_dir)}")
        script = typed(body, "script", str, None, "the batch script text")
        if script is None:
            raise UsageError("script: expected the batch script text, got nothing")
        gpu_uuids = words(body, "gpu_uuids", bounds.MAX_GPUS, "GPU UUIDs")
        share = None if body.get("share") is None else _share(as_object(body["share"], "share"))
        if share is not None and gpu_uuids != (share.gpu_uuid,):
            raise UsageError(f"share: the share is of GPU {share.gpu_uuid}, which must be the "
                             f"order's only GPU, not {shown(list(gpu_uuids))}")
        return cls(
            job_id=required_integer(body, "job_id", 1, bounds.MAX_JOB_ID, "a job id"),
            run=integer(body, "restarts", 0, 0, bounds.MAX_INT32, "a restart count"),
            node=required_text(body, "node", bounds.MAX_WORD, "the node name"),
            name=required_text(body, "name", bounds.MAX_NAME, "a job name"),
            user=required_text(body, "user", bounds.MAX_WORD, "a user name"),
            uid=required_integer(body, "uid", 0, MAX_UID, "a uid"),
            gid=required_integer(body, "gid", 0, MAX_UID, "a gid"),
            script=bounded(bounds.check_script, script), work_dir=work_dir,
            args=tuple(bounded(bounds.check_args, strings(body, "args"))),
            environment=bounded(bounds.check_environment, string_map(body, "environment")),
            output=path(body, "output", "a file name pattern"),
            error=path(body, "error", "a file name pattern"),
            open_mode=None if body.get("open_mode") is None
            else one_of(body, "open_mode", OPEN_MODES),
            umask=optional_integer(body, "umask", 0, 0o777, "a file mode creation mask"),
            time_limit=optional_integer(body, "time_limit", 0, bounds.MAX_TIME_LIMIT,
                                        "seconds"),
            warn_signal=optional_integer(body, "warn_signal", 1, MAX_SIGNAL, "a signal number"),
            warn_seconds=optional_integer(body, "warn_seconds", 0, MAX_WARN_SECONDS,
                                          "seconds before the time limit"),
            warn_batch_only=flag(body, "warn_batch_only"),
            gpu_uuids=gpu_uuids,
            node_names=words(body, "node_names", bounds.MAX_NODES, "node names"),
            array_job_id=optional_integer(body, "array_job_id", 1, bounds.MAX_JOB_ID,
                                          "a job id"),
            array_task_id=optional_integer(body, "array_task_id", 0, MAX_TASK_ID,
                                           "an array task id"),
            array_spec=_array_spec(typed(body, "array_spec", str, None, "array task ids")),
            cpus=integer(body, "cpus", 0, 0, bounds.MAX_CPUS, "CPUs on this node"),
            mem_mb=integer(body, "mem_mb", 0, 0, bounds.MAX_MEM_MB, "MiB on this node"),
            gres_flags=None if body.get("gres_flags") is None
            else one_of(body, "gres_flags", GRES_FLAGS), share=share,
            job=None if body.get("job") is None else JobFacts.parse(body["job"]),
            container=None if body.get("container") is None
            else ContainerRequest.parse(body["container"]))

    def to_json(self) -> dict[str, Any]:
        """The order as ``GET /agent/v1/work`` carries it (``share`` only when there is
        one, so that an order without one reads the same to an agent without shares)."""
        body = {
            "job_id": self.job_id, "restarts": self.run, "node": self.node, "name": self.name,
            "user": self.user, "uid": self.uid, "gid": self.gid, "script": self.script,
            "args": list(self.args), "work_dir": self.work_dir,
            "environment": dict(self.environment), "output": self.output,
            "error": self.error, "umask": self.umask, "time_limit": self.time_limit,
            "warn_signal": self.warn_signal, "warn_seconds": self.warn_seconds,
            "warn_batch_only": self.warn_batch_only, "gpu_uuids": list(self.gpu_uuids),
            "node_names": list(self.node_names), "array_job_id": self.array_job_id,
            "array_task_id": self.array_task_id, "array_spec": self.array_spec,
            "cpus": self.cpus, "mem_mb": self.mem_mb, "gres_flags": self.gres_flags,
        }
        if self.open_mode is not None:
            body["open_mode"] = self.open_mode
        if self.share is not None:
            body["share"] = self.share.to_json()
        if self.job is not None:
            body["job"] = self.job.to_json()
        if self.container is not None:
            body["container"] = self.container.to_json()
        return body


def _share(body: Body) -> ShareGrant:
    """The order's share, each fault named under ``share``."""
    try:
        return ShareGrant.parse(body)
    except UsageError as exc:
        raise UsageError(f"share: {exc.message}") from None


def launch_job_of(raw: object) -> tuple[int, int] | None:
    """The job id and run a launch order names, read leniently so that an order that
    does not parse can still fail its job; None when it names no job."""
    if not isinstance(raw, dict):
        return None
    job_id, run = raw.get("job_id"), raw.get("restarts")
    if not isinstance(job_id, int) or isinstance(job_id, bool) \
            or not 1 <= job_id <= bounds.MAX_JOB_ID:
        return None
    if not isinstance(run, int) or isinstance(run, bool) or not 0 <= run <= bounds.MAX_INT32:
        run = 0
    return job_id, run


def _array_spec(value: str | None) -> str | None:
    """A canonical list of array task ids, such as ``0-9,12,15-99:3``."""
    if value is None:
        return None
    if not value or len(value) > MAX_ARRAY_SPEC:
        raise UsageError(f"array_spec: expected 1 to {MAX_ARRAY_SPEC} characters of task "
                         f"ids, got {len(value)}")
    try:
        runs(value)
    except ArrayError as exc:
        raise UsageError(f"array_spec: {exc}") from None
    return value


@dataclass(frozen=True)
class SignalJob:
    """The payload of a ``signal`` command: the signal to send the job."""

    signal: int


@dataclass(frozen=True)
class JobNotice:
    """The payload of a ``notice`` command: one line for the job's output file (the
    idle-GPU policy's warning), written there by its supervisor as the job's user."""

    text: str

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text}


@dataclass(frozen=True)
class LimitJob:
    """The payload of a ``limit`` command: the job's new time limit (None: none) and
    when it now ends the job's steps (``deadline``, epoch seconds; None with a time
    limit: not given, as by a controller that sent the batch node alone)."""

    time_limit: int | None
    deadline: float | None = None

    def step_deadline(self) -> tuple[bool, float | None]:
        """(whether the job's steps get a new deadline, that deadline: None for none)."""
        if self.time_limit is None:
            return True, None
        return self.deadline is not None, self.deadline

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"time_limit": self.time_limit}
        if self.deadline is not None:
            body["deadline"] = self.deadline
        return body


if TYPE_CHECKING:  # the step messages import this module
    from typing import TypeAlias

    from gpusched.messages.jobcontrol import SuspendJob
    from gpusched.messages.steps import StepCancel, StepLaunch

    Payload: TypeAlias = (LaunchOrder | SignalJob | LimitJob | JobNotice | StepLaunch
                          | StepCancel | SuspendJob | None)


@dataclass(frozen=True)
class NodeCommand:
    """One thing a node must do for one run of a job, in the order of ``seq`` (the
    command's number, which its acknowledgement names): launch it (the payload is the
    LaunchOrder), cancel it (no payload), signal it, change its time limit, kill it
    (no payload: the controller has ended that run, and its steps with it), start its
    part of a step (StepLaunch) or end or signal a step (StepCancel). A command for a run the node no
    longer holds is stale and done nothing with."""

    kind: str
    node: str
    job_id: int
    run: int
    seq: int
    payload: Payload = None

    @classmethod
    def parse(cls, raw: object) -> NodeCommand:
        """Check every field's type and bounds, the payload's by kind; the first fault
        is a UsageError."""
        body = as_object(raw, "the node command")
        refuse_unknown(body, COMMAND_FIELDS, "the node command")
        kind = one_of(body, "kind", COMMAND_KINDS)
        node = required_text(body, "node", bounds.MAX_WORD, "the node name")
        job_id = required_integer(body, "job_id", 1, bounds.MAX_JOB_ID, "a job id")
        run = required_integer(body, "run", 0, bounds.MAX_INT32, "a restart count")
        seq = required_integer(body, "seq", 1, bounds.MAX_JOB_ID, "a command number")
        payload = as_object({} if body.get("payload") is None else body["payload"], "payload")
        command = cls(kind, node, job_id, run, seq, _payload(kind, payload))
        order = command.payload
        if isinstance(order, LaunchOrder) and (order.job_id, order.run, order.node) != (
                job_id, run, node):
            raise UsageError(f"payload: the launch order is for job {order.job_id} run "
                             f"{order.run} on {order.node}, not job {job_id} run {run} on "
                             f"{node}")
        if kind == "step" and (order.job_id, order.run, order.node) != (  # type: ignore[union-attr]
                job_id, run, node):
            raise UsageError(f"payload: the step is for job {order.job_id} run "  # type: ignore[union-attr]
                             f"{order.run} on {order.node}, not job {job_id} run {run} on "  # type: ignore[union-attr]
                             f"{node}")
        return command

    def to_json(self) -> dict[str, Any]:
        """The command as it travels to its node."""
        payload: dict[str, Any]
        if isinstance(self.payload, LaunchOrder):
            payload = self.payload.to_json()
        elif isinstance(self.payload, SignalJob):
            payload = {"signal": self.payload.signal}
        elif self.payload is not None:
            payload = self.payload.to_json()
        else:
            payload = {}
        return {"kind": self.kind, "node": self.node, "job_id": self.job_id, "run": self.run,
                "seq": self.seq, "payload": payload}


def _payload(kind: str, body: Body) -> Payload:
    """The payload a command of ``kind`` carries."""
    if kind == "launch":
        return LaunchOrder.parse(body)
    if kind in ("cancel", "kill"):
        refuse_unknown(body, (), f"a {kind} command")
        return None
    if kind in ("step", "step_cancel"):
        from gpusched.messages.steps import StepCancel, StepLaunch
        return StepLaunch.parse(body) if kind == "step" else StepCancel.parse(body)
    if kind == "notice":
        refuse_unknown(body, ("text",), "a notice command")
        return JobNotice(required_text(body, "text", MAX_NOTICE, "a line of text"))
    if kind == "signal":
        refuse_unknown(body, ("signal",), "a signal command")
        return SignalJob(required_integer(body, "signal", 1, MAX_SIGNAL, "a signal number"))
    if kind == "suspend":
        from gpusched.messages.jobcontrol import SuspendJob
        return SuspendJob.parse(body)
    refuse_unknown(body, ("time_limit", "deadline"), "a limit command")
    return LimitJob(optional_integer(body, "time_limit", 0, bounds.MAX_TIME_LIMIT, "seconds"),
                    epoch_seconds(body.get("deadline"), "deadline"))
