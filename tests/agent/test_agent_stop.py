"""SIGTERM stops a real agent promptly whatever it is doing: waiting for work from a
controller, or backing off while no controller answers. In the backoff the main thread
goes in and out of an Event's own lock; a handler that set that Event itself could wait
for the lock for ever (an agent was once found hung so, by its stack). That window is
narrow, so these rounds show the stop works at varied moments rather than catching the
old hang each time."""

from __future__ import annotations

import signal
import subprocess
import time

from tests.e2e.cluster import Cluster, wait_for
from tests.pg import ScratchPostgres

ROUNDS = 6  # SIGTERMs at varied moments of the backoff loop; each must end the agent


def _stops(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> float:
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=timeout)
    return time.monotonic() - began


def test_an_agent_without_a_controller_stops_at_once_on_sigterm() -> None:
    cluster = Cluster("postgresql+psycopg://nobody@/none?host=/nonexistent")
    try:
        for round_ in range(ROUNDS):
            log = cluster.root / "agent.log"
            mark = log.stat().st_size if log.exists() else 0
            proc = cluster.start("agent")
            # Into its backoff loop (the controller's socket does not exist), then stopped
            # at a different point of each round's waits.
            wait_for(lambda: "controller unavailable" in log.read_bytes()[mark:].decode(
                errors="replace"), timeout=30, what="the agent backing off", seen=cluster.logs)
            time.sleep(0.05 + (0.37 * round_) % 1.9)
            assert _stops(proc) < 5.0
            assert proc.returncode == 0, cluster.logs()
            del cluster.procs["agent"]
    finally:
        cluster.close()


def test_a_polling_agent_stops_at_once_on_sigterm(postgres: ScratchPostgres) -> None:
    cluster = Cluster(postgres.fresh_database(), poll_wait=20.0).up()
    try:
        time.sleep(0.5)  # in its long poll for work (20 s)
        assert _stops(cluster.procs.pop("agent")) < 5.0
    finally:
        cluster.close()
