"""Dynamic MIG's node command: a MIG layout for a node's agent to give one idle GPU.

The controller stores the payload (:class:`MigLayout`: the GPU's UUID and the target
layout as profile names, largest first) in a ``mig`` node command, which carries no job
(``job_id`` null, ``run`` 0). The agent reads the whole command with
:meth:`MigCommand.parse`; every field is typed and bounded, and a fault is a UsageError
that names the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpusched.core import bounds
from gpusched.core.mig_layout import MAX_INSTANCES
from gpusched.errors import UsageError
from gpusched.messages.fields import (
    as_object,
    refuse_unknown,
    required_integer,
    required_text,
    shown,
    typed,
)

MIG_KIND = "mig"
MAX_GPU_UUID = 128  # characters of a GPU UUID (the driver's are 40)
MAX_PROFILE = 32  # characters of a MIG profile name
_GPU_UUID = re.compile(r"GPU-[0-9A-Za-z-]{1,124}")
_PROFILE = re.compile(r"[1-7]g\.[0-9]{1,4}gb")
_LAYOUT_FIELDS = ("gpu_uuid", "layout")
_COMMAND_FIELDS = ("kind", "node", "job_id", "run", "seq", "payload")


@dataclass(frozen=True, slots=True)
class MigLayout:
    """Give GPU ``gpu_uuid`` (its parent UUID, ``GPU-...``) the MIG slices ``layout``
    (profile names such as ``1g.10gb``, 1 to MAX_INSTANCES of them)."""

    gpu_uuid: str
    layout: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.gpu_uuid, str) or not _GPU_UUID.fullmatch(self.gpu_uuid):
            raise UsageError(f"gpu_uuid: expected a GPU UUID (GPU-...), got {shown(self.gpu_uuid)}")
        layout = self.layout
        if not isinstance(layout, tuple) or not 1 <= len(layout) <= MAX_INSTANCES:
            raise UsageError(f"layout: expected 1 to {MAX_INSTANCES} MIG profile names, "
                             f"got {shown(layout)}")
        for name in layout:
            if not isinstance(name, str) or len(name) > MAX_PROFILE \
                    or not _PROFILE.fullmatch(name):
                raise UsageError(f"layout: expected MIG profile names such as '1g.10gb', "
                                 f"got {shown(name)}")

    @classmethod
    def parse(cls, raw: object) -> MigLayout:
        """Check a stored or received payload."""
        body = as_object(raw, "the MIG layout")
        refuse_unknown(body, _LAYOUT_FIELDS, "the MIG layout")
        uuid = required_text(body, "gpu_uuid", MAX_GPU_UUID, "a GPU UUID (GPU-...)")
        layout = typed(body, "layout", list, None, "a list of MIG profile names")
        if layout is None:
            raise UsageError("layout: expected a list of MIG profile names, got nothing")
        return cls(uuid, tuple(layout))

    def to_json(self) -> dict[str, Any]:
        """The payload as it is stored and travels."""
        return {"gpu_uuid": self.gpu_uuid, "layout": list(self.layout)}


@dataclass(frozen=True, slots=True)
class MigCommand:
    """A ``mig`` node command as its agent receives it: number ``seq`` for ``node``."""

    node: str
    seq: int
    layout: MigLayout

    @classmethod
    def parse(cls, raw: object) -> MigCommand:
        """Check the whole command: kind ``mig``, no job, its node, number and payload."""
        body = as_object(raw, "the node command")
        refuse_unknown(body, _COMMAND_FIELDS, "the node command")
        if body.get("kind") != MIG_KIND:
            raise UsageError(f"kind: expected {MIG_KIND!r}, got {shown(body.get('kind'))}")
        for key in ("job_id", "run"):
            value = body.get(key)
            if value is not None and (type(value) is not int or value != 0):
                raise UsageError(f"{key}: a MIG command is for no job, got {shown(value)}")
        node = required_text(body, "node", bounds.MAX_WORD, "the node name")
        seq = required_integer(body, "seq", 1, bounds.MAX_JOB_ID, "a command number")
        return cls(node, seq, MigLayout.parse(body.get("payload")))

    def to_json(self) -> dict[str, Any]:
        """The command as it travels to its node."""
        return {"kind": MIG_KIND, "node": self.node, "job_id": None, "run": 0,
                "seq": self.seq, "payload": self.layout.to_json()}
