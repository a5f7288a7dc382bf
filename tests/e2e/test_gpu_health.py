"""The GPU health loop end to end: an agent on the fake NVML library, faults injected at
run time, and exactly the right GPU or MIG slice taken out of service."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, wait_for
from tests.nvml_fixture import FakeNvml

HEALTH = "[agent.health]\ninterval = 0.5\nmax_temperature = 90\n"


@pytest.fixture
def nvml_cluster(db_url: str, fake_nvml_factory: Callable[..., FakeNvml]
                 ) -> Iterator[Callable[[str], tuple[Cluster, FakeNvml]]]:
    made: list[Cluster] = []

    def make(inventory: str) -> tuple[Cluster, FakeNvml]:
        fake = fake_nvml_factory(inventory)
        cluster = Cluster(db_url, nvml=fake.variables(), agent_toml=HEALTH,
                          gpus_toml="rediscover_interval = 1\n")
        made.append(cluster)
        cluster.up()
        return cluster, fake

    yield make
    for cluster in made:
        cluster.close()


def gpus(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """Every GPU and slice of node01 by UUID."""
    nodes = cluster.api("GET", "/v1/nodes")["nodes"]
    return {g["uuid"]: g for g in nodes[0]["gpus"]}


def unhealthy(cluster: Cluster) -> dict[str, str]:
    return {u: g["health_reason"] for u, g in gpus(cluster).items() if not g["healthy"]}


def test_xid_79_quarantines_its_gpu_and_the_job_is_requeued(
        nvml_cluster: Callable[[str], tuple[Cluster, FakeNvml]]) -> None:
    cluster, fake = nvml_cluster("dgx_a100_8.json")
    job = cluster.submit("-G", "1", "--wrap", "sleep 60")
    first = cluster.wait_state(job, "RUNNING")
    uuid = first["gpu_uuids"][0]
    index = gpus(cluster)[uuid]["index"]
    fake.inject(f"xid {index} 13")  # an application's own error: ignored
    time.sleep(1.5)
    assert unhealthy(cluster) == {} and cluster.job(job)["restarts"] == 0
    began = time.monotonic()
    fake.inject(f"xid {index} 79")
    wait_for(lambda: unhealthy(cluster), timeout=10, what="the GPU out of service")
    took = time.monotonic() - began
    assert unhealthy(cluster) == {uuid: "Xid 79"}
    assert took <= 2.0, f"{took:.2f}s from the Xid to the GPU being excluded"
    again = wait_for(lambda: (lambda j: j if j["restarts"] == 1 and j["state"] == "RUNNING"
                              else None)(cluster.job(job)), timeout=20, what="the job requeued")
    assert again["gpu_uuids"] != [uuid]
    assert again["error_message"] == f"requeued: GPU node01:{index} ({uuid}) failed: Xid 79"
    resumed = cluster.run("gcontrol", "resume", "gpu", f"node01:{index}")
    assert resumed.returncode == 0, resumed.stderr
    assert f"GPU node01:{index} ({uuid}) is back in service" in resumed.stdout
    assert unhealthy(cluster) == {}
    cluster.run("gcancel", str(job))


def test_ecc_error_fails_a_job_that_may_not_be_requeued(
        nvml_cluster: Callable[[str], tuple[Cluster, FakeNvml]]) -> None:
    cluster, fake = nvml_cluster("dgx_a100_8.json")
    job = cluster.submit("-G", "2", "--no-requeue", "--wrap", "sleep 60")
    uuids = cluster.wait_state(job, "RUNNING")["gpu_uuids"]
    index = gpus(cluster)[uuids[1]]["index"]
    fake.inject(f"ecc {index}")
    ended = cluster.wait_state(job, "FAILED", timeout=20)
    assert ended["error_message"] == (f"GPU node01:{index} ({uuids[1]}) failed: "
                                      "double-bit ECC error")
    assert unhealthy(cluster) == {uuids[1]: "double-bit ECC error"}


def test_a_lost_gpu_and_an_overheating_one(
        nvml_cluster: Callable[[str], tuple[Cluster, FakeNvml]]) -> None:
    cluster, fake = nvml_cluster("dgx_a100_8.json")
    by_index = {g["index"]: u for u, g in gpus(cluster).items()}
    fake.inject("lost 2")
    fake.inject("temp 5 95")
    wait_for(lambda: len(unhealthy(cluster)) == 2, timeout=10, what="two GPUs out of service",
             seen=lambda: unhealthy(cluster))
    assert unhealthy(cluster) == {by_index[2]: "GPU lost (NVML_ERROR_GPU_IS_LOST)",
                                  by_index[5]: "temperature 95 C over the 90 C limit"}
    # The agent finds the lost GPU gone from the inventory and registers again without it.
    wait_for(lambda: by_index[2] not in gpus(cluster), timeout=10, what="the lost GPU gone")
    assert len(gpus(cluster)) == 7 and by_index[5] in gpus(cluster)
    shown = cluster.run("ginfo", "-N")
    assert shown.returncode == 0, shown.stderr
    line = next(l for l in shown.stdout.splitlines() if l.startswith("node01"))
    assert line.split()[2:4] == ["idle", "0/6/1/7"]  # GPU 2 left the inventory
    assert "gpu5: temperature 9" in line  # cut to 80 columns
    reason = json.loads(cluster.run("ginfo", "--json").stdout)["nodes"][0]["reason"]
    assert "gpu5: temperature 95 C over the 90 C limit" in reason
    job = cluster.submit("-G", "6", "--wrap", "echo $CUDA_VISIBLE_DEVICES")
    done = cluster.wait_state(job, "COMPLETED")
    assert not {by_index[2], by_index[5]} & set(done["gpu_uuids"])
    assert len(done["gpu_uuids"]) == 6


def test_a_mig_xid_quarantines_only_its_slice(
        nvml_cluster: Callable[[str], tuple[Cluster, FakeNvml]]) -> None:
    cluster, fake = nvml_cluster("mixed_mig.json")
    warned = cluster.run("gsubmit", "--gpus", "1g.10gb:2", "--hold", "--wrap", "true")
    assert warned.returncode == 0 and "gsubmit: warning: the job asks for 2 MIG slices" in warned.stderr
    job = cluster.submit("--gpus", "1g.10gb:1", "--wrap",
                         "echo $CUDA_VISIBLE_DEVICES; sleep 60")
    held = cluster.wait_state(job, "RUNNING")["gpu_uuids"][0]
    assert held.startswith("MIG-")
    output = cluster.work / f"gpusched-{job}.out"
    wait_for(lambda: output.exists() and output.read_text().strip(), what="the job's output")
    assert output.read_text().splitlines()[0] == held  # CUDA_VISIBLE_DEVICES is the slice
    slices = {m["uuid"]: (i, m["gi"], m["ci"]) for i, g in enumerate(fake.inventory["gpus"])
              for m in g.get("mig_devices", [])}
    parent, gi, ci = slices[held]
    fake.inject(f"xid {parent} 94 mig {gi} {ci}")
    wait_for(lambda: unhealthy(cluster), timeout=10, what="the slice out of service")
    assert unhealthy(cluster) == {held: "Xid 94"}
    info = json.loads(cluster.run("ginfo", "--json").stdout)
    mine = info["nodes"][0]
    # 2 GPUs in MIG mode with 4 + 7 slices, 2 whole GPUs: 13 units; the slice is out.
    assert (mine["total"], mine["other"], mine["mig_free"] + mine["mig_used"]) == (13, 1, 10)
    assert f"gpu{gpus(cluster)[held]['index']}: Xid 94" in mine["reason"]
    assert {r["partition"] for r in info["partitions"]} == {"gpu*", "debug"}
    again = wait_for(lambda: (lambda j: j if j["restarts"] == 1 and j["state"] == "RUNNING"
                              else None)(cluster.job(job)), timeout=20, what="the job requeued")
    assert again["gpu_uuids"][0] != held and again["gpu_uuids"][0].startswith("MIG-")
    cluster.run("gcancel", str(job))


def test_utilisation_is_sampled_and_rolled_up_per_job(
        nvml_cluster: Callable[[str], tuple[Cluster, FakeNvml]]) -> None:
    cluster, fake = nvml_cluster("dgx_a100_8.json")
    job = cluster.submit("-G", "2", "--wrap", "sleep 60")
    uuids = cluster.wait_state(job, "RUNNING")["gpu_uuids"]
    first, second = (gpus(cluster)[u]["index"] for u in uuids)
    fake.inject(f"util {first} 80 4000")
    fake.inject(f"util {second} 40 2000")
    wait_for(lambda: cluster.job(job)["gpu_util_peak"] == 80, timeout=10,
             what="the samples rolled up", seen=lambda: cluster.job(job))
    listed = json.loads(cluster.run("gqueue", "--json").stdout)["jobs"]
    mine = next(j for j in listed if j["job_id"] == job)
    assert mine["gpu_mem_peak_mb"] == 4000 and mine["gpu_samples"] >= 1
    assert 0 < mine["gpu_util_avg"] <= 60 and mine["idle"] is False
    node = cluster.api("GET", "/v1/nodes")["nodes"][0]
    assert any(g["index"] == first and g["util"] == 80 for g in node["gpus"])
    cluster.run("gcancel", str(job))
