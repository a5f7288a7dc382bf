"""One controller under load: a long queue and many agents; prints ``name: value`` lines.

    .venv/bin/python bench/load.py [--jobs 100000] [--agents 200] [--gpus 8]
                                   [--run 2.0] [--submitters 8] [--seconds 600]

A real controller (and its real agent) on a scratch PostgreSQL, ``--agents`` simulated
agents of ``--gpus`` GPUs each (threads of ``--processes`` processes speaking the agent
protocol of a real agent over the controller's Unix socket: register, long-poll for
work, acknowledge launches, report each run's end after ``--run`` seconds), and
``--submitters`` threads submitting ``--jobs`` one-GPU jobs through the API, each with
a submit key. Meanwhile one client measures, every second: a default queue listing
(what `gqueue` asks for), the controller's last pass (``/v1/ping``) and how long ago
each node was last heard from. When every job is submitted it waits, up to
``--seconds`` in all, for the simulated agents to have run ``--drain`` jobs, then checks
that nothing was dropped: every key answered with one job, every job stored once,
every launch acknowledged and every reported end recorded.

It ends with ``within_bounds: yes`` (exit 0) when nothing was dropped and the figures
stay within BOUNDS, else ``within_bounds: no`` and the figures outside them (exit 1).
The bounds hold for 100,000 jobs and 200 agents of 8 GPUs on a 2-core machine (a
default queue listing then returns every pending job); tests/load/test_load.py holds
the test-suite size to the same latency bounds.

Every loop is bounded in count and time; everything talks to the controller's Unix
socket only.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.cluster import scratch_cluster  # noqa: E402
from tests.load.simagents import agents, client, submitter  # noqa: E402

# name -> the most it may be. Submissions and listings as a user would not mind; a pass
# well under the controller's node timeout (60 s); a node heard from well within it.
BOUNDS = {"submit_s_p99": 1.0, "queue_listing_s_max": 2.0, "pass_s_max": 10.0,
          "heartbeat_lag_s_max": 5.0}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--run", type=float, default=2.0)
    parser.add_argument("--submitters", type=int, default=8)
    parser.add_argument("--drain", type=int, default=2000,
                        help="jobs the simulated agents must have run before the end")
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args()
    if not (1 <= args.jobs <= 1_000_000 and 1 <= args.agents <= 1000 and args.seconds <= 3600):
        raise SystemExit("jobs 1..1,000,000, agents 1..1,000, seconds up to 3,600")
    began = time.monotonic()
    deadline = began + args.seconds
    with scratch_cluster(gpus=1, poll_wait=1.0, schedule_interval=2.0) as (cluster, _url):
        socket_path = str(cluster.socket)
        names = [f"sim{i:04d}" for i in range(args.agents)]
        parts = cluster.root / "parts.toml"
        parts.write_text('[[partition]]\nname = "gpu"\ndefault = true\n'
                         f'[[partition]]\nname = "sim"\nnodes = {json.dumps(names)}\n')
        applied = cluster.run("gpusched", "admin", "apply", str(parts))
        if applied.returncode != 0:
            raise SystemExit(applied.stderr)
        counts = multiprocessing.Array("q", 2)  # launches acknowledged, ends reported
        stop = multiprocessing.Event()
        per = (len(names) + args.processes - 1) // args.processes
        workers = [multiprocessing.Process(target=agents, args=(
            socket_path, names[i:i + per], args.gpus, args.run, deadline, counts, stop))
            for i in range(0, len(names), per)]
        for worker in workers:
            worker.start()
        api = client(socket_path)
        while time.monotonic() < deadline:  # every simulated node registered
            nodes = api.request("GET", "/v1/nodes")["nodes"]
            if sum(n["name"].startswith("sim") and n["state"] == "UP" for n in nodes) \
                    == len(names):
                break
            time.sleep(0.5)
        keys: list[str] = []
        ids: list[int] = []
        latencies: list[float] = []
        share = args.jobs // args.submitters
        threads = [threading.Thread(target=submitter, args=(
            socket_path, str(cluster.work), share + (i < args.jobs % args.submitters),
            keys, latencies, ids), daemon=True) for i in range(args.submitters)]
        submit_began = time.monotonic()
        for thread in threads:
            thread.start()
        listing: list[float] = []
        passes: list[float] = []
        lag: list[float] = []
        while time.monotonic() < deadline:
            began_list = time.perf_counter()
            api.request("GET", "/v1/jobs?fields=job_id,state,name,user,time_limit,node"
                           "&states=PENDING,RUNNING")
            listing.append(time.perf_counter() - began_list)
            stats = api.request("GET", "/v1/ping").get("scheduler") or {}
            if stats.get("last_seconds"):
                passes.append(float(stats["last_seconds"]))
            now = time.time()
            seen = [n.get("last_seen") for n in api.request("GET", "/v1/nodes")["nodes"]
                    if n["name"].startswith("sim") and n.get("last_seen")]
            from datetime import datetime
            lag.extend(now - datetime.fromisoformat(s).timestamp() for s in seen)
            submitting = any(t.is_alive() for t in threads)
            if not submitting and counts[1] >= min(args.drain, args.jobs):
                break
            time.sleep(1.0)
        submit_s = time.monotonic() - submit_began
        for thread in threads:
            thread.join(timeout=5)
        stop.set()  # each agent ends after the request it is in: all it counted is in
        for worker in workers:
            worker.join(timeout=30)
        stored = api.request("GET", "/v1/jobs?all=1&partition=sim")["jobs"]
        states: dict[str, int] = {}
        for job in stored:
            states[job["state"]] = states.get(job["state"], 0) + 1
        print(f"jobs_submitted: {len(ids)}")
        print(f"jobs_stored: {len(stored)}")
        print(f"duplicate_ids: {len(ids) - len(set(ids))}")
        print(f"stored_not_submitted: {len({j['job_id'] for j in stored} - set(ids))}")
        print(f"completed_stored: {states.get('COMPLETED', 0)}")
        print(f"running_stored: {states.get('RUNNING', 0)}")
        print(f"other_states: {len(stored) - sum(states.get(s, 0) for s in ('COMPLETED', 'RUNNING', 'PENDING'))}")
        print(f"agents: {args.agents}")
        print(f"submit_span_s: {submit_s:.1f}")
        print(f"submit_ms_p50: {1000 * percentile(latencies, 0.5):.1f}")
        print(f"submit_ms_p99: {1000 * percentile(latencies, 0.99):.1f}")
        print(f"queue_listing_ms_p50: {1000 * percentile(listing, 0.5):.1f}")
        print(f"queue_listing_ms_max: {1000 * max(listing, default=float('nan')):.1f}")
        print(f"pass_s_median: {statistics.median(passes) if passes else float('nan'):.3f}")
        print(f"pass_s_max: {max(passes, default=float('nan')):.3f}")
        print(f"heartbeat_lag_s_p99: {percentile(lag, 0.99):.2f}")
        print(f"heartbeat_lag_s_max: {max(lag, default=float('nan')):.2f}")
        print(f"launches_acknowledged: {counts[0]}")
        print(f"ends_reported: {counts[1]}")
        # Nothing dropped: every end reported is recorded, every launch acknowledged is
        # a run that is running or recorded ended.
        print(f"ends_lost: {counts[1] - states.get('COMPLETED', 0)}")
        launches_lost = counts[0] - states.get('COMPLETED', 0) - states.get('RUNNING', 0)
        print(f"launches_lost: {launches_lost}")
        measured = {"submit_s_p99": percentile(latencies, 0.99),
                    "queue_listing_s_max": max(listing, default=float("inf")),
                    "pass_s_max": max(passes, default=float("inf")),
                    "heartbeat_lag_s_max": max(lag, default=float("inf"))}
        over = [f"{name}={measured[name]:.3f}>{most}" for name, most in BOUNDS.items()
                if not measured[name] <= most]
        dropped = (len(ids) - len(set(ids)), len(stored) - len(ids),
                   counts[1] - states.get("COMPLETED", 0), launches_lost)
        if any(dropped):
            over.append("dropped")
        print(f"within_bounds: {'no ' + ' '.join(over) if over else 'yes'}")
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main())
