"""Shares of one GPU and GPU-memory requests through the real CLIs against a real
controller: ``gpusched admin apply`` makes a partition that shares its GPUs by MPS (and
refuses two that would share a node differently), gsubmit stores a share there and is
refused elsewhere with one line and nothing stored, and gqueue shows what was asked."""

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


def _apply(cluster: Cluster, text: str) -> Any:
    path = cluster.root / "partitions.toml"
    path.write_text(text)
    return cluster.run("gpusched", "admin", "apply", str(path))


def test_a_share_in_a_partition_that_shares_gpus_by_mps(cluster: Cluster) -> None:
    node = cluster.node
    overlapping = _apply(cluster, f"""
[[partition]]
name = "gpu"
default = true
[[partition]]
name = "shared"
nodes = "{node}"
sharing = "mps"
[[partition]]
name = "sliced"
nodes = "{node}"
sharing = "shard"
""")
    assert overlapping.returncode != 0
    assert "partitions 'shared' (sharing mps, shares 100) and 'sliced' (sharing shard, " \
           f"shares 4) would share the GPUs of node {node} differently" in overlapping.stderr
    applied = _apply(cluster, f"""
[[partition]]
name = "gpu"
default = true
[[partition]]
name = "shared"
nodes = "{node}"
sharing = "mps"
""")
    assert applied.returncode == 0, applied.stderr
    assert "+ partition shared" in applied.stdout and "sharing mps, shares 100" in applied.stdout

    before = len(cluster.jobs())
    job_id = cluster.submit("--hold", "-p", "shared", "--gres=mps:50", "--gpu-mem=20G",
                            "--wrap", "true")
    memory = cluster.submit("--hold", "--gres=gpumem:512m", "--wrap", "true")
    shown = cluster.job(job_id)
    assert (shown["gpus"], shown["share_mode"], shown["share"], shown["gpu_mem_mb"]) == (
        1, "mps", 50, 20480)
    table = cluster.run("gqueue", "-j", f"{job_id},{memory}")
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()[1:]}
    assert rows[str(job_id)][6] == "mps:50,gpumem:20G"
    assert rows[str(memory)][6] == "gpumem:512M"
    tres = cluster.run("gqueue", "-h", "-j", str(job_id), "-o", "%b")
    assert tres.stdout.strip() == "gres/mps:50,gres/gpumem:20G"
    listed = json.loads(cluster.run("gqueue", "--json", "-j", str(memory)).stdout)["jobs"]
    assert [(j["share_mode"], j["gpu_mem_mb"]) for j in listed] == [(None, 512)]

    for args, code, message in (
            (["--gres=mps:50"], 2,
             "gsubmit: error: partition gpu does not share GPUs by MPS: it gives whole GPUs only"),
            (["-p", "shared", "--gres=mps:101"], 2,
             "gsubmit: error: requested mps:101, more than the 100 units each GPU of "
             "partition shared offers"),
            (["-p", "shared", "--gres=shard:1"], 2,
             "gsubmit: error: partition shared does not share GPUs as shards: it shares them "
             "by MPS (--gres=mps:N)"),
            (["-p", "shared", "--gres=mps:50", "-G", "2"], 2,
             "gsubmit: error: --gres=mps:50 asks for a share of one GPU, not 2 GPUs: give no "
             "GPU count, or 1")):
        refused = cluster.run("gsubmit", *args, "--wrap", "true")
        assert (refused.returncode, refused.stderr.splitlines()) == (code, [message]), refused
    assert len(cluster.jobs()) == before + 2  # nothing more stored
    cluster.run("gcancel", str(job_id), str(memory))
