"""A job asking only for GPU memory (--gpu-mem), end to end on a real controller and
agent whose GPUs come from the fake NVML: it lands on the smallest MIG slice with that
much memory, and one asking for more than any slice or GPU has is refused."""

from __future__ import annotations

from collections.abc import Callable

from tests.e2e.cluster import Cluster
from tests.nvml_fixture import FakeNvml


def test_gpu_memory_lands_on_the_smallest_mig_slice_that_holds_it(
        db_url: str, fake_nvml_factory: Callable[..., FakeNvml]) -> None:
    fake = fake_nvml_factory("mixed_mig.json")
    cluster = Cluster(db_url, nvml=fake.variables())
    try:
        cluster.up()
        slices = {gpu["uuid"]: gpu for node in cluster.api("GET", "/v1/nodes")["nodes"]
                  for gpu in node["gpus"] if gpu.get("mig_profile")}
        out = cluster.work / "seen"
        small = cluster.submit("--gpu-mem=8G", "--wrap",
                               f"echo $CUDA_VISIBLE_DEVICES > {out}-small")
        middle = cluster.submit("--gpu-mem=15G", "--wrap",
                                f"echo $CUDA_VISIBLE_DEVICES > {out}-middle")
        for job_id, name, profile in ((small, "small", "1g.10gb"), (middle, "middle", "2g.20gb")):
            ended = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=30)
            assert ended["state"] == "COMPLETED", ended
            (uuid,) = ended["gpu_uuids"]
            assert slices[uuid]["mig_profile"] == profile, (name, slices[uuid])
            assert (cluster.work / f"seen-{name}").read_text() == f"{uuid}\n"
        refused = cluster.run("gsubmit", "--gpu-mem=200G", "--wrap", "true")
        assert refused.returncode != 0 and "GPU" in refused.stderr, refused.stderr
    finally:
        cluster.close()
