"""Fault-injection soak for as long as asked; prints ``name: value`` lines.

    .venv/bin/python bench/chaos.py [--seconds 600] [--seed 1] [--nodes 4] [--rate 1.5]
                                    [--fault-rate 1.0] [--drain 120] [--faults KIND,...]
                                    [--keep DIR]

The test suite's soak (tests/chaos/test_chaos.py) made longer: a local cluster with its
own PostgreSQL, a leader and a standby controller and ``--nodes`` agents (the last with
MIG slices through the fake NVML library, the one before it shared by shards) runs a
seeded stream of jobs of every kind, ``--rate`` a second, while faults of every kind
come ``--fault-rate`` a second (docs/faults.md). Then every fault is undone, the queue
drains (at most ``--drain`` seconds) and tests/chaos/invariants.py checks the history.

- ``faults_injected`` and ``faults_<kind>``: faults done, by kind.
- ``jobs_submitted`` (acknowledged), ``jobs_stored`` (array tasks included),
  ``jobs_ended``, ``jobs_unfinished`` (still to end when the drain stopped).
- ``jobs_lost``: acknowledged but not stored; ``submissions_stored_twice``: one
  submission stored as two jobs; ``double_starts``: one run (job, restart) that started
  twice by its record file; ``invariant_violations``: the checker's findings, each
  printed after the figures.
- ``daemon_self_exits``: daemons that exited by themselves and were started again (a
  controller started while PostgreSQL is down exits, as it should).

The seed reproduces the schedule of faults and the stream of jobs (not their timing).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.chaos import invariants  # noqa: E402
from tests.chaos.faults import KINDS, Soak, run_soak  # noqa: E402
from tests.nvml_fixture import build_fake_nvml  # noqa: E402


def _bounded(low: float, high: float,
             kind: Callable[[str], float] = float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {low} to {high}, got {text}")
        return value
    return parse


def _kinds(text: str) -> tuple[str, ...]:
    names = tuple(word.strip() for word in text.split(",") if word.strip())
    unknown = [n for n in names if n not in {k for k, *_ in KINDS}]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown kind of fault: {unknown or text!r}")
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=_bounded(10, 7 * 86_400), default=600.0,
                        help="seconds of jobs and faults (default 600)")
    parser.add_argument("--seed", type=_bounded(0, 2**31, int), default=1)
    parser.add_argument("--nodes", type=_bounded(2, 16, int), default=4)
    parser.add_argument("--rate", type=_bounded(0.1, 20), default=1.5,
                        help="jobs submitted a second (default 1.5)")
    parser.add_argument("--fault-rate", type=_bounded(0.01, 5), default=1.0,
                        help="faults a second (default 1.0)")
    parser.add_argument("--drain", type=_bounded(10, 3600), default=120.0,
                        help="seconds the queue may take to drain at the end (default 120)")
    parser.add_argument("--faults", type=_kinds, default=(),
                        help="comma-separated kinds of fault to inject (default: all of "
                             + ", ".join(k for k, *_ in KINDS) + ")")
    parser.add_argument("--keep", type=Path, default=None,
                        help="a directory to keep the logs, fault log and records in")
    opts = parser.parse_args()
    lib = build_fake_nvml(Path(tempfile.gettempdir()) / "gpusched-fakenvml")
    soak = Soak(seed=opts.seed, seconds=opts.seconds, rate=opts.rate,
                fault_rate=opts.fault_rate, nodes=opts.nodes, drain=opts.drain,
                kinds=opts.faults)
    outcome = run_soak(soak, lib, invariants, keep=opts.keep)
    for line in outcome.figures():
        print(line)
    for name, count in sorted(outcome.self_exits.items()):
        print(f"self_exits_{name}: {count}")
    for message, count in outcome.errors.most_common():
        print(f"ended with {count}x: {message}")
    findings = outcome.findings()
    for line in findings:
        print(line)
    return 1 if findings or outcome.unfinished else 0


if __name__ == "__main__":
    sys.exit(main())
