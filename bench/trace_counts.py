"""Read every real trace with the project's readers and check the counts its README gives.

    .venv/bin/python bench/trace_counts.py [TRACES_DIR]

``TRACES_DIR`` defaults to ``../shared/traces`` beside the repository. Prints
``name: value`` lines (counts, and ``*_read_s``, the seconds a read took), then
``trace_counts_ok: 1`` when every check passed; otherwise the failed checks, then
``trace_counts_ok: 0``, and exits 1.

The expected numbers are the ones ``TRACES_DIR/README.md`` states. For a SWF log, jobs
read plus jobs skipped is its record count, and the jobs skipped for an unknown run time
are its run-time -1 jobs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpusched.sim.traces import (  # noqa: E402
    Trace,
    TraceError,
    read_alibaba,
    read_philly,
    read_swf,
)

DEFAULT_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "traces"

CANCELLED = "no run time (cancelled before it started)"
NO_GPU = "no GPU (CPU-only pod)"
FRACTIONAL = "fractional GPU (gpu_milli < 1000)"

# file -> (short name, records, run time -1, run time 0 or None where the README is silent)
SWF = {
    "SDSC-SP2-1998-4.2-cln.swf.gz": ("sdsc_sp2", 59_715, 5_671, 10),
    "HPC2N-2002-2.2-cln.swf.gz": ("hpc2n", 202_871, 0, 0),
    "CTC-SP2-1996-3.1-cln.swf.gz": ("ctc", 77_222, 0, 17),
    "KTH-SP2-1996-2.1-cln.swf.gz": ("kth", 28_476, 0, 8),
    "SDSC-BLUE-2000-4.2-cln.swf.gz": ("sdsc_blue", 243_306, 10_744, 26),
    "lublin_256.swf.gz": ("lublin_256", 10_000, 0, None),
    "lublin_256_new2.swf.gz": ("lublin_256_new2", 10_000, 0, None),
}
# Requested time is -1 throughout these, so every job gets its run time as limit.
ALL_ESTIMATED = {"lublin_256", "lublin_256_new2"}

PHILLY = "philly_pollux.csv.gz"
PHILLY_ROWS = 82_247
PHILLY_GPUS = {1: 76_627, 2: 1_818, 4: 1_870, 8: 1_643, 12: 7, 16: 199, 24: 7, 32: 67,
               64: 6, 128: 3}
PHILLY_VCS = 15

PODS = "alibaba_openb_pod_list_default.csv.gz"
NODES = "alibaba_openb_node_list_gpu_node.csv.gz"
POD_ROWS, POD_NO_GPU, POD_FRACTIONAL = 8_152, 1_088, 3_078
NODE_COUNT, NODE_GPUS = 1_213, 6_212
# (model as the reader lowercases it, GPUs per node) -> nodes, for the four the README names
NODE_KINDS = {("g2", 8): 549, ("t4", 2): 387, ("p100", 2): 131, ("g3", 8): 39}

NO_READER = ("tiresias_60_job.csv.gz", "philly_vc_nodes.csv.gz")


class Checks:
    """``name: value`` lines, and the checks that failed."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def show(self, name: str, value: object) -> None:
        print(f"{name}: {value}", flush=True)

    def check(self, name: str, got: object, want: object) -> None:
        self.show(name, got)
        if got != want:
            self.failed.append(f"{name}: got {got}, expected {want}")


def _timed(checks: Checks, name: str, read: Callable[..., Trace], *args: Path) -> Trace | None:
    start = time.perf_counter()
    try:
        trace = read(*args)
    except TraceError as exc:
        checks.failed.append(f"{name}: cannot read: {exc}")
        checks.show(f"{name}_error", exc)
        return None
    checks.show(f"{name}_read_s", f"{time.perf_counter() - start:.2f}")
    return trace


def check_swf(checks: Checks, path: Path) -> None:
    name, records, unknown_run, zero_run = SWF[path.name]
    trace = _timed(checks, name, read_swf, path)
    if trace is None:
        return
    checks.check(f"{name}_records", len(trace.jobs) + sum(trace.skipped.values()), records)
    checks.show(f"{name}_jobs", len(trace.jobs))
    for reason, count in sorted(trace.skipped.items()):
        checks.show(f"{name}_skipped[{reason}]", count)
    checks.check(f"{name}_run_time_unknown", trace.skipped[CANCELLED], unknown_run)
    zeros = sum(1 for j in trace.jobs if j.run_time == 0)
    if zero_run is None:
        checks.show(f"{name}_run_time_zero", zeros)
    else:
        checks.check(f"{name}_run_time_zero", zeros, zero_run)
    if name in ALL_ESTIMATED:
        checks.check(f"{name}_estimated", trace.estimated, len(trace.jobs))
    else:
        checks.show(f"{name}_estimated", trace.estimated)
    for key in ("MaxProcs", "MaxNodes", "MaxRecords"):
        if key in trace.header:
            checks.show(f"{name}_header_{key}", trace.header[key])


