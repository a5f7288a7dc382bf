"""Controller-side cost of a submit and of a scheduling pass; prints ``name: value`` lines.

    .venv/bin/python bench/pass_cost.py [--pending 200] [--passes 20] [--env-bytes 0]

In process, against a throwaway PostgreSQL: one node of 8 GPUs, ``--pending`` submitted
1-GPU jobs (8 start in the first pass), then repeated passes over the rest; then the
same with one more submission, a 10,000-task array (``--array 0-9999%8``), in the queue:
``pass_with_array_ms`` should be ``pass_ms``, as the array's tasks cannot start.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpusched.config import PartitionConfig  # noqa: E402
from gpusched.controller.events import Events  # noqa: E402
from gpusched.controller.scheduler import SchedulerLoop  # noqa: E402
from gpusched.db import agents, jobs, submit  # noqa: E402
from gpusched.db.engine import make_engine, make_sessionmaker, psycopg_dsn  # noqa: E402
from gpusched.db.partitions import sync_partitions  # noqa: E402
from tests.pg import ScratchPostgres  # noqa: E402


def make_environment(size: int) -> dict[str, str]:
    """About ``size`` bytes of variables that compress as a real environment's do
    (paths, ids), the same each run."""
    rng = random.Random(size)
    environment: dict[str, str] = {}
    while sum(len(k) + len(v) + 6 for k, v in environment.items()) < size:
        parts = [f"/opt/{rng.choice(['cuda', 'nccl', 'conda', 'site'])}/{rng.randrange(10**6):06d}"
                 for _ in range(rng.randrange(1, 6))]
        environment[f"VAR_{len(environment)}"] = ":".join(parts)
    return environment


def main() -> None:
    """Time submits and passes."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--pending", type=int, default=200)
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--env-bytes", type=int, default=0,
                        help="give each job an environment of about this size (a login "
                        "shell's is 2-10 kB)")
    opts = parser.parse_args()
    environment = make_environment(opts.env_bytes)
    pg = ScratchPostgres()
    try:
        url = pg.fresh_database()
        engine = make_engine(url)
        sessions = make_sessionmaker(engine)
        with sessions() as s, s.begin():
            sync_partitions(s, (PartitionConfig("gpu", default=True),))
            agents.register_node(s, {"node": "n", "uid": 0, "gpus": [
                {"index": i, "uuid": f"GPU-{i}"} for i in range(8)]})
        started = time.perf_counter()
        for _ in range(opts.pending):
            with sessions() as s, s.begin():
                submit.submit_job(s, {"script": "#!/bin/sh\n", "gpus": 1, "work_dir": "/tmp",
                                    "environment": environment}, jobs.Identity(0, 0))
        submit_ms = (time.perf_counter() - started) / opts.pending * 1000
        loop = SchedulerLoop(sessions, Events(), psycopg_dsn(url))
        assert loop.leadership.try_acquire()  # only a leader's passes apply
        loop.run_pass()
        started = time.perf_counter()
        for _ in range(opts.passes):
            loop.run_pass()
        pass_ms = (time.perf_counter() - started) / opts.passes * 1000
        started = time.perf_counter()
        with sessions() as s, s.begin():
            submit.submit_job(s, {"script": "#!/bin/sh\n", "gpus": 1, "work_dir": "/tmp",
                                "array": "0-9999%8"}, jobs.Identity(0, 0))
        array_submit_ms = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        for _ in range(opts.passes):
            loop.run_pass()
        with_array_ms = (time.perf_counter() - started) / opts.passes * 1000
        print(f"submit_ms: {submit_ms:.2f}")
        print(f"pass_ms: {pass_ms:.2f}")
        print(f"pending_in_pass: {opts.pending - 8}")
        print(f"array_10000_submit_ms: {array_submit_ms:.2f}")
        print(f"pass_with_array_ms: {with_array_ms:.2f}")
        loop.leadership.release()
        engine.dispose()
    finally:
        pg.close()


if __name__ == "__main__":
    main()
