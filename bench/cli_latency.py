"""Wall time of the user commands on a local cluster with a long queue; prints
``name: value`` lines.

    .venv/bin/python bench/cli_latency.py [--queue 10000] [--trials 11]

A controller and a 4-GPU agent on a scratch PostgreSQL, with the default
``schedule_interval`` (5 s). One job holds all 4 GPUs, and ``queue`` one-GPU jobs wait
behind it (reason Resources), so every scheduling pass plans the whole queue. The queue is
filled by submitting one job through the API and copying its row in SQL (submitting
10,000 jobs one by one takes minutes and measures nothing here).

- ``gsubmit_wrap_ms``: median of ``gsubmit --wrap true`` (a job without GPUs: it runs);
- ``gqueue_ms``: median of a plain ``gqueue`` listing the whole queue (output to a pipe);
- ``gcancel_ms``: median of ``gcancel ID`` of one queued job;
- ``pass_ms``: the controller's last scheduling pass over that queue.

Each command starts 0.3 s after the last one ended, as typed commands would. The package
is byte-compiled first, as an installed one is (an editable checkout run with
PYTHONDONTWRITEBYTECODE would otherwise compile every module on every command).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from tests.e2e.cluster import BIN, Cluster, scratch_cluster  # noqa: E402

GAP = 0.3


def timed(cluster: Cluster, *argv: str) -> tuple[float, str]:
    time.sleep(GAP)
    began = time.perf_counter()
    result = subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True,
                            env=cluster.env, cwd=cluster.work, timeout=120)
    took = (time.perf_counter() - began) * 1000
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {result.stderr}")
    return took, result.stdout


def fill(cluster: Cluster, url: str, count: int) -> None:
    """One job holding every GPU, then ``count`` one-GPU jobs queued behind it."""
    cluster.submit("--gpus", "4", "--wrap", "sleep 100000")
    first = cluster.submit("--gpus", "1", "--job-name", "q", "--wrap", "true")
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as db:
        columns = ", ".join(name for (name,) in db.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'jobs' AND column_name <> 'id'"))
        db.execute(f"INSERT INTO jobs ({columns}) SELECT {columns} FROM jobs, "
                   f"generate_series(2, %s) WHERE id = %s", (count, first))
    cluster.api("POST", "/v1/jobs", {"script": "#!/bin/sh\ntrue\n", "name": "q", "gpus": 1,
                                     "work_dir": str(cluster.work), "environment": {}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=11)
    args = parser.parse_args()
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "gpusched")], check=True)
    with scratch_cluster(schedule_interval=5.0) as (cluster, url):
        fill(cluster, url, args.queue)
        time.sleep(2)  # the first passes over the new queue
        submits = [timed(cluster, "gsubmit", "--parsable", "--wrap", "true")[0]
                   for _ in range(args.trials)]
        queues = []
        for _ in range(args.trials):
            took, out = timed(cluster, "gqueue")
            queues.append(took)
        lines = out.count("\n") - 1
        waiting = cluster.api("GET", "/v1/jobs?state=PENDING&fields=job_id")["rows"]
        cancels = [timed(cluster, "gcancel", str(job_id))[0]
                   for (job_id,) in waiting[:args.trials]]
        stats = cluster.api("GET", "/v1/ping")["scheduler"]
    print(f"queue_jobs: {args.queue + 1}")
    print(f"gqueue_lines: {lines}")
    print(f"gsubmit_wrap_ms: {statistics.median(submits):.0f}")
    print(f"gqueue_ms: {statistics.median(queues):.0f}")
    print(f"gcancel_ms: {statistics.median(cancels):.0f}")
    print(f"pass_ms: {stats['last_seconds'] * 1000:.0f}")
    print(f"pass_pending: {stats['last_pending']}")


if __name__ == "__main__":
    main()
