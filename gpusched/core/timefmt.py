"""Slurm's time forms: parse time limits and format durations (pure, stdlib only)."""

from __future__ import annotations

import re

_FORMS = (
    # D-H, D-H:M, D-H:M:S
    (re.compile(r"^(\d+)-(\d+)$"), ("d", "h")),
    (re.compile(r"^(\d+)-(\d+):(\d+)$"), ("d", "h", "m")),
    (re.compile(r"^(\d+)-(\d+):(\d+):(\d+)$"), ("d", "h", "m", "s")),
    # M, M:S, H:M:S
    (re.compile(r"^(\d+)$"), ("m",)),
    (re.compile(r"^(\d+):(\d+)$"), ("m", "s")),
    (re.compile(r"^(\d+):(\d+):(\d+)$"), ("h", "m", "s")),
)
_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
UNLIMITED_WORDS = frozenset({"unlimited", "infinite", "inf"})


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
    for pattern, units in _FORMS:
        match = pattern.match(value)
        if match:
            seconds = sum(int(part) * _SECONDS[unit] for part, unit in zip(match.groups(), units))
            if seconds <= 0:
                raise TimeFormatError(f"time limit must be positive, got {text!r}")
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
