"""The idle-GPU policy: which policy a job is under, and what is due for it now.

A partition or a QOS may carry a policy: after ``warn_after`` seconds of idle GPUs a
running job is warned (a line in its output file, a flag in gqueue); ``action_after``
seconds after the warning, if its GPUs stayed idle, it is requeued or cancelled. The
QOS's policy wins over the partition's when both have one; a QOS with ``action =
"off"`` exempts its jobs from their partition's policy. Pure: the caller gives the
times.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpusched.core.timefmt import format_duration

IDLE_ACTIONS = ("off", "warn", "requeue", "cancel")
# The bounds of both times, in seconds: a second to 30 days. The agents' sample
# interval is the real granularity.
MIN_IDLE_TIME, MAX_IDLE_TIME = 1, 30 * 86_400


@dataclass(frozen=True)
class IdlePolicy:
    """One partition's or QOS's idle policy; ``source`` names it ("partition gpu")."""

    action: str  # one of IDLE_ACTIONS
    warn_after: int | None = None  # None only with "off"
    action_after: int | None = None  # set exactly for "requeue" and "cancel"
    source: str = ""


def policy_from(source: str, action: str | None, warn_after: int | None,
                action_after: int | None) -> IdlePolicy | None:
    """The policy stored on a partition or QOS row (None: it has none)."""
    if action is None:
        return None
    return IdlePolicy(action, warn_after, action_after, source)


def settings_error(action: str | None, warn_after: int | None,
                   action_after: int | None) -> tuple[str, str] | None:
    """What is wrong with one table's three settings, as (key, what was expected);
    None when nothing is."""
    actions = "one of " + ", ".join(f'"{a}"' for a in IDLE_ACTIONS)
    if action is None:
        if warn_after is not None or action_after is not None:
            return "idle_action", f"{actions} (idle_warn_after and idle_action_after need it)"
        return None
    if action not in IDLE_ACTIONS:
        return "idle_action", actions
    if action == "off":
        for key, value in (("idle_warn_after", warn_after), ("idle_action_after", action_after)):
            if value is not None:
                return key, 'nothing with idle_action = "off" (it exempts from the policy)'
        return None
    if warn_after is None:
        return "idle_warn_after", f'a time (required with idle_action = "{action}")'
    if action == "warn" and action_after is not None:
        return "idle_action_after", 'nothing with idle_action = "warn" (no action follows)'
    if action != "warn" and action_after is None:
        return "idle_action_after", f'a time (required with idle_action = "{action}")'
    return None


def effective(partition: IdlePolicy | None, qos: IdlePolicy | None) -> IdlePolicy | None:
    """The policy a job is under: its QOS's when that has one, else its partition's;
    None when there is none or it is off."""
    chosen = qos if qos is not None else partition
    return None if chosen is None or chosen.action == "off" else chosen


@dataclass(frozen=True)
class Due:
    """What the policy asks for now: ``warn`` or the action (``requeue``/``cancel``),
    with the line for the job's output and the reason to record."""

    step: str
    message: str
    reason: str


def due(policy: IdlePolicy | None, idle_since: datetime | None, warned_at: datetime | None,
        now: datetime, idle_percent: float) -> Due | None:
    """What is due for a running job whose GPUs have been idle since ``idle_since``
    (None: they are busy) and that was warned at ``warned_at`` (None: not yet)."""
    if policy is None or idle_since is None or policy.warn_after is None:
        return None
    idle_for = (now - idle_since).total_seconds()
    threshold = f"at most {idle_percent:g}% busy"
    if warned_at is None:
        if idle_for < policy.warn_after:
            return None
        then = ("nothing more happens" if policy.action == "warn" else
                f"it will be {'requeued' if policy.action == 'requeue' else 'cancelled'} in "
                f"{format_duration(policy.action_after)} unless they are used")
        reason = (f"GPUs idle ({threshold}) for {format_duration(idle_for)} "
                  f"({policy.source} idle policy)")
        return Due("warn", f"its {reason}; {then}", reason)
    if policy.action not in ("requeue", "cancel") or policy.action_after is None:
        return None
    if (now - warned_at).total_seconds() < policy.action_after:
        return None
    done = "requeued" if policy.action == "requeue" else "cancelled"
    reason = (f"GPUs idle ({threshold}) for {format_duration(idle_for)}, "
              f"{format_duration((now - warned_at).total_seconds())} after the warning "
              f"({policy.source} idle policy)")
    return Due(policy.action, f"{done}: its {reason}", reason)
