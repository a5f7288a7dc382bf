"""Wall time of the user commands on a local cluster; prints ``name: value`` lines.

    .venv/bin/python bench/cli_latency.py [--queue 10000] [--trials 11]

A controller and a 4-GPU agent on a scratch PostgreSQL. ``queue`` held jobs are put in
the queue first (through the API), so ``gqueue`` lists them all.

- ``gsubmit_wrap_ms``: median of ``gsubmit --wrap true`` (held, so it stays queued);
- ``gqueue_ms``: median of a plain ``gqueue`` with the whole queue (output to a pipe);
- ``gcancel_ms``: median of ``gcancel ID`` of one queued job.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.cluster import BIN, Cluster  # noqa: E402
from tests.pg import ScratchPostgres  # noqa: E402


def timed(cluster: Cluster, *argv: str) -> tuple[float, str]:
    began = time.perf_counter()
    result = subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True,
                            env=cluster.env, cwd=cluster.work, timeout=120)
    took = (time.perf_counter() - began) * 1000
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {result.stderr}")
    return took, result.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=11)
    args = parser.parse_args()
    pg = ScratchPostgres()
    try:
        cluster = Cluster(pg.fresh_database())
        try:
            cluster.up()
            began = time.perf_counter()
            from gpusched.cli.client import ApiClient

            with ApiClient(cluster.socket) as client:
                for _ in range(args.queue):
                    client.request("POST", "/v1/jobs", {
                        "script": "#!/bin/sh\ntrue\n", "name": "q", "gpus": 1, "hold": True,
                        "work_dir": str(cluster.work), "environment": {"PATH": os.environ["PATH"]}})
            print(f"queue_jobs: {args.queue}")
            print(f"queue_fill_s: {time.perf_counter() - began:.1f}")
            submits, ids = [], []
            for _ in range(args.trials):
                took, out = timed(cluster, "gsubmit", "--parsable", "--hold", "--wrap", "true")
                submits.append(took)
                ids.append(int(out.strip()))
            queues = []
            for _ in range(args.trials):
                took, out = timed(cluster, "gqueue")
                queues.append(took)
            lines = out.count("\n") - 1
            cancels = [timed(cluster, "gcancel", str(job_id))[0] for job_id in ids]
            print(f"gqueue_lines: {lines}")
            print(f"gsubmit_wrap_ms: {statistics.median(submits):.0f}")
            print(f"gqueue_ms: {statistics.median(queues):.0f}")
            print(f"gcancel_ms: {statistics.median(cancels):.0f}")
        finally:
            cluster.close()
    finally:
        pg.close()


if __name__ == "__main__":
    main()
