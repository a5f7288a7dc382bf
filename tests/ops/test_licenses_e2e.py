"""Licenses (-L) end to end on a real local cluster (controller, agent, PostgreSQL):
with one ``matlab`` license, two jobs asking for it run one after the other (the second
pends with reason Licenses while the first runs: gqueue, gcontrol show job, gqueue
--explain, gcontrol show licenses say so); a job asking for two, or for a license the
cluster lacks, is refused at submit with one line and nothing stored; a directive
``#SBATCH -L`` reaches the job."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime

import pytest

from tests.e2e.cluster import Cluster, wait_for

LICENSES = """
[licenses]
matlab = 1
ansys = 4
"""


@pytest.fixture
def cluster(db_url: str) -> Iterator[Cluster]:
    c = Cluster(db_url)
    try:
        yield c.up()
    finally:
        c.close()


def apply_licenses(cluster: Cluster) -> None:
    path = cluster.root / "licenses.toml"
    path.write_text(LICENSES)
    result = cluster.run("gpusched", "admin", "apply", str(path))
    assert result.returncode == 0 and "+ license matlab (count 1)" in result.stdout, result


def show_licenses(cluster: Cluster) -> dict[str, dict[str, int]]:
    result = cluster.run("gcontrol", "show", "licenses", "--json")
    assert result.returncode == 0, result.stderr
    return {lic["license_name"]: lic for lic in
            (json.loads(chunk) for chunk in _json_chunks(result.stdout))}


def _json_chunks(text: str) -> list[str]:
    """The JSON objects gcontrol --json prints one after the other."""
    decoder, chunks, at = json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        _, end = decoder.raw_decode(text, at)
        chunks.append(text[at:end])
        at = end
        while at < len(text) and text[at].isspace():
            at += 1
    return chunks


def test_one_license_runs_two_jobs_one_after_the_other(cluster: Cluster) -> None:
    none = cluster.run("gcontrol", "show", "licenses")
    assert none.returncode == 0 and none.stdout == "No licenses are configured.\n", none
    apply_licenses(cluster)
    missing = cluster.run("gcontrol", "show", "licenses", "comsol")
    assert missing.returncode != 0 and "license comsol not found" in missing.stderr, missing
    before = len(cluster.jobs())
    # More than the cluster has, and a license it lacks: refused, nothing stored.
    for args, words in ((("-L", "matlab:2"), "more than the cluster's 1 matlab license"),
                        (("-L", "comsol"), "the cluster has no license 'comsol'"),
                        (("-L", "matlab|ansys"), "'|'")):
        refused = cluster.run("gsubmit", *args, "--wrap", "true")
        assert refused.returncode == 2, refused
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], refused.stderr
    assert len(cluster.jobs()) == before

    # The first job holds the license until the checks below are done (at most 60 s).
    release = cluster.work / "release-matlab"
    script = cluster.work / "matlab.sh"
    script.write_text("#!/bin/sh\n#SBATCH -L matlab\n"
                      f"for i in $(seq 600); do [ -e {release} ] && exit 0; sleep 0.1; done\n")
    first = cluster.submit(str(script))
    second = cluster.submit("--licenses=matlab:1", "--wrap", "true")
    free_job = cluster.submit("-L", "ansys:3", "--wrap", "sleep 2")  # other licenses: not held
    cluster.wait_state(first, "RUNNING")
    wait_for(lambda: cluster.job(second)["reason"] == "Licenses", what="reason Licenses",
             seen=lambda: cluster.job(second))
    assert cluster.job(second)["state"] == "PENDING"
    assert cluster.job(first)["licenses"] == "matlab:1"
    assert cluster.wait_state(free_job, "RUNNING", "COMPLETED")["licenses"] == "ansys:3"

    queue = cluster.run("gqueue")
    line = next(line for line in queue.stdout.splitlines() if line.split()[0] == str(second))
    assert "(Licenses)" in line
    shown = cluster.run("gcontrol", "show", "job", str(second))
    assert shown.returncode == 0 and "Licenses=matlab:1" in shown.stdout, shown
    why = cluster.run("gqueue", "--explain", str(second))
    assert why.returncode == 0 and "matlab:1 (0 of 1 free)" in why.stdout, why
    held = show_licenses(cluster)
    assert (held["matlab"]["total"], held["matlab"]["used"], held["matlab"]["free"]) == (1, 1, 0)
    plain = cluster.run("gcontrol", "show", "licenses", "matlab")
    assert "LicenseName=matlab Total=1 Used=1 Free=0" in plain.stdout, plain

    release.touch()
    done_first = cluster.wait_state(first, "COMPLETED", timeout=30)
    done_second = cluster.wait_state(second, "COMPLETED", timeout=30)
    # One after the other: the second started only once the first had ended.
    assert (datetime.fromisoformat(done_second["start_time"])
            >= datetime.fromisoformat(done_first["end_time"]))
    cluster.wait_state(free_job, "COMPLETED", timeout=30)
    assert show_licenses(cluster)["matlab"]["used"] == 0


def test_array_tasks_hold_the_license_one_at_a_time(cluster: Cluster) -> None:
    apply_licenses(cluster)
    array = cluster.submit("--array=0-2", "-L", "matlab", "--wrap", "sleep 1")

    def tasks() -> list[dict[str, object]]:
        return [j for j in cluster.jobs() if j.get("array_job_id") == array]

    most = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seen = tasks()
        most = max(most, sum(1 for j in seen if j["state"] == "RUNNING"))
        assert show_licenses(cluster)["matlab"]["used"] <= 1
        if len(seen) == 3 and all(j["state"] == "COMPLETED" for j in seen):
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the array did not complete: {tasks()}")
    assert most == 1 and all(j["licenses"] == "matlab:1" for j in tasks())