def check_philly(checks: Checks, path: Path) -> None:
    trace = _timed(checks, "philly", read_philly, path)
    if trace is None:
        return
    checks.check("philly_rows", len(trace.jobs) + sum(trace.skipped.values()), PHILLY_ROWS)
    checks.check("philly_jobs", len(trace.jobs), PHILLY_ROWS)
    gpus = dict(sorted(Counter(j.gpus for j in trace.jobs).items()))
    checks.check("philly_gpu_counts", gpus, PHILLY_GPUS)
    checks.check("philly_virtual_clusters", trace.header.get("VirtualClusters"),
                 str(PHILLY_VCS))
    durations = [j.run_time for j in trace.jobs]
    if durations:
        checks.check("philly_duration_min_s", min(durations), 1.0)
        checks.check("philly_duration_median_s", round(statistics.median(durations)), 1_144)
        checks.check("philly_duration_mean_s", round(statistics.mean(durations)), 13_136)
        checks.check("philly_duration_max_s_rounded", round(max(durations), -5), 4_600_000)
    submits = [j.submit for j in trace.jobs]
    checks.check("philly_sorted_from_zero",
                 bool(submits) and submits[0] == 0.0 and submits == sorted(submits), True)


def check_alibaba(checks: Checks, pods: Path, nodes: Path) -> None:
    trace = _timed(checks, "alibaba", read_alibaba, pods, nodes)
    if trace is None:
        return
    checks.check("alibaba_pod_rows", len(trace.jobs) + sum(trace.skipped.values()), POD_ROWS)
    checks.show("alibaba_pods_read", len(trace.jobs))
    for reason, count in sorted(trace.skipped.items()):
        checks.show(f"alibaba_skipped[{reason}]", count)
    checks.check("alibaba_pods_no_gpu", trace.skipped[NO_GPU], POD_NO_GPU)
    checks.check("alibaba_pods_fractional", trace.skipped[FRACTIONAL], POD_FRACTIONAL)
    checks.show("alibaba_pods_read_gpu_counts",
                dict(sorted(Counter(j.gpus for j in trace.jobs).items())))
    checks.check("alibaba_nodes", len(trace.nodes), NODE_COUNT)
    checks.check("alibaba_node_gpus", sum(n[1] for n in trace.nodes), NODE_GPUS)
    kinds = Counter((n[2], n[1]) for n in trace.nodes)
    for (model, gpus), want in NODE_KINDS.items():
        checks.check(f"alibaba_nodes_{model}_{gpus}gpu", kinds[(model, gpus)], want)


def main() -> None:
    """Read every trace in the folder and check its counts."""
    parser = argparse.ArgumentParser()
    parser.add_argument("traces_dir", nargs="?", type=Path, default=DEFAULT_DIR)
    opts = parser.parse_args()
    folder: Path = opts.traces_dir
    checks = Checks()
    checks.show("traces_dir", folder)
    if not folder.is_dir():
        print(f"FAILED traces_dir: {folder} is not a folder")
        print("trace_counts_ok: 0")
        sys.exit(1)
    present = {p.name for p in folder.iterdir() if p.is_file() and p.name != "README.md"}
    expected = set(SWF) | {PHILLY, PODS, NODES}
    for name in sorted(expected - present):
        checks.failed.append(f"{name}: missing from {folder}")
    for name in sorted(present):
        if name in SWF:
            check_swf(checks, folder / name)
        elif name == PHILLY:
            check_philly(checks, folder / name)
        elif name == PODS:
            if NODES in present:
                check_alibaba(checks, folder / PODS, folder / NODES)
        elif name == NODES:
            checks.show("read_with_pod_list", name)
        elif name in NO_READER:
            checks.show("skipped_file", f"{name} (no reader for it)")
        else:
            checks.show("unknown_file", f"{name} (no expected counts; not read)")
    total = len(checks.failed)
    for failure in checks.failed:
        print(f"FAILED {failure}")
    print(f"trace_counts_ok: {0 if total else 1}")
    if total:
        sys.exit(1)


if __name__ == "__main__":
    main()
