"""What wakes a scheduling pass: a submit and a job's end each run one at once, not
at the periodic interval (an hour here) nor the leader's backstop (30 s)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpusched.controller.scheduler import BACKSTOP_PASS
from tests.e2e.cluster import Cluster, wait_for

# Well inside the backstop: a start within it was woken by what the test did.
WOKEN_WITHIN = BACKSTOP_PASS / 2


@pytest.fixture
def one_gpu(db_url: str) -> Iterator[Cluster]:
    """A one-GPU cluster whose periodic pass is an hour apart."""
    cluster = Cluster(db_url, gpus=1, schedule_interval=3600.0)
    try:
        yield cluster.up()
    finally:
        cluster.close()


def test_a_submit_and_a_job_end_each_wake_a_pass(one_gpu: Cluster) -> None:
    first = one_gpu.submit("--gpus", "1", "--wrap", 'while [ ! -e go ]; do sleep 0.05; done')
    one_gpu.wait_state(first, "RUNNING", timeout=WOKEN_WITHIN)
    second = one_gpu.submit("--gpus", "1", "--wrap", "true")
    wait_for(lambda: one_gpu.job(second)["reason"] == "Resources", WOKEN_WITHIN,
             "the second job waiting for the GPU", seen=lambda: one_gpu.job(second))
    passes = one_gpu.api("GET", "/v1/ping")["scheduler"]["passes"]
    (one_gpu.work / "go").touch()
    one_gpu.wait_state(first, "COMPLETED", timeout=WOKEN_WITHIN)
    done = one_gpu.wait_state(second, "COMPLETED", timeout=WOKEN_WITHIN)
    assert done["exit_code"] == 0
    assert one_gpu.api("GET", "/v1/ping")["scheduler"]["passes"] > passes
