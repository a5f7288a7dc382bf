"""What ``gsrun``, the controller and the agents say about a job step (pure).

- ``StepRequest``: gsrun asks for a step of a running job (``POST /v1/jobs/{id}/steps``);
  ``StepCreated`` is the answer: the step's id, nodes and tasks.
- ``StepLaunch``: the payload of a ``step`` node command, one per node of the step;
  ``StepCancel`` that of ``step_cancel``.
- ``StepEnd``: how the step ended on one node (``POST /agent/v1/jobs/{id}/steps/{s}/ended``).

Each is checked field by field where it arrives, as the job's messages are; docs/api.md
gives the shapes. The request's and its answer's checks are gpusched.messages.steprequest's
(gsrun uses them without this module's dataclasses). The I/O between the step's nodes
and gsrun is gpusched.messages.stepio.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpusched.core import bounds
from gpusched.core.steps import MAX_STEP_ID, MAX_TASKS_PER_STEP
from gpusched.errors import UsageError
from gpusched.messages.agent import (
    MAX_BYTES,
    MAX_SIGNAL,
    OUTCOMES,
    epoch_seconds,
    kept_error,
)
from gpusched.messages.fields import (
    MAX_UID,
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
    string_map,
    typed,
    words,
)
from gpusched.messages.steprequest import (
    MAX_HOST,
    check_created,
    check_io,
    check_request,
    command_argv,
    work_dir,
)

STEP_OUTCOMES = tuple(o for o in OUTCOMES if o not in ("prolog_failed", "not_started"))

LAUNCH_FIELDS = frozenset({
    "job_id", "run", "step_id", "node", "node_index", "name", "user", "uid", "gid", "argv",
    "work_dir", "environment", "umask", "tasks", "ntasks", "node_names", "tasks_per_node",
    "master_addr", "master_port", "gpu_uuids", "cpus", "mem_mb", "deadline", "output",
    "error", "input", "io", "pty", "kill_on_bad_exit", "job_name"})
END_FIELDS = frozenset({"node", "run", "outcome", "exit_code", "signal", "end_time", "error",
                        "max_rss_bytes", "cpu_usec", "tasks"})
TASK_FIELDS = frozenset({"task_id", "local_id", "gpu_uuids"})


@dataclass(frozen=True)
class StepIO:
    """Where a step's nodes connect to send its tasks' output: gsrun's I/O socket, and
    the token that proves a connection comes from the step."""

    host: str
    port: int
    token: str

    @classmethod
    def parse(cls, raw: object) -> StepIO:
        return cls(**check_io(raw))

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "token": self.token}


@dataclass(frozen=True)
class StepRequest:
    """A step of a running job, as gsrun asks for it. Counts left None take srun's
    defaults (gpusched.core.steps); ``output``/``error``/``input`` are file name patterns
    relative to ``work_dir`` (None: through gsrun)."""

    argv: tuple[str, ...]
    work_dir: str
    io: StepIO
    name: str | None = None
    nodes: int | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    gpus_per_task: int | None = None
    cpus_per_task: int | None = None
    exact: bool = False
    overlap: bool = False
    kill_on_bad_exit: bool = False
    pty: bool = False
    environment: dict[str, str] | None = None
    output: str | None = None
    error: str | None = None
    input: str | None = None

    @classmethod
    def parse(cls, raw: object) -> StepRequest:
        """Check every field's type and bounds; the first fault is a UsageError."""
        body = check_request(raw)
        return cls(**{**body, "argv": tuple(body["argv"]), "io": StepIO(**body["io"])})

    def to_json(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "work_dir": self.work_dir, "io": self.io.to_json(),
                "name": self.name, "nodes": self.nodes, "ntasks": self.ntasks,
                "ntasks_per_node": self.ntasks_per_node, "gpus_per_task": self.gpus_per_task,
                "cpus_per_task": self.cpus_per_task, "exact": self.exact,
                "overlap": self.overlap, "kill_on_bad_exit": self.kill_on_bad_exit,
                "pty": self.pty, "environment": dict(self.environment or {}),
                "output": self.output, "error": self.error, "input": self.input}


@dataclass(frozen=True)
class StepCreated:
    """The controller's answer to a StepRequest: the step and where its tasks run."""

    step_id: int
    node_names: tuple[str, ...]
    layout: dict[str, tuple[int, ...]]
    ntasks: int
    master_addr: str
    master_port: int

    @classmethod
    def parse(cls, raw: object) -> StepCreated:
        return cls(**check_created(raw))

    def to_json(self) -> dict[str, Any]:
        return {"step_id": self.step_id, "node_names": list(self.node_names),
                "layout": {k: list(v) for k, v in self.layout.items()},
                "ntasks": self.ntasks, "master_addr": self.master_addr,
                "master_port": self.master_port}


