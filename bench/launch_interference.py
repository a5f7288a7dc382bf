"""How much a node busy launching jobs slows a command started beside it; prints
``name: value`` lines.

    .venv/bin/python bench/launch_interference.py [--interval 0.025] [--trials 40]
                                                  [--rounds 2] [--no-cgroups] [--python PY]

In a loop of ``gsubmit`` calls, each call runs while the job the call before submitted is
started, run and ended: the controller's passes, the agent's launch, the job's
supervisor and the job itself, the end's report. This bench measures what that costs a
process beside it. A scratch cluster (one agent with 4 GPUs) is fed one trivial job
(``true``, no GPUs) every ``--interval`` seconds through one keep-alive API client,
while ``PY -c pass`` (the interpreter under every command; default: this one) is timed
``--trials`` times, back to back:

- ``start_quiet_ms``: with nothing fed;
- ``start_beside_launches_ms``: fed jobs that start, run and end;
- ``start_beside_held_ms``: fed held jobs (stored, never started): the API's and the
  database's part alone;
- ``jobs_fed``: the jobs fed while ``start_beside_launches_ms`` was timed (the bench
  fails unless every one of them completes within 30 s of the last round).

Each figure is the median of all its trials: ``--rounds`` rounds of the three in turn.
``--no-cgroups``: the agent confines no job (``[agent.cgroups] enforce = "off"``), to
tell the cgroups' part from the rest of a launch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from starts import start_times  # noqa: E402

from gpusched.client import ApiClient  # noqa: E402
from tests.e2e.cluster import Cluster, scratch_cluster, wait_for  # noqa: E402


def start_ms(python: str, trials: int, cwd: Path) -> list[float]:
    """Wall times of ``python -c pass``, back to back, in ms."""
    return start_times([python, "-c", "pass"], trials, cwd=cwd)


def feed(work: Path, interval: float, hold: bool, stop: threading.Event,
         fed: list[int]) -> None:
    """One job every ``interval`` seconds until ``stop``; the count in ``fed``."""
    with ApiClient() as client:
        while not stop.is_set():
            body = {"script": "#!/bin/sh\ntrue\n", "work_dir": str(work), "environment": {},
                    "submit_key": os.urandom(16).hex(), "hold": hold}
            client.request("POST", "/v1/jobs", body)
            fed[0] += 1
            stop.wait(interval)


def beside(work: Path, python: str, trials: int, interval: float,
           hold: bool) -> tuple[list[float], int]:
    """The start times while jobs are fed, and how many were."""
    stop, fed = threading.Event(), [0]
    feeder = threading.Thread(target=feed, args=(work, interval, hold, stop, fed))
    feeder.start()
    try:
        time.sleep(0.3)  # the first jobs under way
        took = start_ms(python, trials, work)
    finally:
        stop.set()
        feeder.join()
    time.sleep(0.5)  # the last ones ended
    return took, fed[0]  # counted once the feeder has stopped


def completed(cluster: Cluster) -> list[object]:
    """The cluster's completed jobs."""
    return list(cluster.api("GET", "/v1/jobs?state=COMPLETED&fields=job_id")["rows"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.025)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-cgroups", action="store_true")
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    options = {"agent_toml": '[agent.cgroups]\nenforce = "off"'} if args.no_cgroups else {}
    took: dict[str, list[float]] = {"start_quiet_ms": [], "start_beside_launches_ms": [],
                                    "start_beside_held_ms": []}
    fed = 0
    with scratch_cluster(**options) as (cluster, _):
        os.environ["GPUSCHED_SOCKET"] = str(cluster.socket)
        for _ in range(args.rounds):  # the three in turn, so that drift touches each alike
            took["start_quiet_ms"] += start_ms(args.python, args.trials, cluster.work)
            times, count = beside(cluster.work, args.python, args.trials, args.interval, False)
            took["start_beside_launches_ms"] += times
            fed += count
            times, _ = beside(cluster.work, args.python, args.trials, args.interval, True)
            took["start_beside_held_ms"] += times
        try:
            wait_for(lambda: len(completed(cluster)) == fed, timeout=30,
                     what=f"the {fed} jobs fed to start to complete",
                     seen=lambda: f"{len(completed(cluster))} completed")
        except AssertionError as exc:
            raise SystemExit(str(exc)) from None
    for name, times in took.items():
        print(f"{name}: {statistics.median(times):.1f}")
    print(f"jobs_fed: {fed}")

if __name__ == "__main__":
    main()
