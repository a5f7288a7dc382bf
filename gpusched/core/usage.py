"""What a job's cgroup measured, written the way sacct writes it: MaxRSS (``4582612K``,
``12M``, ``2.50G``) and TotalCPU (``[D-]HH:MM:SS``, or ``MM:SS.mmm`` under an hour); and
how much of a GPU a holding counts for in GPU-hours (a share: its fraction).

Pure: no clock, no I/O.
"""

from __future__ import annotations

UNITS = "KMGTPE"  # of 1024 bytes each: sacct counts memory in KiB


def format_max_rss(size_bytes: int | None) -> str:
    """Peak memory as sacct's MaxRSS: KiB, converted up a unit only while no precision
    is lost (a half value, such as 2.5G, counts as exact); ``""`` when not measured."""
    if size_bytes is None:
        return ""
    kib = -(-size_bytes // 1024)  # rounded up: a few bytes are not nothing
    if kib == 0:
        return "0"
    value, unit = float(kib), 0
    while value >= 1024 and value % 512 == 0 and unit < len(UNITS) - 1:
        value /= 1024
        unit += 1
    shown = f"{value:.0f}" if value.is_integer() else f"{value:.2f}"
    return f"{shown}{UNITS[unit]}"


def format_total_cpu(usec: int | None) -> str:
    """CPU time as sacct's TotalCPU: ``D-HH:MM:SS`` past a day, ``HH:MM:SS`` past an hour,
    else ``MM:SS.mmm`` (``00:MM:SS`` when there are no milliseconds); ``""`` when not
    measured."""
    if usec is None:
        return ""
    seconds, rest = divmod(max(0, usec), 1_000_000)
    millis = rest // 1000
    days, seconds = divmod(seconds, 86_400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{seconds:02d}"
    if hours:
        return f"{hours:02d}:{minutes:02d}:{seconds:02d}"
    if millis:
        return f"{minutes:02d}:{seconds:02d}.{millis:03d}"
    return f"00:{minutes:02d}:{seconds:02d}"


def gpu_fraction(units: int | None, offered: int | None) -> float:
    """How much of a GPU one holding counts for in GPU-hours: 1 for a whole GPU or a MIG
    slice (``units`` None), ``units / offered`` for a share of a GPU that offers
    ``offered`` units (at most 1), and 1 when what the GPU offers is not known (its
    partition no longer shares it)."""
    if units is None or not offered or offered <= 0:
        return 1.0
    return min(1.0, units / offered)
