"""Slurm's time forms: every accepted spelling, the refused ones, and squeue's output."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.timefmt import (
    TimeFormatError,
    format_duration,
    parse_begin,
    parse_time_limit,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5", 5 * 60),                                  # M
        ("90", 90 * 60),                                # M past an hour stays minutes
        ("5:30", 5 * 60 + 30),                          # M:S
        ("1:02:03", 3600 + 2 * 60 + 3),                 # H:M:S
        ("2-3", 2 * 86400 + 3 * 3600),                  # D-H
        ("2-3:04", 2 * 86400 + 3 * 3600 + 4 * 60),      # D-H:M
        ("2-3:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5),  # D-H:M:S
        ("1-00:00:00", 86400),
        ("0:30", 30),
        (" 10 ", 600),                                  # surrounding blanks are ignored
    ],
)
def test_each_slurm_form_parses_to_seconds(text: str, seconds: int) -> None:
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["UNLIMITED", "unlimited", "Infinite", "INF"])
def test_unlimited_spellings_mean_no_limit(text: str) -> None:
    assert parse_time_limit(text) is None


@pytest.mark.parametrize(
    "text",
    ["abc", "", "1:2:3:4", "-5", "1-", "-1:00", "1.5", "1h", "1-2-3", "1:", ":30", "1 2",
     "0", "0:00", "0-0"],
)
def test_bad_forms_and_zero_are_refused(text: str) -> None:
    with pytest.raises(TimeFormatError):
        parse_time_limit(text)


def test_time_format_error_names_the_accepted_forms() -> None:
    with pytest.raises(TimeFormatError, match="D-H:M:S"):
        parse_time_limit("soon")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0:00"),
        (5, "0:05"),
        (59.9, "0:59"),          # squeue truncates, it does not round
        (61, "1:01"),
        (3599, "59:59"),
        (3600, "1:00:00"),
        (86399, "23:59:59"),
        (86400, "1-00:00:00"),
        (90061, "1-01:01:01"),
        (-3, "0:00"),            # a clock step backwards never shows a negative time
        (None, "UNLIMITED"),
    ],
)
def test_format_duration_like_squeue(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=1, max_value=400 * 86400))
def test_formatted_durations_parse_back(seconds: int) -> None:
    assert parse_time_limit(format_duration(seconds)) == seconds


NOW = datetime(2026, 11, 22, 15, 30, 0, tzinfo=timezone(timedelta(hours=1)))


@pytest.mark.parametrize(("text", "expected"), [
    ("now", NOW),
    ("now+90", NOW + timedelta(seconds=90)),
    ("now+2hours", NOW + timedelta(hours=2)),
    ("now+1d", NOW + timedelta(days=1)),
    ("16:00", NOW.replace(hour=16, minute=0)),
    ("15:00:30", NOW.replace(hour=15, minute=0, second=30) + timedelta(days=1)),  # past: tomorrow
    ("teatime", NOW.replace(hour=16, minute=0)),
    ("midnight", NOW.replace(hour=0, minute=0) + timedelta(days=1)),
    ("tomorrow", NOW.replace(hour=0, minute=0) + timedelta(days=1)),
    ("2026-12-24", datetime(2026, 12, 24, tzinfo=NOW.tzinfo)),
    ("2026-12-24T18:30", datetime(2026, 12, 24, 18, 30, tzinfo=NOW.tzinfo)),
    ("2026-12-24T18:30:00+00:00", datetime(2026, 12, 24, 18, 30, tzinfo=timezone.utc)),
])
def test_begin_forms(text: str, expected: datetime) -> None:
    assert parse_begin(text, NOW) == expected


@pytest.mark.parametrize("text", ["now+3fortnights", "25:00", "yesterdayish", "2026-13-01"])
def test_bad_begin(text: str) -> None:
    with pytest.raises(TimeFormatError, match="--begin"):
        parse_begin(text, NOW)
