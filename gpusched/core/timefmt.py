"""Slurm's time forms: parse time limits and format durations (pure, stdlib only)."""

from __future__ import annotations

# Nothing is imported at the top: gsubmit -t and gqueue format times on every call, and
# re and datetime are loaded only by the forms that need them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from datetime import datetime

# The units of a time limit's numbers, by form: with a day (D-H, D-H:M, D-H:M:S) and
# without (M, M:S, H:M:S).
_DAY_FORMS = {2: ("d", "h"), 3: ("d", "h", "m"), 4: ("d", "h", "m", "s")}
_CLOCK_FORMS = {1: ("m",), 2: ("m", "s"), 3: ("h", "m", "s")}
_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
UNLIMITED_WORDS = frozenset({"unlimited", "infinite", "inf"})
MAX_DIGITS = 18  # of one number in a time: far past any time a job may ask for


class TimeFormatError(ValueError):
    """The text is not one of Slurm's time forms."""


def parse_time_limit(text: str) -> int | None:
    """Parse a Slurm time limit into seconds; ``None`` means unlimited.

    Accepted: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S`` and
    ``UNLIMITED``. A limit of zero is refused: it would end the job at once.
    """
    value = text.strip()
    if value.lower() in UNLIMITED_WORDS:
        return None
    day, dash, clock = value.partition("-")
    parts = [day, *clock.split(":")] if dash else value.split(":")
    units = (_DAY_FORMS if dash else _CLOCK_FORMS).get(len(parts))
    # Each part is a run of decimal digits (any script's, as int() reads them), at most
    # MAX_DIGITS of them (int() refuses more than 4300).
    if units is not None and all(part.isdecimal() and len(part) <= MAX_DIGITS for part in parts):
        seconds = sum(int(part) * _SECONDS[unit] for part, unit in zip(parts, units))
        if seconds <= 0:
            raise TimeFormatError(f"time limit must be positive, got {text!r}")
        if seconds >= 86400 * 10**MAX_DIGITS:  # its D-HH:MM:SS form would not parse back
            raise TimeFormatError(f"time limit {text!r} is too long")
        return seconds
    raise TimeFormatError(
        f"invalid time {text!r}: expected M, M:S, H:M:S, D-H, D-H:M, D-H:M:S or UNLIMITED"
    )


def format_duration(seconds: float | None) -> str:
    """Format seconds the way squeue does: ``M:SS``, ``H:MM:SS`` or ``D-HH:MM:SS``."""
    if seconds is None:
        return "UNLIMITED"
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


_UNITS = {"": 1, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
          "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
          "h": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400,
          "w": 604800, "week": 604800, "weeks": 604800}
_WORDS = {"midnight": (0, 0), "noon": (12, 0), "teatime": (16, 0)}


def parse_begin(text: str, now: datetime) -> datetime:
    """Slurm's ``--begin`` forms, relative to the aware datetime ``now``.

    ``now[+N[units]]``, ``HH:MM[:SS]`` (today, or tomorrow once past), ``YYYY-MM-DD``,
    ``YYYY-MM-DDTHH:MM[:SS]``, ``today``, ``tomorrow``, ``midnight``, ``noon``,
    ``teatime`` (16:00). Times without a zone are in ``now``'s zone.
    """
    import re
    from datetime import datetime, timedelta

    value = text.strip().lower()
    relative = re.fullmatch(r"now(?:\+(\d+)([a-z]*))?", value)
    if relative:
        count, unit = relative[1], relative[2] or ""
        if unit not in _UNITS:
            raise TimeFormatError(f"invalid --begin {text!r}: unknown unit {unit!r}")
        return _shifted(now, "+", count, unit, f"--begin {text!r}")
    if value in ("today", "tomorrow"):
        day = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return day + timedelta(days=1) if value == "tomorrow" else day
    clock = re.fullmatch(r"(\d{1,2}):(\d{2})(?::(\d{2}))?", value)
    if clock or value in _WORDS:
        hour, minute = _WORDS[value] if value in _WORDS else (int(clock[1]), int(clock[2]))  # type: ignore[index]
        second = int(clock[3]) if clock and clock[3] else 0
        try:
            at = now.replace(hour=hour, minute=minute, second=second, microsecond=0)
        except ValueError:
            raise TimeFormatError(f"invalid --begin {text!r}: no such time of day") from None
        return at if at > now else at + timedelta(days=1)
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise TimeFormatError(
            f"invalid --begin {text!r}: expected now+N[units], HH:MM[:SS], YYYY-MM-DD[THH:MM[:SS]], "
            f"today, tomorrow, midnight, noon or teatime") from None
    return at if at.tzinfo else at.replace(tzinfo=now.tzinfo)


def parse_when(text: str, now: datetime, what: str = "time") -> datetime:
    """sacct's ``--starttime``/``--endtime`` forms, relative to the aware ``now``:
    ``now``, ``now-N[units]``, ``now+N[units]``, ``today``, ``yesterday``, ``YYYY-MM-DD``,
    ``YYYY-MM-DDTHH:MM[:SS]`` (without a zone: ``now``'s zone)."""
    import re
    from datetime import datetime, timedelta

    value = text.strip().lower()
    relative = re.fullmatch(r"now(?:([+-])(\d+)([a-z]*))?", value)
    if relative:
        sign, count, unit = relative[1], relative[2], relative[3] or ""
        if unit not in _UNITS:
            raise TimeFormatError(f"invalid {what} {text!r}: unknown unit {unit!r}")
        return _shifted(now, sign, count, unit, f"{what} {text!r}")
    if value in ("today", "yesterday"):
        day = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return day - timedelta(days=1) if value == "yesterday" else day
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise TimeFormatError(f"invalid {what} {text!r}: expected now[-N[units]], today, "
                              "yesterday or YYYY-MM-DD[THH:MM[:SS]]") from None
    return at if at.tzinfo else at.replace(tzinfo=now.tzinfo)


def _shifted(now: datetime, sign: str | None, count: str | None, unit: str,
             what: str) -> datetime:
    """``now`` moved by COUNT units; a move past the calendar (year 1 to 9999) is refused."""
    from datetime import timedelta

    try:
        delta = timedelta(seconds=int(count or 0) * _UNITS[unit])
        return now - delta if sign == "-" else now + delta
    except (OverflowError, ValueError):  # ValueError: int() of more than 4300 digits
        raise TimeFormatError(f"invalid {what}: too far from now") from None
