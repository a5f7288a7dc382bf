"""The simulator against a live controller: the same jobs get the same decisions."""

from __future__ import annotations

import time
from datetime import datetime

from gpusched.sim.cluster import uniform
from gpusched.sim.replay import SimPolicy, simulate
from gpusched.sim.traces import TraceJob
from tests.e2e.cluster import Cluster

# (seconds after the previous submit, GPUs, run seconds, time limit) on one 4-GPU node.
# 1 starts at once; 2 needs all 4 GPUs and gets a reservation at 1's limit (8 s);
# 3 ends (limit 3 s) before it and is backfilled; 4 and 5 would run into it and wait;
# 2 starts when 1 ends, and 4 and 5 together when 2 ends.
WORKLOAD = [(0.0, 2, 6, "0:08"), (0.5, 4, 2, "0:04"), (0.5, 1, 2, "0:03"),
            (0.5, 2, 3, "0:10"), (0.5, 1, 1, "0:20")]


def _seconds(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_simulator_and_live_controller_make_the_same_decisions(cluster: Cluster) -> None:
    ids = []
    for delay, gpus, run, limit in WORKLOAD:
        time.sleep(delay)
        ids.append(cluster.submit("-G", str(gpus), "-t", limit, "--wrap", f"sleep {run}"))
    live = [cluster.wait_state(job, "COMPLETED", timeout=60) for job in ids]
    first = min(_seconds(job["submit_time"]) for job in live)
    trace = [TraceJob(job["job_id"], _seconds(job["submit_time"]) - first,
                      _seconds(job["end_time"]) - _seconds(job["start_time"]),
                      int(job["time_limit"]), len(job["gpu_uuids"])) for job in live]
    sim = {r.job_id: r for r in simulate(trace, uniform(1, 4), SimPolicy()).records}

    def order(rows: list[tuple[float, int]]) -> list[int]:
        return [job_id for _, job_id in sorted(rows)]

    live_order = order([(_seconds(job["start_time"]), job["job_id"]) for job in live])
    sim_order = order([(r.start, r.job_id) for r in sim.values()])
    assert live_order == sim_order == [ids[0], ids[2], ids[1], ids[3], ids[4]]
    for job in live:
        twin = sim[job["job_id"]]
        assert tuple(job["gpu_uuids"]) == twin.gpu_uuids, job["job_id"]
        assert (job["start_kind"] == "backfilled") == twin.backfilled, job["job_id"]
    assert [sim[j].backfilled for j in ids] == [False, False, True, False, False]
