"""``gpusched diag`` (``GET /v1/diag``) on a real cluster: passes, backfill, starts by
kind, requests per route, the agent's heartbeat and the database pool."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import BIN, Cluster, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(db_url: str) -> Iterator[Cluster]:
    made = Cluster(db_url)
    try:
        yield made.up()
    finally:
        made.close()


def route(answer: dict[str, Any], method: str, path: str) -> dict[str, Any] | None:
    found = [r for r in answer["api"] if (r["method"], r["route"]) == (method, path)]
    return found[0] if found else None


def test_diag_counts_passes_backfill_and_requests(cluster: Cluster) -> None:
    first = json.loads(cluster.run("gpusched", "diag", "--json").stdout)
    assert first["controller"]["leader"] is True
    assert first["database"]["reachable"] is True
    assert first["database"]["pool"]["size"] == 20
    assert first["database"]["pool"]["checked_out"] >= 0
    [agent] = first["agents"]
    assert (agent["node"], agent["state"]) == ("node01", "UP")
    assert 0 <= agent["heartbeat_age_s"] < 30
    assert first["scheduler"]["starts"] == {"immediate": 0, "backfilled": 0}

    big = cluster.submit("-G", "3", "-t", "1:00", "--wrap", "sleep 60")
    cluster.wait_state(big, "RUNNING")
    cluster.submit("-G", "4", "-t", "1:00", "--wrap", "true")  # waits for big's GPUs
    short = cluster.submit("-G", "1", "-t", "0:30", "--wrap", "true")
    assert cluster.wait_state(short, "COMPLETED")["start_kind"] == "backfilled"

    before = cluster.api("GET", "/v1/diag")
    for _ in range(3):
        cluster.api("GET", "/v1/partitions")
    after = cluster.api("GET", "/v1/diag")
    sched = after["scheduler"]
    assert sched["starts"] == {"immediate": 1, "backfilled": 1}
    assert sched["passes"] >= 2 and sched["passes"] >= before["scheduler"]["passes"]
    assert sched["depth"]["max"] >= 2  # the pass that backfilled looked past the head job
    assert 0 < sched["last_ms"] <= sched["max_ms"]
    assert sched["last_pass_at"] is not None
    had = route(before, "GET", "/v1/partitions")
    assert route(after, "GET", "/v1/partitions")["count"] == (had["count"] if had else 0) + 3
    submits = route(after, "POST", "/v1/jobs")
    assert submits is not None and submits["count"] == 3 and submits["errors"] == 0
    assert submits["max_ms"] >= submits["mean_ms"] > 0
    assert route(after, "GET", "/v1/diag")["count"] >= 1

    text = cluster.run("gpusched", "diag")
    assert text.returncode == 0, text.stderr
    assert "Scheduling passes" in text.stdout
    assert "1 immediate, 1 backfilled" in text.stdout
    assert "/v1/partitions" in text.stdout and "node01" in text.stdout
    assert cluster.run("gcancel", str(big)).returncode == 0


def test_anyone_may_read_diag_and_a_bad_request_is_counted(cluster: Cluster) -> None:
    seen = cluster.api_as(65534, 65534, "GET", "/v1/diag")
    assert "error" not in seen and seen["controller"]["leader"] is True
    bad = cluster.run("gsubmit", "--gpus", "99", "--wrap", "true")
    assert bad.returncode != 0
    after = wait_for(lambda: route(cluster.api("GET", "/v1/diag"), "POST", "/v1/jobs"),
                     what="the refused submission counted")
    assert after["errors"] == after["count"] == 1
    unknown = cluster.run("gpusched", "diag", "--bogus")
    assert unknown.returncode == 2 and "--bogus" in unknown.stderr


def test_without_a_controller_diag_is_one_error_line(tmp_path: Path) -> None:
    result = subprocess.run([str(BIN / "gpusched"), "diag"], capture_output=True, text=True,
                            env={**os.environ, "GPUSCHED_SOCKET": str(tmp_path / "none.sock")},
                            timeout=60)
    assert result.returncode == 1 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert "cannot reach the gpusched controller" in line
