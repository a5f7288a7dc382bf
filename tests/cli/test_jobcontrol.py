"""gcontrol's job control end to end (real controller, agent and PostgreSQL): ``top``
reorders the queue the pass works through, ``update`` in both of its forms changes a
pending job, array tasks are named ``12_3`` by gqueue -j and gcontrol show/hold/release
(a pending task is split off the array's record to be held), and bad command lines are
one error line that changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.cluster import Cluster
from tests.pg import ScratchPostgres


@pytest.fixture(scope="module")
def cluster(postgres: ScratchPostgres) -> Iterator[Cluster]:
    c = Cluster(postgres.fresh_database(), gpus=1)
    try:
        yield c.up()
    finally:
        c.close()


def _position(cluster: Cluster, job_id: int) -> Any:
    return cluster.api("GET", f"/v1/jobs/{job_id}/explain")["position"]


def _ok(cluster: Cluster, *args: str) -> str:
    done = cluster.run("gcontrol", *args)
    assert done.returncode == 0 and done.stderr == "", done
    return done.stdout


# What the scheduling pass writes on a pending job by itself, at any moment: a pass that
# runs between two reads may change them without any request.
_PASS_WRITTEN = ("reason", "expected_start")


def _as_stored(job: dict[str, object]) -> dict[str, object]:
    """The job as the user's requests left it, without what the pass writes."""
    return {key: value for key, value in job.items() if key not in _PASS_WRITTEN}


def test_top_update_and_array_tasks(cluster: Cluster) -> None:
    blocker = cluster.submit("--gpus=1", "--wrap", "sleep 60")
    cluster.wait_state(blocker, "RUNNING")
    first, second, third = (cluster.submit("--gpus=1", "-t", "30", "--wrap", "true")
                            for _ in range(3))
    assert [_position(cluster, j) for j in (first, second, third)] == [1, 2, 3]
    _ok(cluster, "top", f"{third},{second}")
    assert [_position(cluster, j) for j in (third, second, first)] == [1, 2, 3]

    said = _ok(cluster, "update", f"JobId={first}", "JobName=renamed", "TimeLimit=10",
               "NumNodes=1", "Gres=gpu:1", f"Dependency=afterok:{blocker}")
    assert f"job {first}: " in said and "name renamed" in said, said
    job = cluster.job(first)
    assert (job["name"], job["time_limit"], job["dependency"]) == (
        "renamed", 600, f"afterok:{blocker}")
    before = _as_stored(cluster.job(first))
    for args, code, words in (
            (("update", "job", str(first), "Colour=3"), 2, "invalid setting 'Colour=3'"),
            (("update", "job", str(first), "Gres=gpu:9"), 2, "no node"),
            (("update", "job", str(first), "Dependency=afterok:999999"), 2, "999999"),
            (("top", "999999"), 1, "999999"),
            (("hold", "1_x"), 2, "invalid job id '1_x'")):
        refused = cluster.run("gcontrol", *args)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == code and len(lines) == 1 and words in lines[0], refused
    assert _as_stored(cluster.job(first)) == before

    array = cluster.submit("--gpus=1", "--array=0-3", "--wrap", "true")
    listed = cluster.run("gqueue", "-j", f"{array}_2", "-h", "-o", "%i")
    assert listed.stdout.split() == [f"{array}_[0-3]"], listed
    assert "ArrayTasks=0-3" in _ok(cluster, "show", "job", f"{array}_2").split()
    _ok(cluster, "hold", f"{array}_2")
    listed = cluster.run("gqueue", "-j", f"{array}_2,{array}_3", "-h", "-o", "%i %r")
    assert listed.stdout.splitlines() == [f"{array}_[0-1,3] Priority",
                                          f"{array}_2 JobHeldAdmin"], listed
    shown = _ok(cluster, "show", "job", f"{array}_2").split()
    assert "ArrayTaskId=2" in shown and "Hold=admin" in shown, shown
    _ok(cluster, "release", f"{array}_2")
    assert cluster.run("gqueue", "-j", f"{array}_9", "-h").stdout == ""
    missing = cluster.run("gcontrol", "show", "job", f"{array}_9")
    assert missing.returncode == 1 and f"{array}_9" in missing.stderr, missing
    # The blocker last: cancelled first, its GPU could start (and end) a waiting job
    # before gcancel reached that job's id.
    assert cluster.run("gcancel", str(array), str(first), str(second), str(third),
                       str(blocker)).returncode == 0
    # gacct -j takes a task too: that task's record alone, not the array's others.
    accounted = cluster.run("gacct", "-j", f"{array}_2", "--json")
    assert accounted.returncode == 0, accounted
    records = json.loads(accounted.stdout)["jobs"]
    assert [(r["array_job_id"], r["array_task_id"]) for r in records] == [(array, 2)], records
    whole = json.loads(cluster.run("gacct", "-j", str(array), "--json").stdout)["jobs"]
    assert len(whole) == 2, whole  # the task split off and the array's record
