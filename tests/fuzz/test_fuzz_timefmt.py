"""Time forms: a time limit parses to seconds that format and parse back, --begin and
sacct's times to datetimes whose ISO form parses back; anything else is a
TimeFormatError of one line."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.timefmt import (
    TimeFormatError,
    format_duration,
    parse_begin,
    parse_time_limit,
    parse_when,
)
from tests.fuzz.fuzzing import fuzz, long_number, noisy_text, one_line

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone(timedelta(hours=1)))
number = long_number()
limit_text = st.one_of(
    st.lists(number, min_size=1, max_size=4).map(":".join),
    st.builds(lambda d, rest: f"{d}-{':'.join(rest)}", number,
              st.lists(number, min_size=1, max_size=3)),
    st.sampled_from(["UNLIMITED", "unlimited", "Infinite", "inf", "0", "0:0", "-1", "1-"]),
    noisy_text("0123456789:-", 10))
begin_text = st.one_of(
    st.builds(lambda n, u: f"now+{n}{u}", number,
              st.sampled_from(["", "s", "min", "hours", "days", "weeks", "fortnight"])),
    st.builds(lambda s, n, u: f"now{s}{n}{u}", st.sampled_from("+-"), number,
              st.sampled_from(["", "m", "d", "w"])),
    st.builds(lambda h, m: f"{h}:{m}", st.integers(0, 99), st.integers(0, 99)),
    st.datetimes(timezones=st.none() | st.timezones()).map(datetime.isoformat),
    st.sampled_from(["today", "tomorrow", "yesterday", "midnight", "noon", "teatime",
                     "9999-12-31T23:59:59", "0001-01-01", "now"]),
    noisy_text("now+-:T0123456789dayswk", 10))


def limit(text: str) -> None:
    try:
        seconds = parse_time_limit(text)
    except TimeFormatError as err:
        one_line(err)
        return
    assert seconds is None or seconds > 0
    assert parse_time_limit(format_duration(seconds)) == seconds


@fuzz(400)
@given(limit_text)
def test_time_limits(text: str) -> None:
    limit(text)


@fuzz(200)
@given(st.integers(1, 10**12))
def test_every_duration_formats_and_parses_back(seconds: int) -> None:
    assert parse_time_limit(format_duration(seconds)) == seconds


@fuzz(400)
@given(begin_text)
def test_begin_and_sacct_times(text: str) -> None:
    for parse in (parse_begin, parse_when):
        try:
            at = parse(text, NOW)
        except TimeFormatError as err:
            one_line(err)
            continue
        assert at.tzinfo is not None
        # What gsubmit sends is the ISO form: it must mean the same moment again.
        assert parse(at.isoformat(), NOW) == at


def test_the_longest_time_limit_parses_back() -> None:
    longest = 86400 * 10**18 - 1
    assert parse_time_limit(format_duration(longest)) == longest
    limit("999999999999999999-999999999999999999")  # refused: past the longest
