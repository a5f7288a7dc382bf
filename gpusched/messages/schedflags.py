"""sbatch's scheduling flags of a submission (``POST /v1/jobs``): ``nice``,
``priority``, ``open_mode``, ``time_min`` and ``deadline``, each checked for type and
bounds here (who may set which is the database layer's part: gpusched.db.submit)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpusched.core import bounds
from gpusched.errors import UsageError
from gpusched.messages.fields import Body, optional_integer, shown, typed

FIELDS = ("nice", "priority", "open_mode", "time_min", "deadline")
MAX_NICE = 2_147_483_645  # sbatch's bound, either way
OPEN_MODES = ("append", "truncate")
DEADLINE_EXPECTED = "an ISO 8601 time with a zone, such as 2026-12-24T18:30:00+00:00"


@dataclass(frozen=True, slots=True)
class SchedFlags:
    """``nice``: subtracted from the job's priority (negative: only an administrator);
    ``priority``: a number replacing it (only an administrator); ``open_mode``: whether
    the output files are appended to or truncated (None: appended); ``time_min``:
    seconds, the least time limit backfill may cut the job's down to; ``deadline``: the
    job never starts unless it can end by then."""

    nice: int = 0
    priority: float | None = None
    open_mode: str | None = None
    time_min: int | None = None
    deadline: datetime | None = None

    @classmethod
    def of_submission(cls, body: Body, time_limit: int | str | None,
              begin_time: datetime | None) -> SchedFlags:
        """The flags of a submission whose (parsed) time limit and begin time are
        given: a time_min above the time limit and a deadline before the begin time
        are refused, as sbatch refuses them."""
        nice = optional_integer(body, "nice", -MAX_NICE, MAX_NICE, "a nice adjustment")
        time_min = optional_integer(body, "time_min", 0, bounds.MAX_TIME_LIMIT, "seconds")
        if time_min is not None and isinstance(time_limit, int) and time_min > time_limit:
            raise UsageError(f"time_min: {time_min} seconds is more than the time limit "
                             f"({time_limit} seconds)")
        open_mode = typed(body, "open_mode", str, None, "append or truncate")
        if open_mode is not None and open_mode not in OPEN_MODES:
            raise UsageError(f"open_mode: expected append or truncate, got {shown(open_mode)}")
        deadline = _deadline(body.get("deadline"))
        if deadline is not None and begin_time is not None and deadline < begin_time:
            raise UsageError("deadline: it is before the begin time, so the job could "
                             "never run")
        return cls(nice or 0, _priority(body.get("priority")), open_mode, time_min, deadline)

    def to_json(self) -> dict[str, Any]:
        """The flags given, as ``POST /v1/jobs`` takes them (a job with none sends none)."""
        found = {"nice": self.nice or None, "priority": self.priority,
                 "open_mode": self.open_mode, "time_min": self.time_min,
                 "deadline": None if self.deadline is None else self.deadline.isoformat()}
        return {key: value for key, value in found.items() if value is not None}


def _priority(value: object) -> float | None:
    """``priority``: a number of 0 or more that replaces the computed priority."""
    if value is None:
        return None
    number = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an integer of hundreds of digits
            number = None
    if number is None or not 0 <= number < float("inf"):
        raise UsageError(f"priority: expected a number of 0 or more, got {shown(value)}")
    return number


def _deadline(value: object) -> datetime | None:
    if value is None:
        return None
    moment = None
    if isinstance(value, str) and len(value) <= 64:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            moment = None
    if moment is None or moment.tzinfo is None:
        raise UsageError(f"deadline: expected {DEADLINE_EXPECTED}, got {shown(value)}")
    return moment
