"""Job retention over many jobs: every old job archived exactly once and deleted, the
recent ones kept. Run as a program it times the purge of a larger history (it asserts
no speed):

    .venv/bin/python -m tests.ops.test_retention_scale --jobs 10000 [--keep 10000]
        [--batch 1000]

printing ``name: value`` lines: the purge's time, and the
time to read every archived job back (as an administrator's gacct does) and to pass
over the archives for a user who has no job in them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import RetentionConfig
from gpusched.controller.retention import (
    ArchiveQuery,
    ArchiveShelf,
    RetentionJob,
    with_archived,
)
from gpusched.db.engine import make_engine, make_sessionmaker, psycopg_dsn
from gpusched.db.leadership import Leadership
from tests.db.node import node_sessions

FIRST_ID = 1_000_000
# ``n`` jobs from FIRST_ID + offset, each with its script, one GPU held for an hour, a
# step and two acknowledged node commands, all ended ``days`` days ago.
_HISTORY = [
    "INSERT INTO job_scripts (id, script, args, environment) "
    "SELECT :base + g, '#!/bin/sh\ntrain.py\n', '{}', '{\"HOME\": \"/home/alice\"}' "
    "FROM generate_series(1, :n) g",
    "INSERT INTO jobs (id, name, uid, gid, user_name, partition, account, state, gpus, "
    "submit_time, start_time, end_time, exit_code, script_id, work_dir, node_id, "
    "node_names, util_samples, util_sum, util_peak) "
    "SELECT :base + g, 'bench-' || g, 1000, 1000, 'alice', 'gpu', 'physics', 'COMPLETED', 1, "
    "t - interval '2 hours', t - interval '1 hour', t, 0, :base + g, '/tmp', n.id, "
    "ARRAY['n1'], 10, 500, 80 "
    "FROM generate_series(1, :n) g, nodes n, (SELECT now() - make_interval(days => :days) "
    "AS t) x WHERE n.name = 'n1'",
    "INSERT INTO allocations (job_id, gpu_id, node_id, allocated_at, released_at) "
    "SELECT j.id, gp.id, j.node_id, j.start_time, j.end_time FROM jobs j "
    "JOIN gpus gp ON gp.node_id = j.node_id AND gp.index = j.id % 4 "
    "WHERE j.id > :base AND j.id <= :base + :n",
    "INSERT INTO job_steps (job_id, step_id, name, state, uid, node_names, layout, ntasks, "
    "start_time, end_time, exit_code, nodes_ended, outcomes) "
    "SELECT id, 0, 'train', 'COMPLETED', 1000, ARRAY['n1'], '{\"n1\": [0]}', 1, start_time, "
    "end_time, 0, ARRAY['n1'], ARRAY['completed'] FROM jobs "
    "WHERE id > :base AND id <= :base + :n",
    "INSERT INTO node_commands (node_id, job_id, run, kind, created_at, claimed_at, done_at) "
    "SELECT node_id, id, 0, k, start_time, start_time, end_time FROM jobs, "
    "unnest(ARRAY['launch', 'kill']) k WHERE id > :base AND id <= :base + :n",
]
GPUS = [{"index": i, "uuid": f"GPU-{i}", "type": "a100-80gb"} for i in range(4)]


def make_history(sessions: sessionmaker[Session], old: int, recent: int) -> None:
    """``old`` jobs that ended 100 days ago, then ``recent`` that ended yesterday."""
    with sessions() as s, s.begin():
        for base, n, days in ((FIRST_ID, old, 100), (FIRST_ID + old, recent, 1)):
            for statement in _HISTORY:
                s.execute(text(statement), {"base": base, "n": n, "days": days})


def purge(url: str, directory: Path, batch: int) -> tuple[float, int]:
    """One run of the purge as the leader: seconds taken, jobs purged."""
    engine = make_engine(url, pool_size=2)
    leadership = Leadership(psycopg_dsn(url))
    assert leadership.try_acquire()
    try:
        job = RetentionJob(make_sessionmaker(engine), RetentionConfig(
            purge_after=30 * 86_400, archive_dir=directory, batch_size=batch), leadership)
        began = time.perf_counter()
        purged = job.purge(datetime.now(UTC))
        return time.perf_counter() - began, purged.jobs
    finally:
        leadership.release()
        engine.dispose()


def archived(directory: Path) -> list[int]:
    ids: list[int] = []
    for path in sorted(directory.glob("jobs-*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            ids += [json.loads(line)["job"]["id"] for line in list(f)[1:]]
    return ids


def remaining(sessions: sessionmaker[Session]) -> dict[str, int]:
    with sessions() as s:
        return {table: int(s.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
                for table in ("jobs", "job_scripts", "allocations", "job_steps",
                              "node_commands")}


def test_every_old_job_is_archived_once_and_deleted(db_url: str, tmp_path: Path) -> None:
    with node_sessions(db_url, GPUS) as sessions:
        make_history(sessions, 250, 30)
        _, jobs = purge(db_url, tmp_path, 60)
        assert jobs == 250
        assert archived(tmp_path) == list(range(FIRST_ID + 1, FIRST_ID + 251))
        assert len(list(tmp_path.iterdir())) == 5  # 250 jobs, 60 a batch
        assert remaining(sessions) == {"jobs": 30, "job_scripts": 30, "allocations": 30,
                                       "job_steps": 30, "node_commands": 60}


def main() -> None:
    from tests.pg import ScratchPostgres

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000, choices=range(1, 1_000_001),
                        metavar="1..1000000")
    parser.add_argument("--keep", type=int, default=10_000, choices=range(0, 1_000_001),
                        metavar="0..1000000")
    parser.add_argument("--batch", type=int, default=1000, choices=range(1, 10_001),
                        metavar="1..10000")
    args = parser.parse_args()
    pg = ScratchPostgres()
    try:
        url = pg.fresh_database()
        with node_sessions(url, GPUS) as sessions, \
                tempfile.TemporaryDirectory(prefix="gpusched-archive-") as where:
            make_history(sessions, args.jobs, args.keep)
            with sessions() as s, s.begin():
                s.execute(text("ANALYZE"))
            directory = Path(where) / "archive"
            seconds, jobs = purge(url, directory, args.batch)
            assert jobs == args.jobs and len(archived(directory)) == args.jobs
            size = sum(p.stat().st_size for p in directory.iterdir())
            began = time.perf_counter()
            shown = with_archived(ArchiveShelf(directory), [], ArchiveQuery())["jobs"]
            read = time.perf_counter() - began
            began = time.perf_counter()
            mine = with_archived(ArchiveShelf(directory), [], ArchiveQuery(uid=4242))["jobs"]
            skipped = time.perf_counter() - began
            assert len(shown) == args.jobs and mine == []
            print(f"retention_jobs: {jobs}")
            print(f"retention_kept: {remaining(sessions)['jobs']}")
            print(f"retention_batch: {args.batch}")
            print(f"retention_seconds: {seconds:.2f}")
            print(f"retention_jobs_per_second: {jobs / seconds:.0f}")
            print(f"retention_archive_bytes_per_job: {size / jobs:.0f}")
            print(f"retention_read_all_seconds: {read:.2f}")
            print(f"retention_read_other_user_seconds: {skipped:.3f}")
    finally:
        pg.close()


if __name__ == "__main__":
    main()
