"""Real controllers keep the admin tables between passes, with the safety-net reload
an hour away: only the NOTIFY of a change (from another controller process, or the
controller's own admin apply) can make the next pass see it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster, wait_for

BIN = Path(sys.executable).parent


@pytest.fixture
def cached_cluster(db_url: str) -> Iterator[Cluster]:
    c = Cluster(db_url)
    c.config.write_text(c.config.read_text() + "\n[scheduler]\nadmin_cache_max_age = 3600\n")
    try:
        yield c.up()
    finally:
        c.close()


def apply_qos(cluster: Cluster, max_jobs: int, socket: Path) -> None:
    path = cluster.root / f"qos{max_jobs}.toml"
    path.write_text(f'[[qos]]\nname = "normal"\nmax_jobs_per_user = {max_jobs}\n')
    result = subprocess.run([str(BIN / "gpusched"), "admin", "apply", str(path)],
                            capture_output=True, text=True, timeout=60, cwd=cluster.root,
                            env={**os.environ, "GPUSCHED_SOCKET": str(socket)})
    assert result.returncode == 0 and "applied" in result.stdout, result


def held_by_qos(cluster: Cluster, job: int) -> None:
    wait_for(lambda: cluster.job(job)["reason"] == "QOSMaxJobsPerUserLimit",
             what="the QOS limit's reason", seen=lambda: (cluster.job(job), cluster.logs()))


def test_changes_from_another_controller_and_its_own_reach_the_next_pass(
        cached_cluster: Cluster) -> None:
    cluster = cached_cluster
    apply_qos(cluster, 1, cluster.socket)
    first = cluster.submit("--gpus", "1", "--wrap", "sleep 60")
    cluster.wait_state(first, "RUNNING")
    second = cluster.submit("--gpus", "1", "--wrap", "sleep 60")
    held_by_qos(cluster, second)

    standby = cluster.start_standby()
    wait_for(lambda: cluster.try_api("GET", "/v1/ping", socket=standby), what="standby",
             seen=cluster.logs)
    apply_qos(cluster, 2, standby)  # another controller process: heard through NOTIFY
    cluster.wait_state(second, "RUNNING")

    apply_qos(cluster, 1, cluster.socket)
    third = cluster.submit("--gpus", "1", "--wrap", "true")
    held_by_qos(cluster, third)
    apply_qos(cluster, 3, cluster.socket)  # the leader's own admin apply
    cluster.wait_state(third, "RUNNING", "COMPLETED")
