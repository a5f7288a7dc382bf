"""Controller failover figures; prints ``name: value`` lines.

    .venv/bin/python bench/failover.py [--rounds 3] [--rate 20]

Two controllers on one scratch PostgreSQL (the second a standby), one agent that talks
to the standby's socket, and a client submitting a stream of short jobs (``--rate`` a
second) to the leader, turning to the standby when the leader stops answering.
Each round ends the leader one way, then starts a fresh pair:

- ``kill9``: SIGKILL; its connections close, so its lock goes at once.
- ``frozen``: SIGSTOP; its connections stay open until PostgreSQL ends the idle lock
  connection (db/leadership.py, LEADER_IDLE_TIMEOUT).

- ``failover_<how>_s``: from ending the leader to the first job the standby starts (the
  creation of the first launch command of the standby's epoch); median and max.
- ``submissions_acknowledged``, ``submissions_lost`` (acknowledged, yet not in the
  database), ``jobs_started_twice`` (by their scripts' own log and by launch commands
  per run), ``submit_errors_during_failover`` (refused or unanswered while no
  controller led; a client retries those).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpusched.client import ApiClient  # noqa: E402
from tests.e2e.cluster import Cluster, wait_for  # noqa: E402
from tests.e2e.dbview import leader, query  # noqa: E402
from tests.pg import ScratchPostgres  # noqa: E402

JOB = 'echo "$SLURM_JOB_ID" >> starts.log'


class Stream:
    """Submits a job every 1/rate seconds to the first controller that answers."""

    def __init__(self, sockets: list[Path], work: Path, rate: float) -> None:
        self.sockets, self.work, self.rate = sockets, work, rate
        self.acknowledged: list[int] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        body = {"script": f"#!/bin/sh\n{JOB}\n", "work_dir": str(self.work), "gpus": 1,
                "output": "/dev/null"}
        which = 0
        while not self._stop.wait(1 / self.rate):
            try:
                with ApiClient(self.sockets[which], timeout=5) as client:
                    self.acknowledged.append(client.request("POST", "/v1/jobs", body)["job_id"])
            except Exception:  # noqa: BLE001 - a dead or frozen controller: try the other
                self.errors += 1
                which = (which + 1) % len(self.sockets)


def one_round(pg: ScratchPostgres, how: str, rate: float) -> dict[str, Any]:
    url = pg.fresh_database()
    cluster = Cluster(url, gpus=8, poll_wait=2.0)
    try:
        cluster.start("controller")
        cluster.wait_controller()
        standby = cluster.start_standby()
        wait_for(lambda: cluster.try_api("GET", "/v1/ping", socket=standby), what="standby")
        log = open(cluster.root / "agent.log", "ab")
        cluster.procs["agent"] = subprocess.Popen(  # the agent follows the standby's socket
            [sys.executable, "-P", "-m", "gpusched.cli.gpusched", "agent", "--config",
             str(cluster.root / "standby.toml")], stdout=log, stderr=log,
            stdin=subprocess.DEVNULL, env=cluster.env)
        log.close()
        cluster.wait_node_up()
        epoch, _ = leader(url)
        stream = Stream([cluster.socket, standby], cluster.work, rate)
        stream.start()
        wait_for(lambda: len(stream.acknowledged) >= 2 * rate, timeout=30, what="a stream")
        first = cluster.procs["controller"]
        ended = time.time()
        first.send_signal(signal.SIGKILL if how == "kill9" else signal.SIGSTOP)
        wait_for(lambda: query(url, "SELECT 1 FROM node_commands WHERE epoch > :e LIMIT 1",
                               e=epoch), timeout=60, what="a start by the standby")
        took = query(url, "SELECT extract(epoch FROM min(created_at)) FROM node_commands "
                     "WHERE kind = 'launch' AND epoch > :e", e=epoch)[0][0]
        errors_at_takeover = stream.errors
        time.sleep(2 * 1 / rate + 1)  # a few more submissions through the new leader
        stream.stop()
        if how == "frozen":
            first.send_signal(signal.SIGCONT)
        ids = stream.acknowledged

        def ended_all() -> bool:
            return not query(url, "SELECT 1 FROM jobs WHERE state IN ('PENDING', 'RUNNING') "
                             "LIMIT 1")

        wait_for(ended_all, timeout=120, what="every job to end")
        stored = {job_id for (job_id,) in query(url, "SELECT id FROM jobs")}
        log_path = cluster.work / "starts.log"
        starts = Counter(log_path.read_text().split()) if log_path.exists() else Counter()
        twice_by_log = sum(1 for count in starts.values() if count > 1)
        twice_by_commands = query(url, "SELECT count(*) FROM (SELECT job_id, run FROM "
                                  "node_commands WHERE kind = 'launch' GROUP BY job_id, run "
                                  "HAVING count(*) > 1) AS t")[0][0]
        not_run = [j for j in ids if str(j) not in starts]
        return {"failover": float(took) - ended, "acknowledged": len(ids),
                "lost": len(set(ids) - stored), "twice": max(twice_by_log, twice_by_commands),
                "errors": errors_at_takeover, "not_run": len(not_run)}
    finally:
        for proc in cluster.procs.values():
            proc.send_signal(signal.SIGCONT)
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=20.0)
    opts = parser.parse_args()
    pg = ScratchPostgres()
    try:
        results: dict[str, list[dict[str, Any]]] = {"kill9": [], "frozen": []}
        for _ in range(opts.rounds):
            for how in results:
                results[how].append(one_round(pg, how, opts.rate))
    finally:
        pg.close()
    for how, rounds in results.items():
        times = [r["failover"] for r in rounds]
        print(f"failover_{how}_s_median: {statistics.median(times):.2f}")
        print(f"failover_{how}_s_max: {max(times):.2f}")
    every = [r for rounds in results.values() for r in rounds]
    print(f"rounds: {len(every)}")
    print(f"submissions_acknowledged: {sum(r['acknowledged'] for r in every)}")
    print(f"submissions_lost: {sum(r['lost'] for r in every)}")
    print(f"acknowledged_jobs_never_run: {sum(r['not_run'] for r in every)}")
    print(f"jobs_started_twice: {sum(r['twice'] for r in every)}")
    print(f"submit_errors_during_failover: {sum(r['errors'] for r in every)}")


if __name__ == "__main__":
    main()
