"""A controller under a small load (the test-suite size of bench/load.py): simulated
agents and several submitters at once; within bounds, and nothing dropped."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from datetime import datetime

from tests.e2e.cluster import Cluster, wait_for
from tests.load.simagents import agents, client, submitter

JOBS, AGENTS, GPUS, SUBMITTERS = 1200, 24, 4, 4


def test_many_agents_and_submitters_lose_nothing_and_stay_within_bounds(db_url: str) -> None:
    cluster = Cluster(db_url, gpus=1, poll_wait=1.0, schedule_interval=2.0)
    try:
        cluster.up()
        names = [f"sim{i:03d}" for i in range(AGENTS)]
        parts = cluster.root / "parts.toml"
        parts.write_text('[[partition]]\nname = "gpu"\ndefault = true\n'
                         f'[[partition]]\nname = "sim"\nnodes = {json.dumps(names)}\n')
        assert cluster.run("gpusched", "admin", "apply", str(parts)).returncode == 0
        socket_path = str(cluster.socket)
        deadline = time.monotonic() + 90
        counts = multiprocessing.Array("q", 2)
        stop = multiprocessing.Event()
        workers = [multiprocessing.Process(target=agents, args=(
            socket_path, names[i::2], GPUS, 0.3, deadline, counts, stop)) for i in range(2)]
        for worker in workers:
            worker.start()
        api = client(socket_path)
        while time.monotonic() < deadline and sum(
                n["name"].startswith("sim") and n["state"] == "UP"
                for n in api.request("GET", "/v1/nodes")["nodes"]) < AGENTS:
            time.sleep(0.2)
        keys: list[str] = []
        ids: list[int] = []
        latencies: list[float] = []
        threads = [threading.Thread(target=submitter, args=(
            socket_path, str(cluster.work), JOBS // SUBMITTERS, keys, latencies, ids),
            daemon=True) for _ in range(SUBMITTERS)]
        for thread in threads:
            thread.start()
        listing: list[float] = []
        lag: list[float] = []
        while time.monotonic() < deadline and (any(t.is_alive() for t in threads)
                                               or counts[1] < 300):
            began = time.perf_counter()
            api.request("GET", "/v1/jobs?states=PENDING,RUNNING")
            listing.append(time.perf_counter() - began)
            now = time.time()
            lag += [now - datetime.fromisoformat(n["last_seen"]).timestamp()
                    for n in api.request("GET", "/v1/nodes")["nodes"]
                    if n["name"].startswith("sim") and n.get("last_seen")]
            time.sleep(0.5)
        # No start after this: a pass may start a job after the agents' last poll, which
        # no agent then hears of. Once a pass has held every waiting job for the down
        # partition, none does.
        parts.write_text(parts.read_text() + 'state = "down"\n')
        assert cluster.run("gpusched", "admin", "apply", str(parts)).returncode == 0
        wait_for(lambda: all(job["reason"] == "PartitionDown" for job in api.request(
            "GET", "/v1/jobs?states=PENDING&partition=sim")["jobs"]), timeout=30,
            what="a pass to hold the waiting jobs for the down partition")
        stop.set()  # each agent ends after the request it is in
        for worker in workers:
            worker.join(timeout=15)
            assert worker.exitcode == 0
        # The launches started after an agent's last poll: what its next poll would get.
        unheard = sum(command["kind"] == "launch" for name in names for command in
                      api.request("GET", f"/agent/v1/work?node={name}&wait=0")["commands"])
        stored = api.request("GET", "/v1/jobs?all=1&partition=sim")["jobs"]
    finally:
        cluster.close()
    states = [job["state"] for job in stored]
    assert len(ids) == len(set(ids)) == len(stored) == JOBS  # every submission stored once
    assert counts[1] >= 300 and states.count("COMPLETED") == counts[1]  # every end recorded
    # every launch heard is a run running or recorded ended, and every run started was
    # either heard or is still waiting for its agent's next poll
    assert counts[0] + unheard == states.count("COMPLETED") + states.count("RUNNING")
    assert sorted(latencies)[int(0.99 * len(latencies))] < 1.0
    assert max(listing) < 2.0
    assert max(lag) < 5.0
