"""The node health check end to end: a real agent runs the configured program, a failure
drains its node with the program's first line, a pass returns it to service, and a drain
an administrator made is never lifted by a passing check."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, wait_for


class SiteCheck:
    """A health-check program that fails, printing ``broken``'s text, while that file
    exists, and counts its runs in ``runs``."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gpusched-healthcheck-", dir="/tmp"))
        self.dir.chmod(0o755)
        self.program = self.dir / "healthcheck"
        self.broken = self.dir / "broken"
        self.runs = self.dir / "runs"
        self.program.write_text(f"""#!/bin/sh
echo run >> {self.runs}
if [ -e {self.broken} ]; then cat {self.broken}; exit 1; fi
echo healthy
""")
        self.program.chmod(0o755)

    def toml(self, interval: float = 0.3) -> str:
        return (f'[agent.health_check]\nprogram = "{self.program}"\n'
                f"interval = {interval}\ntimeout = 10\n")

    def fail(self, text: str) -> None:
        self.broken.write_text(text)

    def heal(self) -> None:
        self.broken.unlink()

    def count(self) -> int:
        return len(self.runs.read_text().split()) if self.runs.exists() else 0

    def wait_runs(self, more: int) -> None:
        """Wait until the program has run ``more`` times from now: the reports of all
        but the last of those runs have reached the controller by then."""
        target = self.count() + more
        wait_for(lambda: self.count() >= target, what=f"{more} more health checks",
                 seen=self.count)


@pytest.fixture
def site_check() -> Iterator[SiteCheck]:
    check = SiteCheck()
    yield check
    shutil.rmtree(check.dir, ignore_errors=True)


@pytest.fixture
def make_cluster(db_url: str) -> Iterator[list[Cluster]]:
    made: list[Cluster] = []
    yield made
    for cluster in made:
        cluster.close()


def node(cluster: Cluster) -> dict[str, Any]:
    (only,) = cluster.api("GET", "/v1/nodes")["nodes"]
    return only


def state(cluster: Cluster) -> tuple[str, str | None]:
    found = node(cluster)
    return found["state"], found["reason"]


def ginfo_node(cluster: Cluster) -> dict[str, Any]:
    result = cluster.run("ginfo", "--json")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    (found,) = [n for n in shown["nodes"] if n["name"] == "node01"]
    return found


def test_a_failing_check_drains_the_node_and_a_pass_returns_it(
        db_url: str, site_check: SiteCheck, make_cluster: list[Cluster]) -> None:
    site_check.fail("GPU 1: row remapping failed (pending)\nsee dmesg\n")
    cluster = Cluster(db_url, agent_toml=site_check.toml())
    make_cluster.append(cluster)
    cluster.start("controller")
    cluster.wait_controller()
    cluster.start("agent")
    drained = ("DRAIN", "health check: GPU 1: row remapping failed (pending)")
    wait_for(lambda: cluster.api("GET", "/v1/nodes")["nodes"] and state(cluster) == drained,
             what="the node drained by its health check", seen=cluster.logs)
    assert node(cluster)["drained_by"] == "health"
    assert ginfo_node(cluster)["reason"] == drained[1]

    job = cluster.submit("--wrap", "true")
    site_check.wait_runs(3)  # the node stays drained while the check keeps failing
    assert state(cluster) == drained
    assert cluster.job(job)["state"] == "PENDING"

    site_check.heal()
    wait_for(lambda: state(cluster) == ("UP", None), what="the node back in service",
             seen=lambda: (state(cluster), cluster.logs()))
    assert node(cluster)["drained_by"] is None
    cluster.wait_state(job, "COMPLETED")

    site_check.fail("\n\nfilesystem /scratch read-only\n")  # the first non-blank line
    wait_for(lambda: state(cluster) == ("DRAIN", "health check: filesystem /scratch read-only"),
             what="drained again", seen=lambda: state(cluster))


def test_a_passing_check_never_lifts_an_administrators_drain(
        db_url: str, site_check: SiteCheck, make_cluster: list[Cluster]) -> None:
    cluster = Cluster(db_url, agent_toml=site_check.toml())
    make_cluster.append(cluster)
    cluster.up()
    site_check.wait_runs(2)
    drain = cluster.run("gcontrol", "drain", "node", "node01", "--reason", "maintenance")
    assert drain.returncode == 0, drain.stderr
    site_check.wait_runs(3)
    assert state(cluster) == ("DRAIN", "maintenance")

    site_check.fail("ib0 link down\n")  # a failure keeps the administrator's reason
    site_check.wait_runs(3)
    assert state(cluster) == ("DRAIN", "maintenance")
    site_check.heal()
    site_check.wait_runs(3)
    assert state(cluster) == ("DRAIN", "maintenance")
    assert node(cluster)["drained_by"] is None

    resume = cluster.run("gcontrol", "resume", "node", "node01")
    assert resume.returncode == 0, resume.stderr
    site_check.wait_runs(3)
    assert state(cluster) == ("UP", None)


def test_an_agent_without_a_health_check_runs_none(
        db_url: str, site_check: SiteCheck, make_cluster: list[Cluster]) -> None:
    site_check.fail("must never run\n")
    cluster = Cluster(db_url)  # the program exists but is not configured
    make_cluster.append(cluster)
    cluster.up()
    job = cluster.submit("--wrap", "true")
    cluster.wait_state(job, "COMPLETED")
    assert site_check.count() == 0 and state(cluster) == ("UP", None)