@dataclass(frozen=True)
class StepTask:
    """One task a node runs: global id, id on the node, the GPUs it sees."""

    task_id: int
    local_id: int
    gpu_uuids: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: object) -> StepTask:
        body = as_object(raw, "a task")
        refuse_unknown(body, TASK_FIELDS, "a task")
        return cls(required_integer(body, "task_id", 0, MAX_TASKS_PER_STEP - 1, "a task id"),
                   required_integer(body, "local_id", 0, MAX_TASKS_PER_STEP - 1, "a task id"),
                   words(body, "gpu_uuids", bounds.MAX_GPUS, "GPU UUIDs"))

    def to_json(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "local_id": self.local_id,
                "gpu_uuids": list(self.gpu_uuids)}


@dataclass(frozen=True)
class StepLaunch:
    """Start one node's part of a step: its tasks, as the job's user, confined to what
    the job holds on the node (``gpu_uuids``, ``cpus``, ``mem_mb``), until ``deadline``
    (the job's end by its time limit; None: none)."""

    job_id: int
    run: int
    step_id: int
    node: str
    node_index: int
    name: str
    job_name: str
    user: str
    uid: int
    gid: int
    argv: tuple[str, ...]
    work_dir: str
    tasks: tuple[StepTask, ...]
    ntasks: int
    node_names: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    master_addr: str
    master_port: int
    io: StepIO
    environment: dict[str, str]
    umask: int | None = None
    gpu_uuids: tuple[str, ...] = ()
    cpus: int = 0
    mem_mb: int = 0
    deadline: float | None = None
    output: str | None = None
    error: str | None = None
    input: str | None = None
    pty: bool = False
    kill_on_bad_exit: bool = False

    @classmethod
    def parse(cls, raw: object) -> StepLaunch:
        """Check every field's type and bounds; the first fault is a UsageError."""
        body = as_object(raw, "the step launch")
        refuse_unknown(body, LAUNCH_FIELDS, "the step launch")
        raw_tasks = typed(body, "tasks", list, [], "a list of tasks")
        if not raw_tasks or len(raw_tasks) > MAX_TASKS_PER_STEP:
            raise UsageError(f"tasks: expected 1 to {MAX_TASKS_PER_STEP} tasks")
        sizes = typed(body, "tasks_per_node", list, [], "task counts")
        if len(sizes) > bounds.MAX_NODES or not all(
                isinstance(s, int) and not isinstance(s, bool) and 0 < s <= MAX_TASKS_PER_STEP
                for s in sizes):
            raise UsageError("tasks_per_node: expected a list of task counts")
        deadline = body.get("deadline")
        return cls(
            job_id=required_integer(body, "job_id", 1, bounds.MAX_JOB_ID, "a job id"),
            run=integer(body, "run", 0, 0, bounds.MAX_INT32, "a restart count"),
            step_id=required_integer(body, "step_id", 0, MAX_STEP_ID, "a step id"),
            node=required_text(body, "node", bounds.MAX_WORD, "the node name"),
            node_index=required_integer(body, "node_index", 0, bounds.MAX_NODES, "an index"),
            name=required_text(body, "name", bounds.MAX_NAME, "a step name"),
            job_name=required_text(body, "job_name", bounds.MAX_NAME, "a job name"),
            user=required_text(body, "user", bounds.MAX_WORD, "a user name"),
            uid=required_integer(body, "uid", 0, MAX_UID, "a uid"),
            gid=required_integer(body, "gid", 0, MAX_UID, "a gid"),
            argv=tuple(command_argv(body)), work_dir=work_dir(body),
            tasks=tuple(StepTask.parse(t) for t in raw_tasks),
            ntasks=required_integer(body, "ntasks", 1, MAX_TASKS_PER_STEP, "a task count"),
            node_names=words(body, "node_names", bounds.MAX_NODES, "node names"),
            tasks_per_node=tuple(sizes),
            master_addr=required_text(body, "master_addr", MAX_HOST, "a host"),
            master_port=required_integer(body, "master_port", 1, 65_535, "a TCP port"),
            io=StepIO.parse(body.get("io")),
            environment=bounded(bounds.check_environment, string_map(body, "environment")),
            umask=optional_integer(body, "umask", 0, 0o777, "a file mode creation mask"),
            gpu_uuids=words(body, "gpu_uuids", bounds.MAX_GPUS, "GPU UUIDs"),
            cpus=integer(body, "cpus", 0, 0, bounds.MAX_CPUS, "CPUs on this node"),
            mem_mb=integer(body, "mem_mb", 0, 0, bounds.MAX_MEM_MB, "MiB on this node"),
            deadline=epoch_seconds(deadline, "deadline"),
            output=path(body, "output", "a file name pattern"),
            error=path(body, "error", "a file name pattern"),
            input=path(body, "input", "a file name pattern"),
            pty=flag(body, "pty"), kill_on_bad_exit=flag(body, "kill_on_bad_exit"))

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "run": self.run, "step_id": self.step_id,
            "node": self.node, "node_index": self.node_index, "name": self.name,
            "job_name": self.job_name, "user": self.user, "uid": self.uid, "gid": self.gid,
            "argv": list(self.argv), "work_dir": self.work_dir,
            "tasks": [t.to_json() for t in self.tasks], "ntasks": self.ntasks,
            "node_names": list(self.node_names), "tasks_per_node": list(self.tasks_per_node),
            "master_addr": self.master_addr, "master_port": self.master_port,
            "io": self.io.to_json(), "environment": dict(self.environment),
            "umask": self.umask, "gpu_uuids": list(self.gpu_uuids), "cpus": self.cpus,
            "mem_mb": self.mem_mb, "deadline": self.deadline, "output": self.output,
            "error": self.error, "input": self.input, "pty": self.pty,
            "kill_on_bad_exit": self.kill_on_bad_exit}


