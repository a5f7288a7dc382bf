"""What a node's agent reports to the controller: how a run of a job ended (``POST
/agent/v1/jobs/{id}/ended``) and what the node's health check found (``POST
/agent/v1/nodes/{node}/health``), each parsed once by the controller."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

from gpusched.core import bounds
from gpusched.errors import UsageError
from gpusched.messages.fields import (
    as_object,
    one_of,
    optional_integer,
    refuse_unknown,
    required_text,
    shown,
    text,
    typed,
)

MAX_SIGNAL = signal.NSIG - 1
MAX_ERROR_TEXT = 2000  # characters of an agent's error message kept with the job
MAX_ERROR_INPUT = 64 * 1024  # characters of one an end report may bring (then cut)
MAX_EPOCH = 253_402_300_799  # 9999-12-31T23:59:59Z, the last second Python can show
# How a job ended, as its supervisor (or the agent, for a launch it refused) tells it.
# out_of_memory: the OOM killer ended it in its cgroup; prolog_failed: the node's prolog
# failed, so nothing of the job ran (it is requeued and the node drained); not_started:
# nothing of it ran (its supervisor was lost before it forked the job, or the node's
# disk could not take the job's directory: it is requeued).
OUTCOMES = ("completed", "failed", "launch_failed", "cancelled", "timeout", "out_of_memory",
            "prolog_failed", "not_started")
MAX_BYTES = (1 << 63) - 1  # a cgroup's counters are 64-bit
MAX_HEALTH_REASON = 256  # characters of a node health check's reason
END_FIELDS = frozenset({"node", "run", "outcome", "exit_code", "signal", "end_time", "error",
                        "max_rss_bytes", "cpu_usec", "epilog_error"})
HEALTH_FIELDS = frozenset({"node", "ok", "reason"})


@dataclass(frozen=True)
class JobEnd:
    """How one run of a job ended on ``node``, as its agent reports it.

    ``end_time`` is in seconds since the epoch (None: when the report arrives);
    ``exit_code`` is set when the job exited, ``signal`` when a signal killed it;
    ``error`` is kept to MAX_ERROR_TEXT characters of UTF-8 text without NUL. ``run``
    is the run that ended (the job's ``restarts`` when it was launched); an end for a
    run that is not the job's current one changes nothing. None (an agent older than
    node commands) stands for the current run. ``max_rss_bytes`` and ``cpu_usec`` are
    the peak memory and CPU time its cgroup counted (None: not confined, not measured);
    ``epilog_error`` says why the node's epilog failed after the job (the node is
    drained with it).
    """

    node: str
    outcome: str
    exit_code: int | None = None
    signal: int | None = None
    end_time: float | None = None
    error: str | None = None
    run: int | None = None
    max_rss_bytes: int | None = None
    cpu_usec: int | None = None
    epilog_error: str | None = None

    @classmethod
    def parse(cls, raw: object) -> JobEnd:
        """Check every field's type and bounds; the first fault is a UsageError."""
        body = as_object(raw, "the job end")
        refuse_unknown(body, END_FIELDS, "the job end")
        outcome = one_of(body, "outcome", OUTCOMES)
        return cls(
            node=required_text(body, "node", bounds.MAX_WORD, "the node name"),
            outcome=outcome,
            exit_code=optional_integer(body, "exit_code", 0, 255, "an exit status"),
            signal=optional_integer(body, "signal", 1, MAX_SIGNAL, "a signal number"),
            end_time=epoch_seconds(body.get("end_time")),
            error=kept_error(typed(body, "error", str, None, "an error message")),
            run=optional_integer(body, "run", 0, bounds.MAX_INT32, "a restart count"),
            max_rss_bytes=optional_integer(body, "max_rss_bytes", 0, MAX_BYTES, "bytes"),
            cpu_usec=optional_integer(body, "cpu_usec", 0, MAX_BYTES, "microseconds"),
            epilog_error=kept_error(typed(body, "epilog_error", str, None, "an error message")))

    def to_json(self) -> dict[str, Any]:
        """The report as ``POST /agent/v1/jobs/{id}/ended`` takes it."""
        return {"node": self.node, "run": self.run, "outcome": self.outcome,
                "exit_code": self.exit_code, "signal": self.signal,
                "end_time": self.end_time, "error": self.error,
                "max_rss_bytes": self.max_rss_bytes, "cpu_usec": self.cpu_usec,
                "epilog_error": self.epilog_error}


@dataclass(frozen=True)
class NodeHealth:
    """What a node's health check found (``POST /agent/v1/nodes/{node}/health``): ``ok``,
    or not with ``reason`` (the check's first line of output, or why it could not run).
    A failure drains the node with that reason; a pass lifts a drain an earlier failed
    check made (never one an administrator, a prolog or an epilog made)."""

    node: str
    ok: bool
    reason: str | None = None

    @classmethod
    def parse(cls, raw: object) -> NodeHealth:
        """Check every field's type and bounds; the first fault is a UsageError."""
        body = as_object(raw, "the health report")
        refuse_unknown(body, HEALTH_FIELDS, "the health report")
        ok = typed(body, "ok", bool, None, "true or false")
        if ok is None:
            raise UsageError("ok: expected true or false, got nothing")
        return cls(node=required_text(body, "node", bounds.MAX_WORD, "the node name"), ok=ok,
                   reason=text(body, "reason", MAX_HEALTH_REASON, "the check's reason"))

    def to_json(self) -> dict[str, Any]:
        """The report as ``POST /agent/v1/nodes/{node}/health`` takes it."""
        return {"node": self.node, "ok": self.ok, "reason": self.reason}


def error_text(error: str | None) -> str | None:
    """An error message as a job end may carry it: at most MAX_ERROR_TEXT characters of
    UTF-8 text without NUL (what the agent sends, whatever a supervisor wrote)."""
    if error is None:
        return None
    text = error.replace("\0", "").encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT - 3] + "..."


def kept_error(value: str | None) -> str | None:
    """The error as kept: up to MAX_ERROR_INPUT characters are taken and cut down by
    error_text, so that an agent whose message runs long still gets its end recorded."""
    if value is not None and len(value) > MAX_ERROR_INPUT:
        raise UsageError(f"error: expected at most {MAX_ERROR_INPUT} characters, got "
                         f"{len(value)}")
    return error_text(value)


def epoch_seconds(value: object, name: str = "end_time") -> float | None:
    """Seconds since the epoch, from 0 to MAX_EPOCH, or None (field ``name``)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not 0 <= value <= MAX_EPOCH:  # NaN and infinities fail this too
        raise UsageError(f"{name}: expected seconds since the epoch from 0 to {MAX_EPOCH}, "
                         f"got {shown(value)}")
    return float(value)
