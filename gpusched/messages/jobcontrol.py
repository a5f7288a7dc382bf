"""The payload of a ``suspend`` node command (gcontrol suspend and resume), typed (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpusched.core import bounds
from gpusched.errors import UsageError
from gpusched.messages.fields import Body, optional_integer, refuse_unknown, typed
from gpusched.messages.reports import epoch_seconds

SUSPEND_FIELDS = ("suspend", "time_limit", "deadline")


@dataclass(frozen=True)
class SuspendJob:
    """Stop (``suspend`` true) or continue every process of the job on the node. While
    suspended its time limit does not run; on resume ``time_limit`` is its limit counted
    from the run's start with the time suspended added (None: none) and ``deadline``
    when its steps must end (epoch seconds; None: no limit)."""

    suspend: bool
    time_limit: int | None = None
    deadline: float | None = None

    @classmethod
    def parse(cls, body: Body) -> SuspendJob:
        """Check the payload's fields; the first fault is a UsageError."""
        refuse_unknown(body, SUSPEND_FIELDS, "a suspend command")
        suspend = typed(body, "suspend", bool, None, "true or false")
        if suspend is None:
            raise UsageError("suspend: expected true or false")
        return cls(suspend, optional_integer(body, "time_limit", 0, 2 * bounds.MAX_TIME_LIMIT,
                                             "seconds"),
                   epoch_seconds(body.get("deadline"), "deadline"))

    def to_json(self) -> dict[str, Any]:
        """The payload as the agent takes it."""
        return {"suspend": self.suspend, "time_limit": self.time_limit,
                "deadline": self.deadline}
