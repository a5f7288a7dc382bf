"""Figures of simulations: busy GPUs, queue length and (when comparing) wait times.

One PNG holds a panel of GPUs busy over time and a panel of jobs pending over time, one
line per policy, the x axis in days since the first submit. With more than one result
a third panel shows each policy's wait-time distribution: the share of jobs that
waited at most x hours (an empirical CDF, log x axis; waits under a second are drawn
at one second). A timeline can hold a point for every moment of a long trace, so it is
cut to ``POINTS`` time buckets first, each keeping its largest busy and pending
counts: the peaks stay visible and drawing stays fast.

matplotlib is imported only when a figure is drawn (it is slow to import), and always
with its non-interactive Agg canvas, so no display is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpusched.errors import UsageError
from gpusched.sim.replay import SimResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

POINTS = 2000  # most points drawn per line
WIDTH_IN = 10.0  # figure width, inches
PANEL_IN = 3.0  # height of one panel, inches
DPI = 100
DAY_S = 86400.0
HOUR_S = 3600.0
WAIT_FLOOR_S = 1.0  # waits shorter than this are drawn here on the log axis

Moment = tuple[float, float, int]  # (time, GPUs busy, jobs pending)


def downsample(timeline: Sequence[Moment], points: int = POINTS) -> list[Moment]:
    """At most ``points`` moments of ``timeline`` (in time order) to draw as steps.

    All moments but the last are cut into ``points - 1`` equal time buckets; each
    non-empty bucket becomes one moment at its first time with the largest busy and
    pending counts in it, and the last moment is kept as it is (the cluster drained).
    A timeline already that short is returned whole.
    """
    if points < 2:
        raise ValueError("downsample needs at least 2 points")
    if len(timeline) <= points:
        return list(timeline)
    *body, last = timeline
    first = body[0][0]
    buckets = points - 1
    span = body[-1][0] - first
    scale = buckets / span if span > 0 else 0.0
    out: list[Moment] = []
    current = -1
    at, busy, pending = first, 0.0, 0
    for time, b, p in body:
        index = min(int((time - first) * scale), buckets - 1)
        if index != current:
            if current >= 0:
                out.append((at, busy, pending))
            current, at, busy, pending = index, time, b, p
        else:
            if b > busy:
                busy = b
            if p > pending:
                pending = p
    out.append((at, busy, pending))
    out.append(last)
    return out


def check_path(path: Path) -> None:
    """Raise ``UsageError`` unless ``path`` names a ``.png`` file in an existing
    directory: a CLI may call this before a long simulation, not only after."""
    if path.suffix.lower() != ".png":
        raise UsageError(f"cannot write the plot to {path}: a .png path is expected")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"cannot write the plot to {path}: directory {parent} does not exist")
    if path.is_dir():
        raise UsageError(f"cannot write the plot to {path}: it is a directory")


def build_figure(results: Sequence[SimResult]) -> Figure:
    """The figure of ``results``: busy GPUs and queue length over time, plus the
    wait-time distribution when there is more than one result. It is attached to an
    Agg canvas and to no pyplot window."""
    if not results:
        raise UsageError("nothing to plot: no simulation results")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    compare = len(results) > 1
    panels = 3 if compare else 2
    figure = Figure(figsize=(WIDTH_IN, PANEL_IN * panels), dpi=DPI)
    FigureCanvasAgg(figure)
    busy_ax = figure.add_subplot(panels, 1, 1)
    queue_ax = figure.add_subplot(panels, 1, 2, sharex=busy_ax)

    origin = _origin(results)
    for result in results:
        moments = downsample(result.timeline)
        days = [(t - origin) / DAY_S for t, _, _ in moments]
        line, = busy_ax.plot(days, [b for _, b, _ in moments], drawstyle="steps-post",
                             linewidth=1.0, label=result.policy.name)
        queue_ax.plot(days, [p for _, _, p in moments], drawstyle="steps-post",
                      linewidth=1.0, color=line.get_color(), label=result.policy.name)

    capacities = sorted({r.cluster_gpus for r in results})
    for gpus in capacities:
        busy_ax.axhline(gpus, color="grey", linestyle=":", linewidth=1.0)
    busy_ax.set_ylabel("GPUs busy")
    busy_ax.set_ylim(bottom=0)
    busy_ax.legend(loc="lower center", fontsize="small", ncols=min(len(results), 4))
    queue_ax.set_ylabel("jobs pending")
    queue_ax.set_xlabel("days since first submit")
    queue_ax.set_ylim(bottom=0)
    for ax in (busy_ax, queue_ax):
        ax.grid(True, alpha=0.3)

    if compare:
        _draw_waits(figure.add_subplot(panels, 1, 3), results)

    total = " / ".join(str(g) for g in capacities)
    figure.suptitle(f"Simulation on a {total}-GPU cluster")
    figure.tight_layout()
    return figure


def plot(results: Sequence[SimResult], path: Path) -> None:
    """Write the figure of ``results`` (see ``build_figure``) to ``path``, a PNG.

    Raises ``UsageError`` when ``path`` is not a ``.png`` path, its directory does not
    exist, or the file cannot be written.
    """
    check_path(path)
    figure = build_figure(results)
    try:
        figure.savefig(path, format="png")
    except OSError as exc:
        raise UsageError(f"cannot write the plot to {path}: "
                         f"{exc.strerror or exc}") from None
    finally:
        figure.clear()  # no pyplot registry holds it: clearing frees it at once


def _origin(results: Sequence[SimResult]) -> float:
    """The first submit of any result (or its first moment), which day 0 is."""
    starts = [min(r.submit for r in result.records) for result in results if result.records]
    starts += [result.timeline[0][0] for result in results if result.timeline]
    return min(starts, default=0.0)


def _draw_waits(ax: Axes, results: Sequence[SimResult]) -> None:
    """Each result's empirical CDF of wait, in hours on a log axis."""
    floor_h = WAIT_FLOOR_S / HOUR_S
    most_h = floor_h
    for result in results:
        waits = sorted(max(r.wait, WAIT_FLOOR_S) / HOUR_S for r in result.records)
        if not waits:
            continue
        count = len(waits)
        step = max(1, count // POINTS)
        ranks = list(range(0, count, step))
        if ranks[-1] != count - 1:
            ranks.append(count - 1)
        xs = [floor_h] + [waits[i] for i in ranks]
        ys = [0.0] + [(i + 1) / count for i in ranks]
        ax.plot(xs, ys, drawstyle="steps-post", linewidth=1.0, label=result.policy.name)
        most_h = max(most_h, waits[-1])
    ax.set_xscale("log")
    ax.set_xlim(floor_h, max(most_h * 1.5, floor_h * 10))
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("wait (hours, log scale; waits under 1 s shown at 1 s)")
    ax.set_ylabel("share of jobs")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
