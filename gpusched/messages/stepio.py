"""The frames a step's nodes and its ``gsrun`` exchange on gsrun's I/O socket (pure,
light: the step supervisor imports it too).

A frame is a header, ``struct ">BII"`` (kind, task id, payload length), then the
payload, at most MAX_PAYLOAD bytes. Node to gsrun: HELLO first (JSON: the step's token,
job and step ids, the node's index and its task ids), then STDOUT and STDERR (raw
bytes of one task's output), EXIT (JSON ``{"exit_code", "signal"}``, one per task) and
ERROR (UTF-8 text: the node could not start its tasks). gsrun to node: STDIN (bytes for
task 0; empty: end of input), SIGNAL (the number in ASCII digits, for every task) and
WINSIZE (``struct ">HH"`` rows and columns, for a terminal).

``Decoder`` takes bytes as they arrive and gives whole frames; a length over the bound
or an unknown kind is a FrameError, and the connection is closed.

gsrun loads this module on every start: it imports none of dataclasses, typing, hmac
or json (tests/cli/test_gsrun_imports.py), each a few milliseconds. JSON is written
with ``json`` on the node's side (which has it loaded) and read with
gpusched.client.jsontext on gsrun's (which has that loaded).
"""

from __future__ import annotations

import struct

# hmac.compare_digest is this function (or _hashlib's copy of it): a comparison whose
# time does not depend on where the two values differ. hmac itself loads hashlib.
from _operator import _compare_digest as compare_digest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

HEADER = struct.Struct(">BII")
WINSIZE = struct.Struct(">HH")
MAX_PAYLOAD = 65_536
MAX_HELLO_TASKS = 65_536
TOKEN_HEX = 64  # characters: 32 random bytes

HELLO, STDOUT, STDERR, EXIT, STDIN, SIGNAL, WINDOW, ERROR = range(1, 9)
KINDS = frozenset(range(1, 9))
FROM_NODE = frozenset({HELLO, STDOUT, STDERR, EXIT, ERROR})
TO_NODE = frozenset({STDIN, SIGNAL, WINDOW})


class FrameError(ValueError):
    """Bytes that are not a frame of this protocol; the connection is closed."""


class _Frozen:
    """A value of named fields, set once by ``__init__``: equal to another of its class
    with equal fields, hashable, and read-only (as a frozen dataclass)."""

    __slots__: tuple[str, ...] = ()

    def _fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Frozen) or other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={value!r}"
                          for name, value in zip(self.__slots__, self._fields()))
        return f"{self.__class__.__name__}({shown})"

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")


class Frame(_Frozen):
    """One frame: its kind, the task it is about (0 where none) and its payload."""

    __slots__ = ("kind", "task", "payload")
    kind: int
    task: int
    payload: bytes

    def __init__(self, kind: int, task: int, payload: bytes) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "task", task)
        object.__setattr__(self, "payload", payload)

    def json(self) -> Any:
        """The payload as JSON (HELLO, EXIT); a FrameError if it is not."""
        from gpusched.client.jsontext import loads

        try:
            return loads(self.payload)
        except (UnicodeDecodeError, ValueError):
            raise FrameError(f"frame kind {self.kind}: the payload is not JSON") from None


def encode(kind: int, task: int, payload: bytes = b"") -> bytes:
    """One frame's bytes."""
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind}")
    if len(payload) > MAX_PAYLOAD:
        raise FrameError(f"a frame's payload is at most {MAX_PAYLOAD} bytes, got {len(payload)}")
    return HEADER.pack(kind, task, len(payload)) + payload


def chunks(kind: int, task: int, data: bytes) -> Iterator[bytes]:
    """``data`` as frames of at most MAX_PAYLOAD bytes each."""
    for start in range(0, len(data), MAX_PAYLOAD):
        yield encode(kind, task, data[start:start + MAX_PAYLOAD])


def hello(token: str, job_id: int, step_id: int, node_index: int, tasks: list[int]) -> bytes:
    """The first frame a node sends."""
    import json

    return encode(HELLO, 0, json.dumps({"token": token, "job_id": job_id, "step_id": step_id,
                                        "node_index": node_index, "tasks": tasks}).encode())


def exit_frame(task: int, exit_code: int | None, signal: int | None) -> bytes:
    """How one task ended."""
    import json

    return encode(EXIT, task, json.dumps({"exit_code": exit_code, "signal": signal}).encode())


class Hello(_Frozen):
    """A node's HELLO, checked."""

    __slots__ = ("job_id", "step_id", "node_index", "tasks")
    job_id: int
    step_id: int
    node_index: int
    tasks: tuple[int, ...]

    def __init__(self, job_id: int, step_id: int, node_index: int,
                 tasks: tuple[int, ...]) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "step_id", step_id)
        object.__setattr__(self, "node_index", node_index)
        object.__setattr__(self, "tasks", tasks)


def check_hello(frame: Frame, token: str, job_id: int, step_id: int) -> Hello:
    """The HELLO of a node of this step, or a FrameError (a wrong token among them)."""
    if frame.kind != HELLO:
        raise FrameError("the first frame is not a HELLO")
    body = frame.json()
    if not isinstance(body, dict):
        raise FrameError("HELLO: expected a JSON object")
    sent = body.get("token")
    if not isinstance(sent, str) or not compare_digest(
            sent.encode("utf-8", "surrogatepass"), token.encode()):
        raise FrameError("HELLO: wrong token")
    if body.get("job_id") != job_id or body.get("step_id") != step_id:
        raise FrameError("HELLO: for another step")
    index, tasks = body.get("node_index"), body.get("tasks")
    if not isinstance(index, int) or not _small_int(index) or not isinstance(tasks, list) \
            or not 0 < len(tasks) <= MAX_HELLO_TASKS or not all(map(_small_int, tasks)):
        raise FrameError("HELLO: expected a node index and its task ids")
    return Hello(job_id, step_id, index, tuple(tasks))


def check_exit(frame: Frame) -> tuple[int | None, int | None]:
    """An EXIT frame's exit code and signal, each None or in range."""
    body = frame.json()
    if not isinstance(body, dict):
        raise FrameError("EXIT: expected a JSON object")
    code, sig = body.get("exit_code"), body.get("signal")
    if code is not None and not (_small_int(code) and code <= 255):
        raise FrameError("EXIT: exit_code out of range")
    if sig is not None and not (_small_int(sig) and 1 <= sig <= 128):
        raise FrameError("EXIT: signal out of range")
    return code, sig


def _small_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32


class Decoder:
    """Whole frames out of a byte stream, for one direction (``allowed`` kinds)."""

    def __init__(self, allowed: frozenset[int] = KINDS) -> None:
        self._buffer = bytearray()
        self._allowed = allowed

    def feed(self, data: bytes) -> list[Frame]:
        """The frames ``data`` completes; a FrameError for bytes that cannot be one."""
        self._buffer += data
        frames: list[Frame] = []
        while len(self._buffer) >= HEADER.size:
            kind, task, length = HEADER.unpack_from(self._buffer)
            if kind not in self._allowed:
                raise FrameError(f"unexpected frame kind {kind}")
            if length > MAX_PAYLOAD:
                raise FrameError(f"a frame of {length} bytes; at most {MAX_PAYLOAD}")
            end = HEADER.size + length
            if len(self._buffer) < end:
                break
            frames.append(Frame(kind, task, bytes(self._buffer[HEADER.size:end])))
            del self._buffer[:end]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held."""
        return len(self._buffer)
