"""gacct on a live cluster: what jobs used, and the usage report."""

from __future__ import annotations

import json

import pytest

from tests.e2e.cluster import Cluster


def test_gacct_lists_jobs_and_reports_usage(cluster: Cluster) -> None:
    ok = cluster.submit("-G", "2", "-J", "two", "--wrap", "sleep 1")
    bad = cluster.submit("-G", "1", "--wrap", "exit 3")
    done = cluster.wait_state(ok, "COMPLETED")
    cluster.wait_state(bad, "FAILED")
    answer = json.loads(cluster.run("gacct", "-j", f"{ok},{bad}", "--json").stdout)
    records = {r["job_id"]: r for r in answer["jobs"]}
    assert set(records) == {ok, bad}
    two = records[ok]
    assert (two["state"], two["gpus"], two["name"]) == ("COMPLETED", 2, "two")
    assert 1.0 <= two["elapsed_s"] < 10
    assert two["gpu_hours"] == pytest.approx(2 * two["elapsed_s"] / 3600, rel=0.1)
    assert two["billed_gpu_hours"] == pytest.approx(two["gpu_hours"])  # no billing weights
    assert records[bad]["exit_code"] == 3
    table = cluster.run("gacct", "-s", "F").stdout.splitlines()
    assert table[0].split()[:6] == ["JOBID", "JOBNAME", "PARTITION", "ACCOUNT", "USER", "STATE"]
    assert [line.split()[0] for line in table[1:]] == [str(bad)]
    assert "FAILED" in table[1].split() and "3:0" in table[1].split()
    plot = cluster.work / "usage.png"
    report = cluster.run("gacct", "--report", "-S", "now-1hour", "--plot", str(plot), "--json")
    assert report.returncode == 0, report.stderr
    rows = json.loads(report.stdout)["rows"]
    assert len(rows) == 1 and rows[0]["jobs"] == 2 and rows[0]["user"] == done["user"]
    assert rows[0]["gpu_hours"] == pytest.approx(two["gpu_hours"] + records[bad]["gpu_hours"], rel=0.05)
    assert plot.read_bytes()[:4] == b"\x89PNG"
    text = cluster.run("gacct", "--report", "-S", "today").stdout
    assert "TOTAL" in text
    for args, words in [(["-S", "someday"], "invalid --starttime 'someday'"),
                        (["--plot", "x.png"], "--plot goes with --report"),
                        (["-s", "XX"], "unknown job state 'XX'"),
                        (["-S", "now", "-E", "now-1hour"], "--endtime must be after")]:
        result = cluster.run("gacct", *args)
        assert result.returncode == 2 and words in result.stderr, (args, result.stderr)
