"""What users see of job steps through the real gcancel and gacct against a real
controller: ``gcancel JOB.STEP`` cancels or signals one step (its node gets the command),
bad step ids are one line each, and ``gacct`` lists a job's batch script and steps after
the job (``-X`` without them, ``-j JOB.STEP`` one step, ``--json`` a ``steps`` list).
Node ``n9`` has no agent process: the test speaks for it through the agent API, as root
on the local socket (what its agent would do)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.cluster import Cluster


@pytest.fixture(scope="module")
def cluster(postgres: Any) -> Iterator[Cluster]:
    c = Cluster(postgres.fresh_database())
    try:
        yield c.up()
    finally:
        c.close()


STEP = {"argv": ["true"], "work_dir": "/tmp",
        "io": {"host": "127.0.0.1", "port": 45_000, "token": "1a" * 32}}


def _step_commands(cluster: Cluster) -> list[tuple[str, dict[str, Any]]]:
    work = cluster.api("GET", "/agent/v1/work?node=n9&wait=0")["commands"]
    return [(c["kind"], c["payload"]) for c in work if c["kind"].startswith("step")]


def test_gcancel_a_step_and_gacct_lists_steps(cluster: Cluster) -> None:
    cluster.api("POST", "/agent/v1/register", {"node": "n9", "uid": 0, "gpus": [], "cpus": 8,
                                               "memory_mb": 65536, "address": "192.0.2.9"})
    job_id = cluster.submit("--nodelist", "n9", "--wrap", "true")
    cluster.wait_state(job_id, "RUNNING")
    made = cluster.api("POST", f"/v1/jobs/{job_id}/steps", STEP)
    assert (made["step_id"], made["node_names"], made["master_addr"]) == (0, ["n9"],
                                                                          "192.0.2.9")
    assert cluster.api("POST", f"/v1/jobs/{job_id}/steps", {**STEP, "overlap": True,
                                                            "name": "eval"})["step_id"] == 1
    assert [kind for kind, _ in _step_commands(cluster)] == ["step", "step"]
    done = cluster.run("gcancel", f"{job_id}.0")
    assert done.returncode == 0 and done.stderr == "", done
    signalled = cluster.run("gcancel", "--signal", "USR1", f"{job_id}.1")
    assert signalled.returncode == 0, signalled
    assert _step_commands(cluster) == [("step_cancel", {"step_id": 0, "signal": None}),
                                       ("step_cancel", {"step_id": 1, "signal": 10})]
    missing = cluster.run("gcancel", f"{job_id}.7")
    assert missing.returncode == 1
    assert missing.stderr.splitlines() == [
        f"gcancel: error: invalid step id specified: {job_id}.7"]
    for bad, message in ((f"{job_id}.x", "invalid step id"), (f"{job_id}.0 -u root",
                                                               "takes no filters")):
        refused = cluster.run("gcancel", *bad.split())
        assert refused.returncode == 2, refused
        assert len(refused.stderr.splitlines()) == 1 and message in refused.stderr
    ended = f"/agent/v1/jobs/{job_id}/steps/%d/ended"
    cluster.api("POST", ended % 0, {"node": "n9", "outcome": "cancelled", "signal": 15})
    cluster.api("POST", ended % 1, {"node": "n9", "outcome": "completed", "exit_code": 0,
                                    "max_rss_bytes": 3 * 2**20, "cpu_usec": 1_500_000})
    cluster.api("POST", f"/agent/v1/jobs/{job_id}/ended",
                {"node": "n9", "run": 0, "outcome": "completed", "exit_code": 0})
    cluster.wait_state(job_id, "COMPLETED")

    table = cluster.run("gacct", "-j", str(job_id))
    assert table.returncode == 0, table
    rows = [line.split() for line in table.stdout.splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows] == [
        (str(job_id), "wrap"), (f"{job_id}.batch", "batch"), (f"{job_id}.0", "true"),
        (f"{job_id}.1", "eval")]
    assert "CANCELLED" in rows[2] and "0:15" in rows[2]
    assert "COMPLETED" in rows[3] and rows[3][-2:] == ["3M", "00:01.500"]
    alone = cluster.run("gacct", "-X", "-j", str(job_id))
    assert [line.split()[0] for line in alone.stdout.splitlines()[1:]] == [str(job_id)]
    one = cluster.run("gacct", "-j", f"{job_id}.1")
    assert [line.split()[0] for line in one.stdout.splitlines()[1:]] == [f"{job_id}.1"]
    bad = cluster.run("gacct", "-j", f"{job_id}.two")
    assert bad.returncode == 2 and bad.stderr.splitlines() == [
        f"gacct: error: invalid step id '{job_id}.two': expected JOB.STEP such as 12.3 or "
        "12.batch"]
    records = json.loads(cluster.run("gacct", "--json", "-j", str(job_id)).stdout)["jobs"]
    assert [(s["step"], s["state"], s["node_names"]) for s in records[0]["steps"]] == [
        ("batch", "COMPLETED", ["n9"]), ("0", "CANCELLED", ["n9"]),
        ("1", "COMPLETED", ["n9"])]
