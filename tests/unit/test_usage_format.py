"""sacct's MaxRSS and TotalCPU forms (gpusched.core.usage), by example and by property."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.usage import UNITS, format_max_rss, format_total_cpu

KIB = 1024


@pytest.mark.parametrize(("size", "shown"), [
    (None, ""), (0, "0"), (1, "1K"), (KIB, "1K"), (KIB + 1, "2K"), (1234 * KIB, "1234K"),
    (12 * KIB**2, "12M"), (1536 * KIB, "1.50M"), (5 * KIB**3 // 2, "2.50G"),
    (4_582_612 * KIB, "4582612K"), (3 * KIB**4, "3T"), (1023 * KIB, "1023K"),
    ((1 << 63) - 1, "8E"),
])
def test_max_rss_as_sacct_shows_it(size: int | None, shown: str) -> None:
    assert format_max_rss(size) == shown


@given(st.integers(0, (1 << 63) - 1))
def test_max_rss_loses_nothing_but_the_rounding_to_kib(size: int) -> None:
    shown = format_max_rss(size)
    match = re.fullmatch(r"(\d+)(?:\.(\d\d))?([KMGTPE])?", shown)
    assert match is not None, shown
    whole, fraction, unit = match.groups()
    value = int(whole) + (int(fraction) / 100 if fraction else 0)
    scale = KIB ** UNITS.index(unit) if unit else 0
    assert value * scale == -(-size // KIB)  # exactly the KiB, rounded up
    assert fraction in (None, "50")  # a unit up only while exact: halves at most


@pytest.mark.parametrize(("usec", "shown"), [
    (None, ""), (0, "00:00:00"), (2_500_000, "00:02.500"), (59_999_999, "00:59.999"),
    (61_000_000, "00:01:01"), (3_599_001_000, "59:59.001"), (3_600_000_000, "01:00:00"),
    (3_723_456_789, "01:02:03"), (86_400_000_000, "1-00:00:00"),
    (90_061_500_000, "1-01:01:01"), (400 * 86_400_000_000, "400-00:00:00"),
])
def test_total_cpu_as_sacct_shows_it(usec: int | None, shown: str) -> None:
    assert format_total_cpu(usec) == shown


@given(st.integers(0, (1 << 63) - 1))
def test_total_cpu_reads_back_within_its_precision(usec: int) -> None:
    shown = format_total_cpu(usec)
    days, _, clock = shown.rpartition("-")
    parts = clock.split(":")
    seconds = float(parts[-1]) + 60 * int(parts[-2])
    if len(parts) == 3:
        seconds += 3600 * int(parts[0])
    seconds += 86_400 * int(days or 0)
    # milliseconds under an hour, whole seconds above
    precision = 0.001 if usec < 3_600_000_000 else 1.0
    assert 0 <= usec / 1e6 - seconds < precision + 1e-6
    if days:
        assert len(parts) == 3 and all(len(p) == 2 for p in parts)
