"""Node failure figures; prints ``name: value`` lines.

    .venv/bin/python bench/node_failure.py [--rounds 3] [--node-timeout 5] [--jobs 4]

Each round: a controller (``node_timeout`` as given, agents polling every second) on a
scratch PostgreSQL, node01 running ``--jobs`` one-GPU jobs, node02 idle; then node01
dies whole (SIGKILL to its agent, its jobs' supervisors and the jobs).

- ``requeued_s``: from the kill until every job of node01 is back in the queue (its
  restart count up by one); the goal is at most node_timeout + 5 s.
- ``running_again_s``: until every one of them runs again, on node02.
- ``jobs_started_twice``: runs started more than once (by the jobs' own log).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.cluster import Cluster, wait_for  # noqa: E402
from tests.e2e.nodes import Node, set_controller  # noqa: E402
from tests.pg import ScratchPostgres  # noqa: E402

JOB = ('#!/bin/sh\necho "$SLURM_JOB_ID $SLURM_RESTART_COUNT" >> starts.log\n'
       'while [ ! -e release ]; do sleep 0.1; done\n')


def one_round(pg: ScratchPostgres, node_timeout: float, count: int) -> dict[str, Any]:
    cluster = Cluster(pg.fresh_database(), gpus=count, poll_wait=1.0)
    set_controller(cluster, node_timeout=node_timeout)
    node01, node02 = Node(cluster, "node01"), Node(cluster, "node02", gpus=count)
    try:
        cluster.up()
        script = cluster.work / "job.sh"
        script.write_text(JOB)
        jobs = [cluster.submit("--gpus", "1", "-o", "/dev/null", str(script))
                for _ in range(count)]
        for job in jobs:
            cluster.wait_state(job, "RUNNING")
        log = cluster.work / "starts.log"
        wait_for(lambda: log.exists() and len(log.read_text().split("\n")) > count,
                 what="every job running")
        node02.start()
        killed = time.time()
        node01.die()

        def restarts() -> list[int]:
            return [cluster.job(job)["restarts"] for job in jobs]

        wait_for(lambda: restarts() == [1] * count, timeout=node_timeout + 60,
                 what="every job requeued", seen=restarts)
        requeued = time.time() - killed
        wait_for(lambda: all(cluster.job(j)["state"] == "RUNNING" for j in jobs),
                 timeout=60, what="every job running again")
        running = time.time() - killed
        wait_for(lambda: len(log.read_text().split("\n")) > 2 * count,
                 what="every second run started")
        (cluster.work / "release").touch()
        for job in jobs:
            cluster.wait_state(job, "COMPLETED", timeout=30)
        starts = Counter(log.read_text().split("\n")[:-1])
        return {"requeued": requeued, "running": running,
                "twice": sum(1 for n in starts.values() if n > 1)}
    finally:
        node02.stop_jobs()
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--node-timeout", type=float, default=5.0)
    parser.add_argument("--jobs", type=int, default=4)
    opts = parser.parse_args()
    pg = ScratchPostgres()
    try:
        rounds = [one_round(pg, opts.node_timeout, opts.jobs) for _ in range(opts.rounds)]
    finally:
        pg.close()
    requeued = [r["requeued"] for r in rounds]
    running = [r["running"] for r in rounds]
    print(f"node_timeout_s: {opts.node_timeout:g}")
    print("agent_poll_wait_s: 1")
    print(f"goal_requeued_s: {opts.node_timeout + 5:g}")
    print(f"requeued_s_median: {statistics.median(requeued):.2f}")
    print(f"requeued_s_max: {max(requeued):.2f}")
    print(f"running_again_s_median: {statistics.median(running):.2f}")
    print(f"running_again_s_max: {max(running):.2f}")
    print(f"jobs_started_twice: {sum(r['twice'] for r in rounds)}")
    print(f"rounds: {len(rounds)}")


if __name__ == "__main__":
    main()
