"""GPU-hour budgets end to end on a real local cluster (controller, agent, PostgreSQL):
a job whose GPUs x time limit would exceed what its account's budget has left pends
with AssocGrpGRESMinutes (gqueue, gqueue --explain) while jobs within budget start;
``gpusched balance`` shows the numbers and who may see them; ``gacct --report`` the
period's use; and a budget raised by ``gpusched admin apply`` lets the job start."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.conftest import job_user  # noqa: F401 - a fixture

ACCOUNTS = """
[[account]]
name = "physics"
gpu_hours = {hours}
gpu_hours_period = "month"

[[account]]
name = "theory"
parent = "physics"

[[user]]
name = "root"
accounts = ["physics", "theory"]
"""


@pytest.fixture
def cluster(db_url: str) -> Iterator[Cluster]:
    c = Cluster(db_url)
    try:
        yield c.up()
    finally:
        c.close()


def apply(cluster: Cluster, hours: float) -> None:
    path: Path = cluster.root / f"accounts-{hours}.toml"
    path.write_text(ACCOUNTS.format(hours=hours))
    result = cluster.run("gpusched", "admin", "apply", str(path))
    assert result.returncode == 0 and "applied" in result.stdout, result


def test_a_job_over_budget_waits_until_the_budget_is_raised(
        cluster: Cluster, job_user: tuple[int, int, str]) -> None:  # noqa: F811
    none = cluster.run("gpusched", "balance")
    assert none.returncode == 0 and "No GPU-hour budget covers any account." in none.stdout
    apply(cluster, 2)
    first = cluster.submit("-A", "physics", "--gpus", "1", "-t", "1:00:00", "--wrap", "sleep 300")
    cluster.wait_state(first, "RUNNING")
    # theory is under physics: 1 GPU-hour committed + 2 more would exceed 2.
    over = cluster.submit("-A", "theory", "--gpus", "2", "-t", "1:00:00", "--wrap", "sleep 300")
    within = cluster.submit("-A", "physics", "--gpus", "1", "-t", "30:00", "--wrap", "sleep 300")
    cluster.wait_state(within, "RUNNING")
    wait_for(lambda: cluster.job(over)["reason"] == "AssocGrpGRESMinutes",
             what="AssocGrpGRESMinutes", seen=lambda: cluster.job(over))
    assert cluster.job(over)["state"] == "PENDING"

    queue = cluster.run("gqueue")
    assert queue.returncode == 0
    line = next(line for line in queue.stdout.splitlines() if line.split()[0] == str(over))
    assert "(AssocGrpGRESMinutes)" in line
    why = cluster.run("gqueue", "--explain", str(over))
    assert why.returncode == 0, why.stderr
    assert "AssocGrpGRESMinutes: account physics has" in why.stdout
    assert "of its 2 GPU-hours left this month" in why.stdout

    answer = json.loads(cluster.run("gpusched", "balance", "--json").stdout)
    (physics,) = answer["budgets"]
    assert (physics["account"], physics["user"], physics["period"]) == (
        "physics", None, "month")
    assert physics["budget_gpu_hours"] == 2
    # Used so far and what the two running jobs may still use: 1.5 GPU-hours in all.
    assert physics["used_gpu_hours"] + physics["running_gpu_hours"] == pytest.approx(1.5, abs=0.01)
    assert physics["left_gpu_hours"] == pytest.approx(0.5, abs=0.01)
    table = cluster.run("gpusched", "balance")
    assert table.returncode == 0 and "physics" in table.stdout and "month" in table.stdout

    # A user in no account sees no budget, and may not look at another account's (their
    # own process asks: the controller knows them by the socket's credentials).
    uid, gid, name = job_user
    assert cluster.api_as(uid, gid, "GET", "/v1/balance")["budgets"] == []
    refused = cluster.api_as(uid, gid, "GET", "/v1/balance?account=physics")
    assert f"user {name} is not in account physics" in refused["error"]
    bad = cluster.run("gpusched", "balance", "-A", "no such")
    assert bad.returncode == 2 and "account: expected an account name" in bad.stderr

    report = json.loads(cluster.run("gacct", "--report", "-S", "now-1days", "--json").stdout)
    # One row per month the window touches (two on the 1st of a month).
    assert {(b["account"], b["budget_gpu_hours"]) for b in report["budgets"]} == {("physics", 2)}
    assert report["budgets"][-1]["used_gpu_hours"] > 0
    shown = cluster.run("gacct", "--report", "-S", "now-1days")
    assert "GPU-hour budgets per period" in shown.stdout

    apply(cluster, 10)
    cluster.wait_state(over, "RUNNING")
    (raised,) = json.loads(cluster.run("gpusched", "balance", "--json").stdout)["budgets"]
    assert raised["budget_gpu_hours"] == 10
    assert raised["left_gpu_hours"] == pytest.approx(10 - 3.5, abs=0.01)
