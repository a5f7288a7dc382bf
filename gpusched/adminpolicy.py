"""The admin configuration's policy settings beside partitions, accounts, users and
QOS (gpusched.adminconfig reads those): the idle-GPU policy of a partition or QOS,
GPU-hour budgets of accounts and users, and the cluster's license counts."""

from __future__ import annotations

from typing import Any

from gpusched.config import TableReader
from gpusched.core.budgets import MAX_GPU_HOURS, PERIODS
from gpusched.core.idle_policy import (
    IDLE_ACTIONS,
    MAX_IDLE_TIME,
    MIN_IDLE_TIME,
    settings_error,
)
from gpusched.core.timefmt import TimeFormatError, parse_time_limit

IDLE_KEYS = ("idle_warn_after", "idle_action", "idle_action_after")


def _idle_time(r: TableReader, key: str) -> int | None:
    expected = "a time from '0:01' (a second) to '30-00:00:00' (30 days), such as '30:00'"
    text = r.get(key, str, None, expected)
    if text is None:
        return None
    try:
        seconds = parse_time_limit(text)
    except TimeFormatError:
        raise r.fail(key, expected) from None
    if seconds is None or not MIN_IDLE_TIME <= seconds <= MAX_IDLE_TIME:
        raise r.fail(key, expected)
    return seconds


def idle_policy(r: TableReader) -> dict[str, Any]:
    """``idle_action`` (off, warn, requeue, cancel), ``idle_warn_after`` and
    ``idle_action_after`` (times), checked together."""
    expected = "one of " + ", ".join(f'"{a}"' for a in IDLE_ACTIONS)
    action = r.get("idle_action", str, None, expected)
    if action is not None:
        action = action.lower()
        if action not in IDLE_ACTIONS:
            raise r.fail("idle_action", expected)
    values = {"idle_warn_after": _idle_time(r, "idle_warn_after"), "idle_action": action,
              "idle_action_after": _idle_time(r, "idle_action_after")}
    error = settings_error(action, values["idle_warn_after"], values["idle_action_after"])
    if error is not None:
        raise r.fail(*error)
    return values


_HOURS = f"a number of GPU-hours from 0 to {MAX_GPU_HOURS:.0f}"


def gpu_hours(r: TableReader, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise r.fail(key, _HOURS)
    try:
        hours = float(value)
    except OverflowError:
        raise r.fail(key, _HOURS) from None
    if not 0 <= hours <= MAX_GPU_HOURS:  # NaN fails too
        raise r.fail(key, _HOURS)
    return hours


def budget_period(r: TableReader) -> str:
    expected = "one of " + ", ".join(f'"{p}"' for p in PERIODS)
    period = r.get("gpu_hours_period", str, "none", expected).lower()
    if period not in PERIODS:
        raise r.fail("gpu_hours_period", expected)
    if "gpu_hours" not in r.table and "gpu_hours_period" in r.table:
        raise r.fail("gpu_hours_period", "it left out without gpu_hours")
    return str(period)


def user_budgets(r: TableReader, accounts: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """``gpu_hours``: one number (a budget in each of the user's accounts) or a table of
    account = GPU-hours (only those, each one of the user's accounts)."""
    raw = r.table.get("gpu_hours")
    if raw is None:
        return ()
    if isinstance(raw, dict):
        for name in raw:
            if name not in accounts:
                raise r.fail("gpu_hours", f"a table of the user's accounts {list(accounts)}, "
                                          f"not {name!r}")
        return tuple((name, gpu_hours(r, "gpu_hours", raw[name])) for name in accounts
                     if name in raw)
    hours = gpu_hours(r, "gpu_hours", raw)
    return tuple((name, hours) for name in accounts)


def license_counts(r: TableReader) -> dict[str, int]:
    from gpusched.core.licenses import (
        MAX_CLUSTER_LICENSES,
        MAX_LICENSE_COUNT,
        valid_name,
    )

    counts: dict[str, int] = {}
    for name in r.table:
        if not valid_name(name):
            raise r.fail(name, "a license name (letters, digits, '_', '.', '@', '+', '-')")
        count = r.get(name, int, None, f"a whole number of licenses, 0 to {MAX_LICENSE_COUNT}")
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_LICENSE_COUNT:
            raise r.fail(name, f"a whole number of licenses, 0 to {MAX_LICENSE_COUNT}")
        counts[name] = count
    if len(counts) > MAX_CLUSTER_LICENSES:
        raise r.fail("", f"at most {MAX_CLUSTER_LICENSES} licenses")
    return counts