@dataclass(frozen=True)
class StepCancel:
    """The payload of ``step_cancel``: end the step on this node (``signal`` None:
    SIGTERM, then after the kill grace everything left), or just send it ``signal``."""

    step_id: int
    signal: int | None = None

    @classmethod
    def parse(cls, raw: object) -> StepCancel:
        body = as_object(raw, "a step_cancel command")
        refuse_unknown(body, ("step_id", "signal"), "a step_cancel command")
        return cls(required_integer(body, "step_id", 0, MAX_STEP_ID, "a step id"),
                   optional_integer(body, "signal", 1, MAX_SIGNAL, "a signal number"))

    def to_json(self) -> dict[str, Any]:
        return {"step_id": self.step_id, "signal": self.signal}


@dataclass(frozen=True)
class StepEnd:
    """How a step ended on ``node``: the worst of its tasks there (``exit_code`` the
    highest, ``signal`` if a signal killed one), each task's end, and what its cgroup or
    the tasks' rusage measured (None: not measured)."""

    node: str
    outcome: str
    run: int = 0
    exit_code: int | None = None
    signal: int | None = None
    end_time: float | None = None
    error: str | None = None
    max_rss_bytes: int | None = None
    cpu_usec: int | None = None
    tasks: tuple[tuple[int, int | None, int | None], ...] = ()

    @classmethod
    def parse(cls, raw: object) -> StepEnd:
        """Check every field's type and bounds; the first fault is a UsageError."""
        body = as_object(raw, "the step end")
        refuse_unknown(body, END_FIELDS, "the step end")
        return cls(
            node=required_text(body, "node", bounds.MAX_WORD, "the node name"),
            outcome=one_of(body, "outcome", STEP_OUTCOMES),
            run=integer(body, "run", 0, 0, bounds.MAX_INT32, "a restart count"),
            exit_code=optional_integer(body, "exit_code", 0, 255, "an exit status"),
            signal=optional_integer(body, "signal", 1, MAX_SIGNAL, "a signal number"),
            end_time=epoch_seconds(body.get("end_time")),
            error=kept_error(typed(body, "error", str, None, "an error message")),
            max_rss_bytes=optional_integer(body, "max_rss_bytes", 0, MAX_BYTES, "bytes"),
            cpu_usec=optional_integer(body, "cpu_usec", 0, MAX_BYTES, "microseconds"),
            tasks=_task_ends(body.get("tasks")))

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "outcome": self.outcome, "run": self.run,
                "exit_code": self.exit_code, "signal": self.signal,
                "end_time": self.end_time, "error": self.error,
                "max_rss_bytes": self.max_rss_bytes, "cpu_usec": self.cpu_usec,
                "tasks": [list(t) for t in self.tasks]}


def _task_ends(raw: object) -> tuple[tuple[int, int | None, int | None], ...]:
    """[[task id, exit code or null, signal or null], ...]."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_TASKS_PER_STEP:
        raise UsageError(f"tasks: expected at most {MAX_TASKS_PER_STEP} task ends")
    out = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 3:
            raise UsageError("tasks: expected [task id, exit code, signal] for each task")
        body = {"task": item[0], "exit_code": item[1], "signal": item[2]}
        out.append((required_integer(body, "task", 0, MAX_TASKS_PER_STEP - 1, "a task id"),
                    optional_integer(body, "exit_code", 0, 255, "an exit status"),
                    optional_integer(body, "signal", 1, MAX_SIGNAL, "a signal number")))
    return tuple(out)
