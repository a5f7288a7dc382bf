"""Simulation plots: real PNGs from real replays, the panels, bad paths, downsampling."""

from __future__ import annotations

import bisect
import time
from pathlib import Path

import numpy
import pytest

from gpusched.errors import UsageError
from gpusched.sim.cluster import uniform
from gpusched.sim.plot import (
    DPI,
    PANEL_IN,
    POINTS,
    WIDTH_IN,
    build_figure,
    downsample,
    plot,
)
from gpusched.sim.replay import SimPolicy, SimResult, simulate
from gpusched.sim.traces import TraceJob

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HOUR = 3600


def jobs() -> list[TraceJob]:
    """A small workload on 2 x 4 GPUs: a wide job blocks the head of the queue, and a
    short small one behind it can backfill (so the policies differ)."""
    return [
        TraceJob(1, 0.0, 4.0 * HOUR, 5 * HOUR, 6),
        TraceJob(2, 60.0, 2.0 * HOUR, 3 * HOUR, 8),
        TraceJob(3, 120.0, 1.0 * HOUR, 2 * HOUR, 2),
        TraceJob(4, 180.0, 3.0 * HOUR, 3 * HOUR, 4),
        TraceJob(5, 2.0 * HOUR, 600.0, 900, 1),
        TraceJob(6, 30.0 * HOUR, 1.0 * HOUR, 2 * HOUR, 8),
    ]


@pytest.fixture(scope="module")
def results() -> list[SimResult]:
    cluster = uniform(2, 4)
    return [simulate(jobs(), cluster, SimPolicy(backfill="none")),
            simulate(jobs(), cluster, SimPolicy(backfill="easy"))]


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels as matplotlib reads the file back."""
    from matplotlib.image import imread

    image = imread(path)
    return image.shape[1], image.shape[0]


def test_one_result_writes_a_png_without_the_wait_panel(results: list[SimResult],
                                                        tmp_path: Path) -> None:
    out = tmp_path / "one.png"
    plot(results[:1], out)
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert 5_000 < len(data) < 2_000_000
    assert png_size(out) == (round(WIDTH_IN * DPI), round(2 * PANEL_IN * DPI))
    assert len(build_figure(results[:1]).axes) == 2


def test_compare_adds_the_wait_panel(results: list[SimResult], tmp_path: Path) -> None:
    assert results[0].records != results[1].records  # backfill changed something
    out = tmp_path / "compare.png"
    plot(results, out)
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert png_size(out) == (round(WIDTH_IN * DPI), round(3 * PANEL_IN * DPI))
    figure = build_figure(results)
    busy, queue, waits = figure.axes
    assert waits.get_xscale() == "log"
    legend = busy.get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == ["fcfs/none", "fcfs/easy"]
    assert "8-GPU" in figure.get_suptitle()
    # Zero waits are drawn at the 1 s floor, so every x on the log axis is positive.
    for line in waits.get_lines():
        assert numpy.asarray(line.get_xdata(), dtype=float).min() > 0


def test_x_axis_is_days_since_first_submit(results: list[SimResult]) -> None:
    busy = build_figure(results[:1]).axes[0]
    xs = numpy.asarray(busy.get_lines()[0].get_xdata(), dtype=float)
    assert xs[0] == 0.0
    last_end = max(r.end for r in results[0].records)
    assert xs[-1] == pytest.approx(last_end / 86400.0)


def test_empty_results_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="nothing to plot"):
        plot([], tmp_path / "x.png")


def test_missing_directory_is_a_usage_error(results: list[SimResult], tmp_path: Path) -> None:
    out = tmp_path / "nope" / "plot.png"
    with pytest.raises(UsageError, match="does not exist"):
        plot(results, out)
    assert not out.parent.exists()


@pytest.mark.parametrize("name", ["plot.pdf", "plot", "plot.png.txt"])
def test_wrong_suffix_is_a_usage_error(results: list[SimResult], tmp_path: Path,
                                       name: str) -> None:
    out = tmp_path / name
    with pytest.raises(UsageError, match=r"\.png path is expected") as info:
        plot(results, out)
    assert str(out) in str(info.value)
    assert not out.exists()


def test_unwritable_file_is_a_usage_error(results: list[SimResult], tmp_path: Path) -> None:
    (tmp_path / "taken.png").mkdir()
    with pytest.raises(UsageError, match="taken.png"):
        plot(results, tmp_path / "taken.png")


def big_timeline(count: int = 400_000) -> list[tuple[float, int, int]]:
    """Moments 30 s apart with busy and pending counts that jump about."""
    return [(30.0 * i, (i * 7919) % 1000, (i * 104729) % 5000) for i in range(count)]


def test_downsample_keeps_each_bucket_maximum() -> None:
    timeline = big_timeline()
    timeline[123_457] = (timeline[123_457][0], 5000, 0)  # one spike must survive
    out = downsample(timeline)
    assert len(out) <= POINTS
    assert out[0][0] == timeline[0][0] and out[-1] == timeline[-1]
    assert [t for t, _, _ in out] == sorted(t for t, _, _ in out)
    assert max(b for _, b, _ in out) == 5000
    # Each point but the last stands for the moments up to the next point's time,
    # and holds their largest busy and pending counts.
    times = [t for t, _, _ in timeline]
    for (at, busy, pending), (nxt, _, _) in zip(out[:-1], out[1:]):
        lo, hi = bisect.bisect_left(times, at), bisect.bisect_left(times, nxt)
        assert hi > lo
        assert busy == max(b for _, b, _ in timeline[lo:hi])
        assert pending == max(p for _, _, p in timeline[lo:hi])


def test_downsample_leaves_short_timelines_alone() -> None:
    timeline = [(0.0, 1, 2), (5.0, 3, 0), (9.0, 0, 0)]
    assert downsample(timeline) == timeline
    assert downsample([]) == []
    same_time = [(7.0, i, 0) for i in range(10)]
    assert downsample(same_time, points=3) == [(7.0, 8, 0), (7.0, 9, 0)]


def test_a_400k_timeline_plots_fast(results: list[SimResult], tmp_path: Path) -> None:
    big = [SimResult(r.policy, r.cluster_gpus, r.records, r.never, r.passes, r.wall_s,
                     big_timeline()) for r in results]
    plot(big[:1], tmp_path / "warm.png")  # matplotlib's first-use costs aside
    began = time.perf_counter()
    plot(big, tmp_path / "big.png")
    elapsed = time.perf_counter() - began
    assert (tmp_path / "big.png").read_bytes().startswith(PNG_MAGIC)
    assert elapsed < 5.0, f"plot took {elapsed:.2f} s"
