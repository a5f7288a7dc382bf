"""The GPU health loop's figures; prints ``name: value`` lines.

    .venv/bin/python bench/gpu_health.py [--rounds 5] [--idle 60]

A real controller and agent on a scratch PostgreSQL; the agent discovers 8 A100s through
the real pynvml from the project's fake NVML library (tests/fakenvml).

- ``xid_to_excluded_ms``: from writing an Xid 79 fault for one GPU until the controller's
  node listing shows that GPU out of service (median and max over ``--rounds`` GPUs).
- ``agent_idle_cpu_percent``: the agent's CPU time (user + system, all its threads) over
  ``--idle`` seconds with no jobs and its 8 GPUs checked and sampled every 10 s, as a
  percentage of one core. The fake library polls its fault file every 10 ms while an
  event wait is open, which real NVML does not do (its wait blocks in the driver), so
  this is an upper bound.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.cluster import Cluster, scratch_cluster, wait_for  # noqa: E402
from tests.nvml_fixture import FakeNvml, build_fake_nvml  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def unhealthy(cluster: Cluster) -> set[str]:
    return {g["uuid"] for g in cluster.api("GET", "/v1/nodes")["nodes"][0]["gpus"]
            if not g["healthy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--idle", type=float, default=60.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpusched-bench-"))
    lib = build_fake_nvml(work / "lib")
    fake = FakeNvml(lib, "dgx_a100_8.json", work / "faults")
    with scratch_cluster(nvml=fake.variables(),
                         agent_toml="[agent.health]\ninterval = 10\n") as (cluster, _):
        uuids = [g["uuid"] for g in fake.inventory["gpus"]]
        time.sleep(1.0)  # the health loop is waiting for events
        took = []
        for index in range(min(args.rounds, len(uuids))):
            began = time.monotonic()
            fake.inject(f"xid {index} 79")
            wait_for(lambda: uuids[index] in unhealthy(cluster), timeout=30)
            took.append((time.monotonic() - began) * 1000)
        print(f"xid_to_excluded_ms_median: {statistics.median(took):.0f}")
        print(f"xid_to_excluded_ms_max: {max(took):.0f}")
        pid = cluster.procs["agent"].pid
        before, start = cpu_seconds(pid), time.monotonic()
        time.sleep(args.idle)
        used = cpu_seconds(pid) - before
        print(f"agent_idle_cpu_percent: {100 * used / (time.monotonic() - start):.2f}")


if __name__ == "__main__":
    main()
