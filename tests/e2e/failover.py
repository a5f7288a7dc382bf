"""Two controllers on one database, the leader ended (SIGKILL or SIGSTOP) during a
stream of submissions: how long until the standby starts jobs, and whether any
acknowledged submission was lost or any job started twice. Used by the failover test
and by bench/failover.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from gpusched.client import ApiClient
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.dbview import leader, query
from tests.pg import ScratchPostgres

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
