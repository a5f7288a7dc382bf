"""An administrator's request to create or change an advance reservation
(``POST /v1/reservations``, ``PATCH /v1/reservations/NAME``), typed and bounded once.

Times are ISO 8601 with a zone; ``duration`` is seconds. What a
reservation holds: ``nodes`` (whole nodes, or ``gpus`` GPUs among them), else
``node_count`` whole nodes or ``gpus`` GPUs picked among ``partition``'s nodes (every
node without one). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpusched.core.reservations import (
    FLAGS,
    MAX_NAME,
    MAX_NAMES,
    MAX_NODES,
    MAX_SPAN,
    ReservationError,
    check_flags,
    check_name,
    check_names,
)
from gpusched.errors import UsageError
from gpusched.messages.fields import (
    as_object,
    optional_integer,
    refuse_unknown,
    shown,
    text,
    words,
)

FIELDS = frozenset({"name", "start", "end", "duration", "nodes", "gpus", "node_count",
                    "partition", "users", "accounts", "flags"})
MAX_GPUS = 1_000_000
_LATEST = 4_102_444_800.0  # 2100-01-01: later times are refused as mistakes


def _time(body: dict[str, Any], key: str) -> float | None:
    """An ISO 8601 time with its zone, as POSIX seconds (None when absent)."""
    value = text(body, key, 40, "an ISO 8601 time with its zone")
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(f"{key}: expected an ISO 8601 time, got {shown(value)}") from None
    if when.tzinfo is None:
        raise UsageError(f"{key}: expected an ISO 8601 time with its zone, got {shown(value)}")
    seconds = when.timestamp()
    if not 0 <= seconds <= _LATEST:
        raise UsageError(f"{key}: expected a time from 1970 to 2100, got {shown(value)}")
    return seconds


def _checked(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except ReservationError as exc:
        raise UsageError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class ReservationRequest:
    """A reservation as asked for; None: not given (on an update: unchanged)."""

    name: str | None = None
    start: float | None = None
    end: float | None = None
    duration: int | None = None
    nodes: tuple[str, ...] | None = None
    gpus: int | None = None
    node_count: int | None = None
    partition: str | None = None
    users: tuple[str, ...] | None = None
    accounts: tuple[str, ...] | None = None
    flags: frozenset[str] | None = None

    @classmethod
    def parse(cls, raw: object) -> ReservationRequest:
        """Check every field of a JSON body; UsageError naming the first that is wrong."""
        body = as_object(raw, "reservation")
        refuse_unknown(body, FIELDS, "reservation")
        name = text(body, "name", 64, "a reservation name")
        if name is not None:
            _checked(check_name, name)
        start, end = _time(body, "start"), _time(body, "end")
        duration = optional_integer(body, "duration", 1, int(MAX_SPAN), "seconds (1 or more)")
        if end is not None and duration is not None:
            raise UsageError("give end or duration, not both")
        nodes = (words(body, "nodes", MAX_NODES, "node names") if body.get("nodes") is not None
                 else None)
        if nodes is not None and not nodes:
            raise UsageError("nodes: expected at least one node")

        def names(key: str) -> tuple[str, ...] | None:
            if body.get(key) is None:
                return None
            return tuple(_checked(check_names, key, words(body, key, MAX_NAMES, key)))

        flags = None
        if body.get("flags") is not None:
            listed = words(body, "flags", len(FLAGS), "flags")
            flags = _checked(check_flags, listed)
        return cls(
            name=name, start=start, end=end, duration=duration, nodes=nodes,
            gpus=optional_integer(body, "gpus", 1, MAX_GPUS, "a GPU count (1 or more)"),
            node_count=optional_integer(body, "node_count", 1, MAX_NODES,
                                        "a node count (1 or more)"),
            partition=text(body, "partition", 64, "a partition name"),
            users=names("users"), accounts=names("accounts"), flags=flags)

    def to_json(self) -> dict[str, Any]:
        """The request as the API takes it (only what is given)."""
        out: dict[str, Any] = {
            "name": self.name, "start": _iso(self.start), "end": _iso(self.end),
            "duration": self.duration, "gpus": self.gpus, "node_count": self.node_count,
            "partition": self.partition,
            "nodes": None if self.nodes is None else list(self.nodes),
            "users": None if self.users is None else list(self.users),
            "accounts": None if self.accounts is None else list(self.accounts),
            "flags": None if self.flags is None else sorted(self.flags)}
        return {key: value for key, value in out.items() if value is not None}



def _iso(seconds: float | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC).isoformat()


def reservation_name(body: dict[str, Any]) -> str | None:
    """A submission's ``reservation``: the advance reservation it runs in (null: none)."""
    value = text(body, "reservation", MAX_NAME, "a reservation name")
    if value is not None:
        try:
            check_name(value)
        except ReservationError as err:
            raise UsageError(f"reservation: {err}") from None
    return value
