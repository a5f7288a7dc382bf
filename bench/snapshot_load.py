"""What loading a pass's snapshot costs: the whole, the admin-configured tables alone,
the whole with the admin tables kept between passes, and with the pending rows kept
too (a pass's usual case); prints ``name: value`` lines (medians, milliseconds).

    .venv/bin/python bench/snapshot_load.py [--nodes 1000] [--pending 20000] [--runs 20]

In process, against a throwaway PostgreSQL: ``--nodes`` nodes of 8 GPUs; an admin
configuration of ``--partitions`` partitions of 64 nodes each plus one of every node,
``--accounts`` accounts under 10 parents, ``--users`` users each in one account and
8 QOS; ``--pending`` jobs spread over the users, of which one pass starts as many as
fit (about one per GPU), the rest stay pending. ``snapshot_ms`` reads everything;
``snapshot_cached_ms`` is the same load with the admin tables' copy kept;
``snapshot_kept_ms`` keeps the pending rows read before as well (none changed since).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import text  # noqa: E402
from sqlalchemy.orm import Session, sessionmaker  # noqa: E402

from gpusched.adminconfig import parse_admin_config  # noqa: E402
from gpusched.controller.events import Events  # noqa: E402
from gpusched.controller.scheduler import SchedulerLoop  # noqa: E402
from gpusched.db import agents, jobs, submit  # noqa: E402
from gpusched.db.admin import apply_config  # noqa: E402
from gpusched.db.admincache import AdminCache, load_admin_tables  # noqa: E402
from gpusched.db.engine import make_engine, make_sessionmaker, psycopg_dsn  # noqa: E402
from gpusched.db.models import Job  # noqa: E402
from gpusched.db.pending_rows import PendingRows  # noqa: E402
from gpusched.db.schedule import load_snapshot  # noqa: E402
from tests.pg import ScratchPostgres  # noqa: E402

NODES_PER_PARTITION = 64


def admin_files(nodes: int, partitions: int, accounts: int, users: int) -> dict[str, Any]:
    """One admin file's data (as TOML parses it) of the given sizes."""
    parts: list[dict[str, Any]] = [{"name": "all", "nodes": "*", "default": True}]
    for p in range(partitions):
        first = p * NODES_PER_PARTITION % nodes
        parts.append({"name": f"p{p}", "priority_tier": p % 3,
                      "nodes": [f"n{(first + i) % nodes:04d}" for i in range(NODES_PER_PARTITION)]})
    parents = [{"name": f"dept{d}", "shares": 10 + d} for d in range(10)]
    children = [{"name": f"acct{a}", "parent": f"dept{a % 10}", "shares": 1 + a % 7}
                for a in range(accounts - 10)]
    people = [{"name": f"u{u}", "accounts": [f"acct{u % (accounts - 10)}"], "shares": 1}
              for u in range(users)] + [{"name": "root", "accounts": ["acct0"]}]
    qos = [{"name": "normal", "priority": 10, "max_gpus_per_user": 64, "preempt": ["scavenger"]},
           {"name": "scavenger"}] + [{"name": f"q{q}", "priority": q, "grp_gpus": 256}
                                     for q in range(6)]
    return {"partition": parts, "account": parents + children, "user": people, "qos": qos}


def fill_queue(sessions: sessionmaker[Session], pending: int, users: int, accounts: int) -> None:
    """Submit one job, then copy it ``pending - 1`` times over the users."""
    with sessions() as s, s.begin():
        job = submit.submit_job(s, {"script": "#!/bin/sh\n", "gpus": 1, "work_dir": "/tmp",
                                    "time_limit": 3600}, jobs.Identity(0, 0))
        first = job.id
    copied = [c.name for c in Job.__table__.columns
              if c.name not in ("id", "user_name", "account", "submit_time")]
    with sessions() as s, s.begin():
        s.execute(text(
            f"INSERT INTO jobs ({', '.join(copied)}, user_name, account, submit_time) "
            f"SELECT {', '.join('j.' + c for c in copied)}, 'u' || (g % :users), "
            "'acct' || ((g % :users) % :accounts), j.submit_time + g * interval '1 ms' "
            "FROM jobs AS j, generate_series(1, :n) AS g WHERE j.id = :first"),
            {"users": users, "accounts": accounts - 10, "n": pending - 1, "first": first})


def median_ms(sessions: sessionmaker[Session], runs: int,
              work: Callable[[Session], object]) -> float:
    """The median time of ``work`` in a transaction of its own, over ``runs`` runs."""
    times = []
    for _ in range(runs):
        with sessions() as s, s.begin():
            started = time.perf_counter()
            work(s)
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    """Build the cluster, then time each part of the load."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=20000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--accounts", type=int, default=310)
    parser.add_argument("--users", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=20)
    opts = parser.parse_args()
    pg = ScratchPostgres()
    try:
        url = pg.fresh_database()
        engine = make_engine(url)
        sessions = make_sessionmaker(engine)
        config = parse_admin_config([("bench.toml", admin_files(
            opts.nodes, opts.partitions, opts.accounts, opts.users))])
        with sessions() as s, s.begin():
            apply_config(s, config)
        for n in range(opts.nodes):
            with sessions() as s, s.begin():
                agents.register_node(s, {"node": f"n{n:04d}", "uid": 0, "gpus": [
                    {"index": i, "uuid": f"GPU-{n}-{i}"} for i in range(8)]})
        fill_queue(sessions, opts.pending, opts.users, opts.accounts)
        loop = SchedulerLoop(sessions, Events(), psycopg_dsn(url))
        assert loop.leadership.try_acquire()
        loop.run_pass()  # the jobs that fit start: allocations to read from now on
        loop.leadership.release()
        with sessions() as s:
            counts = s.execute(text("SELECT count(*) FILTER (WHERE state = 'PENDING'), "
                                    "count(*) FILTER (WHERE state = 'RUNNING') FROM jobs")).one()
            admin = load_admin_tables(s)
        cache = AdminCache(lambda: 0, 3600.0)
        kept = PendingRows()
        figures = {
            "snapshot_admin_ms": median_ms(sessions, opts.runs, load_admin_tables),
            "snapshot_ms": median_ms(sessions, opts.runs, load_snapshot),
            "snapshot_cached_ms": median_ms(sessions, opts.runs,
                                            lambda s: load_snapshot(s, admin=cache)),
            "snapshot_kept_ms": median_ms(sessions, opts.runs, lambda s: load_snapshot(
                s, admin=cache, pending_rows=kept)),
        }
        print(f"pending: {counts[0]}")
        print(f"running: {counts[1]}")
        print(f"admin_rows: partitions {len(admin.partitions)}, accounts {len(admin.accounts)}, "
              f"users {len(admin.user_shares)}, qos {len(admin.qos_priority)}")
        for name, value in figures.items():
            print(f"{name}: {value:.2f}")
        print(f"admin_loads_cached: {cache.loads}")
        engine.dispose()
    finally:
        pg.close()


if __name__ == "__main__":
    main()
