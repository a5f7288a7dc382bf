"""``gpusched simulate``: replay a workload trace through the scheduler's own pass."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpusched.errors import UsageError

EXAMPLES = """
Examples:

  gpusched simulate --trace HPC2N-2002-2.2-cln.swf.gz --nodes 30 --gpus-per-node 8

  gpusched simulate --trace log.swf --compare none,easy,conservative --plot waits.png

  gpusched simulate --trace philly.csv.gz --nodes 64 --policy multifactor --json
"""


def simulate(
    trace: Annotated[Path, typer.Option("--trace", help="The trace file (.swf, .swf.gz, .csv, .csv.gz).")],
    fmt: Annotated[Optional[str], typer.Option(
        "--format", help="swf, philly or alibaba (default: from the file name).")] = None,
    nodes: Annotated[Optional[int], typer.Option(
        "--nodes", help="Nodes in a uniform cluster (default for SWF: MaxProcs / GPUs per node).")] = None,
    gpus_per_node: Annotated[Optional[int], typer.Option(
        "--gpus-per-node", help="GPUs per node of a uniform cluster (default 8).")] = None,
    cluster: Annotated[Optional[Path], typer.Option(
        "--cluster", help="A cluster file (TOML: [[node]] and [[partition]] tables).")] = None,
    node_list: Annotated[Optional[Path], typer.Option(
        "--node-list", help="Alibaba node list (default: the *node_list* file beside the trace).")] = None,
    policy: Annotated[str, typer.Option("--policy", help="Queue order: fcfs or multifactor.")] = "fcfs",
    backfill: Annotated[str, typer.Option(
        "--backfill", help="none, easy or conservative.")] = "easy",
    reservations: Annotated[Optional[int], typer.Option(
        "--reservations", help="Blocked jobs that get a reservation (default: the mode's own).")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Replay at most N jobs.")] = None,
    skip: Annotated[int, typer.Option("--skip", help="Leave out the first N jobs.")] = 0,
    no_kill: Annotated[bool, typer.Option(
        "--no-kill", help="Let jobs run past their time limit (default: TIMEOUT at the limit).")] = False,
    packing: Annotated[str, typer.Option(
        "--packing", help="Where a share of a GPU starts: bestfit or fgd.")] = "bestfit",
    compare: Annotated[Optional[str], typer.Option(
        "--compare", help="Policies to compare, comma-separated: ORDER, BACKFILL or "
        "ORDER/BACKFILL[/RESERVATIONS], e.g. none,easy,conservative.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
    plot: Annotated[Optional[Path], typer.Option(
        "--plot", help="Write busy GPUs, queue length (and, comparing, waits) to this PNG.")] = None,
) -> None:
    """Replay a workload trace through the scheduler's own pass, on a virtual clock.

    Every decision comes from the same code the controller runs. Prints wait,
    slowdown and utilisation figures, per policy when comparing.
    """
    from gpusched.sim.cluster import SimCluster, from_node_list, load_cluster, uniform
    from gpusched.sim.metrics import metrics
    from gpusched.sim.replay import SimPolicy
    from gpusched.sim.replay import simulate as run
    from gpusched.sim.traces import FORMATS, read_trace

    _check_counts(nodes=nodes, gpus_per_node=gpus_per_node, limit=limit)
    if skip < 0:
        raise UsageError(f"invalid --skip {skip}: expected 0 or more jobs")
    if reservations is not None and reservations < 0:
        raise UsageError(f"invalid --reservations {reservations}: expected 0 or more")
    if fmt is not None and fmt not in FORMATS:
        raise UsageError(f"invalid --format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if cluster is not None and (nodes is not None or gpus_per_node is not None):
        raise UsageError("give either --cluster or --nodes/--gpus-per-node, not both")
    base = SimPolicy(policy, backfill, reservations, kill=not no_kill, packing=packing)
    policies = [base] if not compare else [SimPolicy.parse(item, base) for item in compare.split(",")]
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise UsageError(f"invalid --compare {compare!r}: a policy is named twice")
    if plot is not None:
        from gpusched.sim.plot import check_path

        check_path(plot)
    machine: SimCluster | None = load_cluster(cluster) if cluster is not None else None

    loaded = read_trace(trace, fmt, node_list)
    window = loaded.window(skip, limit)
    if not window.jobs:
        raise UsageError(f"{trace}: no jobs to replay (after --skip {skip})")
    if machine is None:
        if nodes is not None:
            machine = uniform(nodes, gpus_per_node or 8)
        elif loaded.nodes:
            machine = from_node_list(loaded.nodes)
        elif procs := _max_procs(loaded.header):
            per = gpus_per_node or min(8, procs)
            machine = uniform(math.ceil(procs / per), per)
        else:
            raise UsageError(f"{trace}: the trace does not say how big its machine was: give "
                             "--nodes N (and --gpus-per-node G) or --cluster FILE")
    _say(f"trace {trace}: {len(window.jobs)} jobs to replay"
         + (f" (of {len(loaded.jobs)})" if len(window.jobs) != len(loaded.jobs) else "")
         + "".join(f"; skipped {count}: {why}" for why, count in sorted(loaded.skipped.items())))
    _say(f"cluster: {machine.describe()}")

    results = []
    for sim_policy in policies:
        with _progress(len(window.jobs), sim_policy.name) as advance:
            result = run(window.jobs, machine, sim_policy, advance)
        results.append(result)
        _say(f"{sim_policy.name}: {len(result.records)} jobs in {result.wall_s:.1f} s "
             f"({len(result.records) / max(result.wall_s, 1e-9):.0f} jobs/s, {result.passes} passes)"
             + (f"; {len(result.never)} jobs can never fit this cluster and were left out"
                if result.never else ""))
    figures = [metrics(r.records, r.cluster_gpus) for r in results]
    if plot is not None:
        from gpusched.sim.plot import plot as draw

        draw(results, plot)
        _say(f"plot written to {plot}")
    if as_json:
        answer: dict[str, object] = dict(figures[0])
        if compare:
            answer["policies"] = {name: fig for name, fig in zip(names, figures)}
        typer.echo(json.dumps(answer, indent=2))
        return
    _print_figures(names, figures)


def _check_counts(**values: int | None) -> None:
    for name, value in values.items():
        if value is not None and value < 1:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"invalid {flag} {value}: expected 1 or more")


def _max_procs(header: dict[str, str]) -> int:
    for key in ("MaxProcs", "MaxNodes"):
        text = header.get(key, "").split()
        if text and text[0].isdigit() and int(text[0]) > 0:
            return int(text[0])
    return 0


def _say(message: str) -> None:
    typer.echo(message, err=True)


@contextmanager
def _progress(total: int, label: str) -> Iterator[Callable[[int], None] | None]:
    """A progress bar on a terminal (stderr); nothing otherwise."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total} jobs"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda count: bar.advance(task, count)


_LABELS = {
    "jobs": ("jobs", "{:d}"),
    "makespan_s": ("makespan (s)", "{:.0f}"),
    "utilization": ("utilization", "{:.4f}"),
    "avg_wait_s": ("avg wait (s)", "{:.1f}"),
    "p50_wait_s": ("p50 wait (s)", "{:.1f}"),
    "p95_wait_s": ("p95 wait (s)", "{:.1f}"),
    "avg_bounded_slowdown": ("avg bounded slowdown", "{:.2f}"),
    "avg_jct_s": ("avg JCT (s)", "{:.1f}"),
    "max_wait_s": ("max wait (s)", "{:.0f}"),
}


def _print_figures(names: list[str], figures: list[dict[str, float | int]]) -> None:
    from gpusched.cli.output import print_table

    rows = [[label, *(fmt.format(fig[key]) for fig in figures)]
            for key, (label, fmt) in _LABELS.items()]
    print_table(["METRIC", *(name.upper() for name in names)], rows,
                right_aligned=frozenset(range(1, len(names) + 1)), shrinkable=frozenset())
