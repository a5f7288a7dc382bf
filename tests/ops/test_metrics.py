"""``/metrics`` of a real controller and a real agent (on the fake NVML library),
scraped over HTTP and read by prometheus_client's text-format parser: what a job, a
pass, a drain and NVML's figures do to the series."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest

from tests.e2e.cluster import wait_for
from tests.nvml_fixture import FakeNvml
from tests.ops.metrics_cluster import (
    MetricsCluster,
    get,
    metrics_cluster,
    total,
    value,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def mc(db_url: str, fake_nvml_factory: Callable[..., FakeNvml]) -> Iterator[MetricsCluster]:
    with metrics_cluster(db_url, fake_nvml_factory) as made:
        yield made


def test_a_running_job_shows_in_the_controller_and_on_its_gpus(mc: MetricsCluster) -> None:
    cluster = mc.cluster
    before = mc.controller()
    assert value(before, "gpusched_gpus", state="idle", type="a100-80gb") == 8
    assert value(before, "gpusched_gpus", state="allocated", type="a100-80gb") is None
    assert value(before, "gpusched_controller_leader") == 1
    assert value(before, "gpusched_metrics_database_up") == 1
    passes = value(before, "gpusched_scheduler_pass_duration_seconds",
                   "gpusched_scheduler_pass_duration_seconds_count") or 0
    started = value(before, "gpusched_job_starts", "gpusched_job_starts_total",
                    kind="immediate")
    assert started == 0

    job = cluster.submit("-G", "2", "--wrap", "sleep 60")
    uuids = set(cluster.wait_state(job, "RUNNING")["gpu_uuids"])
    after = mc.controller()
    assert value(after, "gpusched_gpus", state="allocated", type="a100-80gb") == 2
    assert value(after, "gpusched_gpus", state="idle", type="a100-80gb") == 6
    assert value(after, "gpusched_jobs", state="RUNNING", partition="gpu") == 1
    assert value(after, "gpusched_jobs", state="PENDING") is None
    assert value(after, "gpusched_scheduler_pass_duration_seconds",
                 "gpusched_scheduler_pass_duration_seconds_count") > passes
    assert value(after, "gpusched_job_starts", "gpusched_job_starts_total",
                 kind="immediate") == 1
    assert value(after, "gpusched_job_wait_seconds", "gpusched_job_wait_seconds_count",
                 partition="gpu") == 1
    assert value(after, "gpusched_api_requests", "gpusched_api_requests_total",
                 method="POST", route="/v1/jobs", code="201") == 1
    assert value(after, "gpusched_api_request_duration_seconds",
                 "gpusched_api_request_duration_seconds_count",
                 method="GET", route="/v1/jobs/{job_id}") >= 1
    assert total(after, "gpusched_account_gpus") == 2
    assert value(after, "gpusched_nodes", state="UP") == 1
    age = value(after, "gpusched_node_heartbeat_age_seconds", node="node01")
    assert age is not None and 0 <= age < 30

    # GPU-hours add up between scrapes while the job holds its two GPUs.
    first = total(after, "gpusched_account_gpu_hours")
    later = wait_for(lambda: (lambda v: v if v > first else None)(
        total(mc.controller(), "gpusched_account_gpu_hours")), what="GPU-hours growing")
    assert later < 2 * 60 / 3600, "at most two GPUs for a minute"

    def holders() -> dict[str, str]:
        return {s.labels["UUID"]: s.labels["hpc_job"]
                for s in mc.agent().get("DCGM_FI_DEV_GPU_UTIL", [])}

    # RUNNING from the pass that allocated it; on the node once the agent launched it.
    seen = wait_for(lambda: (lambda h: h if len(h) == 8 and str(job) in h.values() else None)(
        holders()), what="eight GPUs sampled, the job's among them")
    assert {u for u, j in seen.items() if j == str(job)} == uuids
    assert {j for u, j in seen.items() if u not in uuids} == {""}
    agent = mc.agent()
    assert value(agent, "gpusched_agent_jobs_running", node="node01") == 1
    assert value(agent, "gpusched_agent_info", node="node01") == 1

    assert cluster.run("gcancel", str(job)).returncode == 0
    cluster.wait_state(job, "CANCELLED")
    wait_for(lambda: set(holders().values()) == {""}, what="the GPUs no longer held")
    ended = mc.controller()
    assert value(ended, "gpusched_gpus", state="allocated", type="a100-80gb") is None
    assert value(ended, "gpusched_jobs", state="RUNNING") is None


def test_nvml_figures_xids_and_ecc_on_the_right_gpu(mc: MetricsCluster) -> None:
    gpus = mc.fake.inventory["gpus"]
    uuid, other = gpus[3]["uuid"], gpus[5]["uuid"]
    mc.fake.inject("util 3 77 1234")
    mc.fake.inject("temp 3 55")
    mc.fake.inject("power 3 123000")
    mc.fake.inject("xid 3 13")  # an application's Xid: counted, the GPU stays in service
    mc.fake.inject("xid 3 13")
    mc.fake.inject("xid 3 31")
    mc.fake.inject("ecc 3 single")

    def sampled() -> dict[str, list[object]] | None:
        families = mc.agent()
        ready = (value(families, "DCGM_FI_DEV_GPU_UTIL", UUID=uuid) == 77
                 and value(families, "gpusched_gpu_xid_errors", "gpusched_gpu_xid_errors_total",
                           UUID=uuid, xid="31") == 1
                 and value(families, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", UUID=uuid) == 1)
        return families if ready else None  # type: ignore[return-value]

    families = wait_for(sampled, what="the injected figures sampled", timeout=20)
    labels = {"UUID": uuid, "node": "node01", "gpu": "3", "modelName": "NVIDIA A100-SXM4-80GB"}
    assert value(families, "DCGM_FI_DEV_FB_USED", **labels) == 1234
    assert value(families, "DCGM_FI_DEV_FB_FREE", **labels) == 81920 - 1234
    assert value(families, "DCGM_FI_DEV_GPU_TEMP", **labels) == 55
    assert value(families, "DCGM_FI_DEV_POWER_USAGE", **labels) == 123.0
    assert value(families, "gpusched_gpu_xid_errors", "gpusched_gpu_xid_errors_total",
                 UUID=uuid, xid="13") == 2
    assert value(families, "DCGM_FI_DEV_XID_ERRORS", **labels) == 31
    assert value(families, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", **labels) == 0
    assert value(families, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", **labels) == 1
    # The other GPUs keep their own figures.
    assert value(families, "DCGM_FI_DEV_GPU_UTIL", UUID=other) == 0
    assert value(families, "DCGM_FI_DEV_XID_ERRORS", UUID=other) == 0
    assert value(families, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", UUID=other) == 0
    assert value(families, "gpusched_gpu_xid_errors", "gpusched_gpu_xid_errors_total",
                 UUID=other, xid="13") is None
    # Application Xids take nothing out of service.
    assert value(mc.controller(), "gpusched_gpus", state="idle", type="a100-80gb") == 8


def test_drained_and_unhealthy_gpus_are_counted_apart(mc: MetricsCluster) -> None:
    cluster = mc.cluster
    cluster.api("POST", "/v1/gpus/drain", {"node": "node01", "index": 1, "reason": "test"})
    mc.fake.inject("xid 6 79")  # the GPU falls off the bus: out of service
    counts = wait_for(lambda: (lambda f: f if value(
        f, "gpusched_gpus", state="unhealthy", type="a100-80gb") == 1 else None)(
        mc.controller()), what="the failed GPU counted unhealthy")
    assert value(counts, "gpusched_gpus", state="drained", type="a100-80gb") == 1
    assert value(counts, "gpusched_gpus", state="idle", type="a100-80gb") == 6
    cluster.api("POST", f"/v1/nodes/{cluster.node}/drain", {"reason": "test"})
    drained = mc.controller()
    assert value(drained, "gpusched_gpus", state="drained", type="a100-80gb") == 7
    assert value(drained, "gpusched_gpus", state="unhealthy", type="a100-80gb") == 1
    assert value(drained, "gpusched_nodes", state="DRAIN") == 1


def test_the_listeners_serve_get_metrics_and_nothing_else(mc: MetricsCluster) -> None:
    for port in (mc.controller_port, mc.agent_port):
        status, content_type, body = get(port, "/metrics", "HEAD")
        assert (status, body) == (200, b"") and content_type.startswith("text/plain")
        assert get(port, "/")[0] == 404
        assert get(port, "/metrics/../etc/passwd")[0] == 404
        assert get(port, "/metrics", "POST")[0] == 501
        assert get(port, "/metrics", "DELETE")[0] == 501
    # A 404 on the API is counted under one route label, not under each path asked.
    for path in ("/v1/nope", "/v1/nope/again"):
        assert mc.cluster.try_api("GET", path) is None
    for method in ("BREW", "WHEN"):  # methods no route has: one label value for all
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(mc.cluster.socket))
            sock.sendall(f"{method} /v1/ping HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert sock.recv(100).startswith(b"HTTP/1.1 405")
    families = mc.controller()
    routes = {s.labels["route"] for s in families["gpusched_api_requests"]}
    assert "unmatched" in routes and not any("nope" in r for r in routes)
    methods = {s.labels["method"] for s in families["gpusched_api_requests"]}
    assert "other" in methods and not methods & {"BREW", "WHEN"}
    assert value(families, "gpusched_api_requests", "gpusched_api_requests_total",
                 method="other", route="/v1/ping", code="405") == 2
