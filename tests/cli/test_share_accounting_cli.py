"""Shares and slices in what users see, through the real CLIs against a real controller:
``gacct`` shows what each job holds (ALLOCTRES, -p/-P, --json) and bills a share as its
fraction of the GPU, ``ginfo`` how each partition shares its GPUs and the units shares
hold of each GPU. Node ``n9`` has no agent process: the test registers it through the
agent API, as root on the local socket (what its agent would do), and the controller's
own passes start the jobs there."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.cluster import Cluster

N9_GPUS = [
    {"index": 0, "uuid": "GPU-n9-0", "type": "a100", "memory_mb": 40_000},
    {"index": 1, "uuid": "GPU-n9-1", "type": "a100", "memory_mb": 40_000},
    {"index": 2, "uuid": "GPU-n9-2", "type": "a100", "memory_mb": 40_000},
    {"index": 20, "uuid": "MIG-n9-2-0", "type": "a100", "mig_profile": "1g.10gb", "parent": 2,
     "memory_mb": 10_000}]


@pytest.fixture(scope="module")
def cluster(postgres: Any) -> Iterator[Cluster]:
    c = Cluster(postgres.fresh_database())
    try:
        yield c.up()
    finally:
        c.close()


def test_gacct_and_ginfo_show_shares_and_slices(cluster: Cluster) -> None:
    # No partition shares its GPUs yet: ginfo has no sharing columns.
    assert cluster.run("ginfo").stdout.splitlines()[0].split()[-2:] == ["MIG(F/U)", "NODELIST"]
    assert cluster.run("ginfo", "-N").stdout.splitlines()[0].split()[-2:] == ["MIG(F/U)", "REASON"]
    cluster.api("POST", "/agent/v1/register", {"node": "n9", "uid": 0, "gpus": N9_GPUS,
                                                "cpus": 8, "memory_mb": 65536})
    toml = cluster.root / "partitions.toml"
    toml.write_text('[[partition]]\nname = "gpu"\ndefault = true\n'
                    '[[partition]]\nname = "shared"\nnodes = "n9"\nsharing = "mps"\n')
    applied = cluster.run("gpusched", "admin", "apply", str(toml))
    assert applied.returncode == 0, applied.stderr
    most = cluster.submit("-p", "shared", "--gres=mps:60", "--wrap", "sleep 600")
    cluster.wait_state(most, "RUNNING")
    quarter = cluster.submit("-p", "shared", "--gres=mps:25", "--wrap", "sleep 600")
    cluster.wait_state(quarter, "RUNNING")
    whole = cluster.submit("-w", "n9", "-G", "1", "--wrap", "sleep 600")
    sliced = cluster.submit("-w", "n9", "-G", "1g.10gb:1", "--wrap", "sleep 600")
    cluster.wait_state(whole, "RUNNING")
    cluster.wait_state(sliced, "RUNNING")
    ids = f"{most},{quarter},{whole},{sliced}"

    records = {r["job_id"]: r for r in json.loads(
        cluster.run("gacct", "--json", "-j", ids).stdout)["jobs"]}
    assert {j: r["alloc_tres"] for j, r in records.items()} == {
        most: "gres/mps=60", quarter: "gres/mps=25", whole: "gres/gpu=1",
        sliced: "gres/gpu:1g.10gb=1"}
    held = records[most]["alloc"][0]
    assert (held["node"], held["share_mode"], held["units"], held["of"], held["fraction"]) \
        == ("n9", "mps", 60, 100, 0.6)
    assert records[quarter]["alloc"][0]["gpu_index"] == held["gpu_index"]  # best fit
    for job_id, fraction in ((most, 0.6), (quarter, 0.25), (whole, 1.0), (sliced, 1.0)):
        record = records[job_id]
        assert record["gpu_hours"] == pytest.approx(
            fraction * record["elapsed_s"] / 3600, rel=0.01, abs=1e-6), record

    parsable = cluster.run("gacct", "-P", "-X", "-j", ids)
    assert parsable.returncode == 0, parsable.stderr
    header, *rows = [line.split("|") for line in parsable.stdout.splitlines()]
    assert header[8:12] == ["GPUS", "ALLOCTRES", "GPU_HRS", "BILLED"]
    assert {row[0]: (row[8], row[9]) for row in rows} == {
        str(most): ("1", "gres/mps=60"), str(quarter): ("1", "gres/mps=25"),
        str(whole): ("1", "gres/gpu=1"), str(sliced): ("1", "gres/gpu:1g.10gb=1")}
    trailing = cluster.run("gacct", "-p", "-X", "-j", str(most)).stdout.splitlines()
    assert len(trailing) == 2 and all(line.endswith("|") for line in trailing)
    assert trailing[1].split("|")[9] == "gres/mps=60"
    table = cluster.run("gacct", "-X", "-j", str(sliced))
    assert table.stdout.splitlines()[0].split()[8:10] == ["GPUS", "ALLOCTRES"]
    assert "gres/gpu:1g.10gb=1" in table.stdout.splitlines()[1].split()
    for args, words in ((["--json", "-P"], "choose one of --json, --parsable (-p) and"),
                        (["--report", "-p"], "--parsable and --parsable2 go with the job list")):
        refused = cluster.run("gacct", *args)
        assert refused.returncode == 2 and words in refused.stderr, refused

    info = json.loads(cluster.run("ginfo", "--json").stdout)
    n9 = next(n for n in info["nodes"] if n["name"] == "n9")
    assert (n9["sharing"], n9["shares"], n9["shares_in_use"]) == (
        "mps", 100, [{"gpu": held["gpu_index"], "units": 85}])
    assert {(r["partition"], r["sharing"], r["shares"]) for r in info["partitions"]} == {
        ("gpu*", None, None), ("shared", "mps", 100)}
    listed = cluster.api("GET", "/v1/partitions")["partitions"]
    assert [(p["name"], p["sharing"], p["shares"]) for p in listed if p["state"] == "UP"] == [
        ("gpu", None, None), ("shared", "mps", 100)]
    gpus = {g["uuid"]: g for n in cluster.api("GET", "/v1/nodes")["nodes"] for g in n["gpus"]}
    assert gpus[held["gpu_uuid"]]["share_units"] == 85
    assert gpus["MIG-n9-2-0"]["share_units"] == 0
    per_node = cluster.run("ginfo", "-N").stdout.splitlines()
    assert per_node[0].split()[6:8] == ["SHARES", "REASON"]
    row = next(line.split() for line in per_node if line.startswith("n9"))
    assert row[6] == f"gpu{held['gpu_index']}:mps:85/100", per_node  # never cut
    summary = cluster.run("ginfo").stdout.splitlines()
    assert summary[0].split()[8] == "SHARING"
    shared_row = next(line.split() for line in summary if line.startswith("shared"))
    assert shared_row[8] == "mps:100"
    cluster.run("gcancel", *ids.split(","))
