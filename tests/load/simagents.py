"""Simulated agents: threads speaking the agent protocol of a real one (register,
long-poll for work, acknowledge launches, report each run's end) without running
anything, for load tests and benches; and a submitting client. Every loop is bounded
by a deadline; they talk to the controller's Unix socket only."""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any


def client(socket_path: str) -> Any:
    """An API client on the controller's Unix socket (as root: agents and users alike)."""
    from gpusched.client import ApiClient

    return ApiClient(socket_path, timeout=60)


def gpus_of(node: str, count: int) -> list[dict[str, Any]]:
    space = uuid.uuid5(uuid.NAMESPACE_DNS, node)
    return [{"index": i, "uuid": f"GPU-{uuid.uuid5(space, str(i))}", "type": "sim"}
            for i in range(count)]


def agent(socket_path: str, node: str, gpus: int, run: float, deadline: float,
          counts: Any, stop: Any = None) -> None:
    """One simulated agent until ``deadline`` (monotonic): what a real one says, with
    runs that end after ``run`` seconds."""
    api = client(socket_path)
    api.request("POST", "/agent/v1/register", {"node": node, "uid": 0,
                                                  "gpus": gpus_of(node, gpus), "runs": []})
    running: list[tuple[float, int, int]] = []  # (ends at, job, run)
    while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
        now = time.monotonic()
        due = [r for r in running if r[0] <= now]
        if due:
            running = [r for r in running if r[0] > now]
            ended = time.time()
            api.request("POST", "/agent/v1/jobs/ended", {"node": node, "ends": [
                {"job_id": job, "node": node, "run": run_no, "outcome": "completed",
                 "exit_code": 0, "end_time": ended} for _, job, run_no in due]})
            with counts.get_lock():
                counts[1] += len(due)
        wait = min(1.0, max(0.05, min((r[0] for r in running), default=now + 1.0) - now))
        answer = api.request("GET", f"/agent/v1/work?node={node}&wait={wait:.2f}")
        launched = [c for c in answer["commands"] if c["kind"] == "launch"]
        done = [c["seq"] for c in answer["commands"]]
        if done:
            api.request("POST", "/agent/v1/commands/done", {"node": node, "seqs": done})
        for command in launched:
            running.append((time.monotonic() + run, command["job_id"], command["run"]))
        if launched:
            with counts.get_lock():
                counts[0] += len(launched)


def agents(socket_path: str, names: list[str], gpus: int, run: float, deadline: float,
           counts: Any, stop: Any = None) -> None:
    """Several simulated agents, a thread each (a process of the bench), until
    ``deadline`` or ``stop`` (a multiprocessing Event) is set: each finishes the request
    it is in, so that what it counted is what the controller was told."""
    threads = [threading.Thread(target=agent, args=(socket_path, name, gpus, run, deadline,
                                                    counts, stop), daemon=True)
               for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()) + 30)


def submitter(socket_path: str, work: str, count: int, keys: list[str],
              latencies: list[float], ids: list[int], partition: str = "sim") -> None:
    """Submit ``count`` one-GPU jobs one after another, each with a submit key; note each
    key, the time its answer took and the job id."""
    api = client(socket_path)
    for _ in range(count):
        key = os.urandom(16).hex()
        began = time.perf_counter()
        answer = api.request("POST", "/v1/jobs", {
            "script": "#!/bin/sh\ntrue\n", "work_dir": work, "gpus": 1, "time_limit": 60,
            "submit_key": key, "partition": partition})
        latencies.append(time.perf_counter() - began)
        keys.append(key)
        ids.append(int(answer["job_id"]))
