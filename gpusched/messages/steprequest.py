"""A step's request (``POST /v1/jobs/{id}/steps``) and its answer, checked field by
field as plain JSON: what gsrun sends, checked as the controller checks it, and what it
reads back. gpusched.messages.steps builds its frozen StepIO, StepRequest and
StepCreated from these checks, so both sides refuse the same fields with the same words.

gsrun loads this module on every start: no dataclasses, re or typing here (each a few
milliseconds; tests/cli/test_gsrun_imports.py).
"""

from __future__ import annotations

from gpusched.core import bounds
from gpusched.errors import UsageError
from gpusched.messages.fields import (
    as_object,
    bounded,
    flag,
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
from gpusched.messages.stepio import TOKEN_HEX

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpusched.messages.fields import Body

# gpusched.core.steps's bounds (tests/cli/test_gsrun_imports.py holds them equal):
# that module's dataclasses would cost gsrun's every start milliseconds.
MAX_TASKS_PER_STEP = 65_536
MAX_STEP_ID = 2**31 - 2
MAX_HOST = 255  # characters of a host name or address
_HOST_CHARACTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                             "0123456789._:-[]%")
_TOKEN_CHARACTERS = frozenset("0123456789abcdef")

REQUEST_FIELDS = frozenset({
    "argv", "name", "nodes", "ntasks", "ntasks_per_node", "gpus_per_task", "cpus_per_task",
    "exact", "overlap", "kill_on_bad_exit", "pty", "environment", "work_dir", "output",
    "error", "input", "io"})
IO_FIELDS = frozenset({"host", "port", "token"})


def check_io(raw: object) -> dict[str, Any]:
    """Where a step's nodes connect (gsrun's I/O socket) and the token that proves a
    connection comes from the step: ``{"host", "port", "token"}``, checked."""
    body = as_object(raw, "io")
    refuse_unknown(body, IO_FIELDS, "io")
    host = required_text(body, "host", MAX_HOST, "a host name or address")
    if not set(host) <= _HOST_CHARACTERS:
        raise UsageError(f"io.host: expected a host name or address, got {shown(host)}")
    token = typed(body, "token", str, "", f"{TOKEN_HEX} hexadecimal digits")
    if len(token) != TOKEN_HEX or not set(token) <= _TOKEN_CHARACTERS:
        raise UsageError(f"io.token: expected {TOKEN_HEX} lowercase hexadecimal digits")
    return {"host": host, "port": required_integer(body, "port", 1, 65_535, "a TCP port"),
            "token": token}


def command_argv(body: Body) -> list[str]:
    """The command and its arguments: bounded, and not empty."""
    argv = bounded(bounds.check_args, strings(body, "argv"))
    if not argv or not argv[0]:
        raise UsageError("argv: expected the command to run, got nothing")
    return argv


def work_dir(body: Body) -> str:
    """The tasks' working directory: an absolute path."""
    found = path(body, "work_dir", "an absolute directory path")
    if not found or not found.startswith("/"):
        raise UsageError(f"work_dir: expected an absolute directory path, got {shown(found)}")
    return found


def _count(body: Body, key: str, high: int, what: str) -> int | None:
    return optional_integer(body, key, 1, high, what)


def check_request(raw: object) -> dict[str, Any]:
    """A StepRequest's JSON, every field's type and bounds checked (the first fault is
    a UsageError), in the shape StepRequest.to_json gives: absent fields as null,
    false or {} (counts left null take srun's defaults, gpusched.core.steps)."""
    body = as_object(raw, "the step request")
    refuse_unknown(body, REQUEST_FIELDS, "the step request")
    io = body.get("io")
    if io is None:
        raise UsageError("io: expected where gsrun listens, got nothing")
    name = typed(body, "name", str, None, "a step name")
    return {
        "argv": command_argv(body), "work_dir": work_dir(body), "io": check_io(io),
        "name": None if name is None else bounded(bounds.check_text, "name", name,
                                                  bounds.MAX_NAME),
        "nodes": _count(body, "nodes", bounds.MAX_NODES, "a node count"),
        "ntasks": _count(body, "ntasks", MAX_TASKS_PER_STEP, "a task count"),
        "ntasks_per_node": _count(body, "ntasks_per_node", MAX_TASKS_PER_STEP,
                                  "tasks per node"),
        "gpus_per_task": _count(body, "gpus_per_task", bounds.MAX_GPUS, "GPUs per task"),
        "cpus_per_task": _count(body, "cpus_per_task", bounds.MAX_CPUS, "CPUs per task"),
        "exact": flag(body, "exact"), "overlap": flag(body, "overlap"),
        "kill_on_bad_exit": flag(body, "kill_on_bad_exit"), "pty": flag(body, "pty"),
        "environment": bounded(bounds.check_environment, string_map(body, "environment")),
        "output": path(body, "output", "a file name pattern"),
        "error": path(body, "error", "a file name pattern"),
        "input": path(body, "input", "a file name pattern")}


def _layout(raw: object, what: str) -> dict[str, tuple[int, ...]]:
    """{node: [task ids]}: bounded names and ids."""
    body = as_object(raw, what)
    if len(body) > bounds.MAX_NODES:
        raise UsageError(f"{what}: more than {bounds.MAX_NODES} nodes")
    out: dict[str, tuple[int, ...]] = {}
    for node, tasks in body.items():
        bounded(bounds.check_text, what, node, bounds.MAX_WORD)
        if not isinstance(tasks, list) or len(tasks) > MAX_TASKS_PER_STEP or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < MAX_TASKS_PER_STEP
                for t in tasks):
            raise UsageError(f"{what}: expected a list of task ids for {shown(node)}")
        out[node] = tuple(tasks)
    return out


def check_created(raw: object) -> dict[str, Any]:
    """The controller's answer to a step request, checked: ``step_id``, ``node_names``
    (a tuple), ``layout`` ({node: tuple of task ids}), ``ntasks``, ``master_addr`` and
    ``master_port`` (StepCreated's fields)."""
    body = as_object(raw, "the step")
    return {
        "step_id": required_integer(body, "step_id", 0, MAX_STEP_ID, "a step id"),
        "node_names": words(body, "node_names", bounds.MAX_NODES, "node names"),
        "layout": _layout(body.get("layout"), "layout"),
        "ntasks": required_integer(body, "ntasks", 1, MAX_TASKS_PER_STEP, "a task count"),
        "master_addr": required_text(body, "master_addr", MAX_HOST, "a host"),
        "master_port": required_integer(body, "master_port", 1, 65_535, "a TCP port")}
