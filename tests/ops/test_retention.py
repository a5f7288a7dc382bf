"""Job retention against a real PostgreSQL: old finished jobs archived to compressed
files and purged in batches; what must stay (running, pending, depended upon, part of an
array still going, a command not yet done) stays; the archive read back holds what
gacct showed; a crash between the archive and the delete loses nothing and duplicates
nothing; fair-share usage does not move."""

from __future__ import annotations

import gzip
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import RetentionConfig
from gpusched.controller.retention import (
    ArchiveQuery,
    ArchiveShelf,
    RetentionJob,
    with_archived,
    with_archived_usage,
)
from gpusched.db import accounting, submit
from gpusched.db.engine import psycopg_dsn
from gpusched.db.leadership import Leadership
from gpusched.db.models import (
    Allocation,
    FairShareUsage,
    Job,
    JobScript,
    JobStep,
    NodeCommand,
)
from gpusched.db.retention import present
from gpusched.db.usage import accrue_usage
from tests.db.node import ALICE, node_sessions, start_on
from tests.e2e.cluster import wait_for

NOW = datetime.now(UTC)
GPUS = [{"index": i, "uuid": f"GPU-{i}", "type": "a100-80gb"} for i in range(4)]


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    with node_sessions(db_url, GPUS) as factory:
        yield factory


@pytest.fixture
def leader(db_url: str) -> Iterator[Leadership]:
    leadership = Leadership(psycopg_dsn(db_url))
    assert leadership.try_acquire()
    yield leadership
    leadership.release()


def retention(tmp_path: Path, **settings: Any) -> RetentionConfig:
    return RetentionConfig(**{"purge_after": 86_400, "archive_dir": tmp_path / "archive",
                              "batch_size": 1000, **settings})


def ended(sessions: sessionmaker[Session], uuids: tuple[str, ...], days_ago: float,
          state: str = "COMPLETED", step: bool = False, **body: Any) -> int:
    """A job that ran on ``uuids`` for two hours and ended ``days_ago`` days ago, its
    node's commands done (as its agent acknowledges them)."""
    job_id = start_on(sessions, uuids, gpus=len(uuids), **body)
    end = NOW - timedelta(days=days_ago)
    begin = end - timedelta(hours=2)
    with sessions() as s, s.begin():
        s.execute(update(Allocation).where(Allocation.job_id == job_id)
                  .values(allocated_at=begin, released_at=end))
        s.execute(update(Job).where(Job.id == job_id).values(
            state=state, submit_time=begin - timedelta(minutes=5), start_time=begin,
            end_time=end, exit_code=0 if state == "COMPLETED" else 3, max_rss_bytes=2**30,
            cpu_usec=7_000_000, util_samples=4, util_sum=250.0, util_peak=90))
        s.execute(update(NodeCommand).where(NodeCommand.job_id == job_id).values(done_at=end))
        if step:
            s.add(JobStep(job_id=job_id, step_id=0, name="train", state="COMPLETED", uid=1000,
                          node_names=["n1"], layout={"n1": [0]}, ntasks=1,
                          start_time=begin + timedelta(minutes=1),
                          end_time=end - timedelta(minutes=1), exit_code=0,
                          nodes_ended=["n1"], outcomes=["completed"]))
    return job_id


def stored(sessions: sessionmaker[Session], table: Any, column: Any) -> set[int]:
    with sessions() as s:
        return set(s.scalars(select(column).select_from(table)))


def archived_ids(directory: Path) -> list[int]:
    """Every job id in every archive file, read with nothing but gzip and json."""
    ids = []
    for path in sorted(directory.glob("jobs-*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            header, *entries = [json.loads(line) for line in f]
        assert header["job_ids"] == [e["job"]["id"] for e in entries]
        ids += header["job_ids"]
    return ids


def test_old_finished_jobs_are_archived_then_purged_in_batches(
        sessions: sessionmaker[Session], leader: Leadership, tmp_path: Path) -> None:
    old = [ended(sessions, ("GPU-0", "GPU-1"), 3, step=True),
           ended(sessions, ("GPU-2",), 2, state="FAILED"),
           ended(sessions, ("GPU-3",), 40, state="TIMEOUT")]
    recent = ended(sessions, ("GPU-0",), 0.5)
    depended = ended(sessions, ("GPU-1",), 5)
    running = start_on(sessions, ("GPU-2",), gpus=1)
    with sessions() as s, s.begin():
        waiting = submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp",
                                        "dependency": f"afterok:{depended}"}, ALICE).id
    with sessions() as s:
        shown = {r["job_id"]: r for r in accounting.job_records(s, ids=old)}
        scripts = {j.id: j.script_id for j in s.scalars(select(Job).where(Job.id.in_(old)))}

    job = RetentionJob(sessions, retention(tmp_path, batch_size=2), leader)
    purged = job.purge(datetime.now(UTC))

    assert (purged.jobs, purged.scripts, len(purged.archives)) == (3, 3, 2)
    assert stored(sessions, Job, Job.id) == {recent, depended, running, waiting}
    assert not stored(sessions, Allocation, Allocation.job_id) & set(old)
    assert not stored(sessions, JobStep, JobStep.job_id) & set(old)
    assert not stored(sessions, NodeCommand, NodeCommand.job_id) & set(old)
    assert not stored(sessions, JobScript, JobScript.id) & set(scripts.values())
    directory = tmp_path / "archive"
    assert sorted(archived_ids(directory)) == sorted(old)
    for path in directory.iterdir():
        info = path.stat()
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid(), path
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    entries = {e["job"]["id"]: e for a in job.shelf.files() for e in job.shelf.entries(a)}
    assert {i: e["record"] for i, e in entries.items()} == shown
    first = entries[old[0]]
    assert [a["gpu_uuid"] for a in first["allocations"]] == ["GPU-0", "GPU-1"]
    assert [s["name"] for s in first["steps"]] == ["train"]
    assert first["job"]["script_id"] == scripts[old[0]]
    assert shown[old[0]]["gpu_hours"] == pytest.approx(4.0)  # 2 GPUs for 2 hours

    # Nothing more to do: a second run changes nothing and writes no file.
    assert job.purge(datetime.now(UTC)).jobs == 0
    assert sorted(archived_ids(directory)) == sorted(old)


def test_accounting_shows_archived_jobs_as_it_showed_them_to_their_owner_only(
        sessions: sessionmaker[Session], leader: Leadership, tmp_path: Path) -> None:
    mine = ended(sessions, ("GPU-0",), 3, step=True)
    theirs = ended(sessions, ("GPU-1",), 4)
    with sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id == theirs).values(uid=4242, user_name="bob"))
        before = accounting.job_records(s, ids=[mine, theirs])
    live = with_archived(ArchiveShelf(tmp_path / "archive"), before, ArchiveQuery())
    RetentionJob(sessions, retention(tmp_path), leader).purge(datetime.now(UTC))
    shelf = ArchiveShelf(tmp_path / "archive")
    with sessions() as s:
        assert accounting.job_records(s, ids=[mine, theirs]) == []

    assert with_archived(shelf, [], ArchiveQuery(ids=[mine, theirs])) == live
    assert with_archived(shelf, [], ArchiveQuery(ids=[mine, theirs], uid=ALICE.uid)) == {
        "jobs": [before[0]]}
    assert with_archived(shelf, [], ArchiveQuery(uid=4242))["jobs"] == [before[1]]
    # The filters hold as for stored jobs: state, user, window.
    assert with_archived(shelf, [], ArchiveQuery(states=["FAILED"]))["jobs"] == []
    assert with_archived(shelf, [], ArchiveQuery(users=["bob"]))["jobs"] == [before[1]]
    assert with_archived(shelf, [], ArchiveQuery(start=NOW - timedelta(days=3.5)))[
        "jobs"] == [before[0]]
    assert with_archived(shelf, [], ArchiveQuery(end=NOW - timedelta(days=5)))["jobs"] == []


def test_a_crash_between_archive_and_delete_loses_and_duplicates_nothing(
        db_url: str, sessions: sessionmaker[Session], leader: Leadership,
        tmp_path: Path) -> None:
    jobs = [ended(sessions, ("GPU-0",), 2 + i) for i in range(3)]
    directory = tmp_path / "archive"
    # A controller process runs the purge and dies (SIGKILL) after its archive is
    # written, just before it deletes the rows.
    crash = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import os, signal, sys
        from datetime import UTC, datetime
        from pathlib import Path
        from gpusched.config import RetentionConfig
        from gpusched.controller.retention import RetentionJob
        from gpusched.db.engine import make_engine, make_sessionmaker, psycopg_dsn
        from gpusched.db.leadership import Leadership

        class DiesBeforeTheDelete(Leadership):
            def hold_epoch(self, session):
                os.kill(os.getpid(), signal.SIGKILL)

        url, directory = sys.argv[1], Path(sys.argv[2])
        sessions = make_sessionmaker(make_engine(url, pool_size=1))
        settings = RetentionConfig(purge_after=86400, archive_dir=directory)
        RetentionJob(sessions, settings, DiesBeforeTheDelete(psycopg_dsn(url))).purge(
            datetime.now(UTC))
        """), db_url, str(directory)], check=False, capture_output=True, text=True,
        timeout=60)
    assert crash.returncode == -signal.SIGKILL, crash.stderr

    def crashed_transaction_gone() -> bool:  # its server process ends on the lost socket
        with sessions() as s:
            return not s.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state LIKE 'idle in transaction%'")).scalar_one()
    wait_for(crashed_transaction_gone, 10, "the crashed transaction to end")
    assert sorted(archived_ids(directory)) == jobs
    assert set(jobs) <= stored(sessions, Job, Job.id)  # the delete never committed
    shelf = ArchiveShelf(directory)
    with sessions() as s:
        records = accounting.job_records(s, ids=jobs)
    # Meanwhile each job is shown once, as stored.
    assert [r["job_id"] for r in with_archived(shelf, records, ArchiveQuery())["jobs"]] == jobs
    # A job now depended upon may no longer go: it leaves the archive, to stay stored.
    with sessions() as s, s.begin():
        submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp",
                              "dependency": f"afterany:{jobs[1]}"}, ALICE)

    purged = RetentionJob(sessions, retention(tmp_path), leader).purge(datetime.now(UTC))

    assert (purged.finished, purged.jobs, purged.archives) == (2, 0, ())
    assert sorted(archived_ids(directory)) == [jobs[0], jobs[2]]
    assert not stored(sessions, Job, Job.id) & {jobs[0], jobs[2]}
    with sessions() as s:
        records = accounting.job_records(s, ids=jobs)
    assert [r["job_id"] for r in records] == [jobs[1]]
    assert [r["job_id"] for r in with_archived(shelf, records, ArchiveQuery())["jobs"]] == jobs


def test_a_half_written_archive_is_never_read_and_is_removed(
        sessions: sessionmaker[Session], leader: Leadership, tmp_path: Path) -> None:
    job_id = ended(sessions, ("GPU-0",), 2)
    directory = tmp_path / "archive"
    directory.mkdir(mode=0o700)
    half = directory / ".tmp-0badc0de-jobs-0000000001-0-0-1-1.jsonl.gz"
    half.write_bytes(gzip.compress(b'{"format": "gpusched-job-archive"')[:20])
    shelf = ArchiveShelf(directory)
    assert shelf.files() == [] and with_archived(shelf, [], ArchiveQuery()) == {"jobs": []}

    RetentionJob(sessions, retention(tmp_path), leader).purge(datetime.now(UTC))

    assert not half.exists() and archived_ids(directory) == [job_id]


def test_a_damaged_or_foreign_archive_is_named_not_read(
        sessions: sessionmaker[Session], leader: Leadership, tmp_path: Path) -> None:
    ended(sessions, ("GPU-0",), 2)
    job = RetentionJob(sessions, retention(tmp_path), leader)
    job.purge(datetime.now(UTC))
    (archive,) = job.shelf.files()
    data = archive.path.read_bytes()
    archive.path.write_bytes(data[: len(data) // 2])
    answer = with_archived(job.shelf, [], ArchiveQuery())
    assert answer["jobs"] == [] and "damaged" in answer["archive_errors"][0], answer
    # Its header says whose jobs it holds: another user's request does not open the rest.
    assert job.shelf.header(archive)["uids"] == [ALICE.uid]
    for skipped in (ArchiveQuery(uid=4242), ArchiveQuery(users=["bob"]),
                    ArchiveQuery(states=["FAILED"]), ArchiveQuery(ids=[10**9])):
        assert with_archived(job.shelf, [], skipped) == {"jobs": []}, skipped
    header = {"format": "gpusched-job-archive", "version": 1, "jobs": 1, "job_ids": [7]}
    archive.path.write_bytes(gzip.compress(
        (json.dumps(header) + "\n" + json.dumps({"record": {}, "job": {}}) + "\n").encode()))
    answer = with_archived(job.shelf, [], ArchiveQuery())
    assert answer["jobs"] == [] and "lacks a field" in answer["archive_errors"][0], answer
    archive.path.write_bytes(data)
    assert len(with_archived(job.shelf, [], ArchiveQuery())["jobs"]) == 1
    os.chown(archive.path, 65534, 65534)
    answer = with_archived(job.shelf, [], ArchiveQuery())
    assert answer["jobs"] == [] and "not a file of the controller" in answer[
        "archive_errors"][0], answer


def test_an_array_goes_only_once_every_task_may(
        sessions: sessionmaker[Session], leader: Leadership, tmp_path: Path) -> None:
    tasks = [ended(sessions, ("GPU-0",), 3), ended(sessions, ("GPU-1",), 3),
             ended(sessions, ("GPU-2",), 0.1)]
    with sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id.in_(tasks)).values(
            array_job_id=tasks[0], array_task_id=func.coalesce(Job.id - tasks[0], 0)))
    job = RetentionJob(sessions, retention(tmp_path), leader)
    assert job.purge(datetime.now(UTC)).jobs == 0
    with sessions() as s, s.begin():
        s.execute(update(Job).where(Job.id == tasks[2]).values(
            end_time=NOW - timedelta(days=2)))
    assert job.purge(datetime.now(UTC)).jobs == 3
    assert sorted(archived_ids(tmp_path / "archive")) == tasks


def test_what_is_still_in_flight_stays(sessions: sessionmaker[Session], leader: Leadership,
                                       tmp_path: Path) -> None:
    open_command = ended(sessions, ("GPU-0",), 3)
    held = ended(sessions, ("GPU-1",), 3)
    with sessions() as s, s.begin():
        s.execute(update(NodeCommand).where(NodeCommand.job_id == open_command)
                  .values(done_at=None))
        s.execute(update(Allocation).where(Allocation.job_id == held).values(released_at=None))
    assert RetentionJob(sessions, retention(tmp_path), leader).purge(
        datetime.now(UTC)).jobs == 0
    assert {open_command, held} <= stored(sessions, Job, Job.id)


def test_purge_only_deletes_without_writing(sessions: sessionmaker[Session],
                                            leader: Leadership, tmp_path: Path) -> None:
    job_id = ended(sessions, ("GPU-0",), 3)
    purged = RetentionJob(sessions, retention(tmp_path, archive=False), leader).purge(
        datetime.now(UTC))
    assert (purged.jobs, purged.archives) == (1, ())
    assert job_id not in stored(sessions, Job, Job.id)
    assert not (tmp_path / "archive").exists()


def test_fair_share_usage_does_not_move(sessions: sessionmaker[Session], leader: Leadership,
                                        tmp_path: Path) -> None:
    ended(sessions, ("GPU-0",), 3)
    start_on(sessions, ("GPU-1",), gpus=1)
    with sessions() as s, s.begin():
        s.execute(text("UPDATE jobs SET account = 'root' WHERE account IS NULL"))
        accrue_usage(s, NOW, 7 * 86_400)
        accrue_usage(s, NOW + timedelta(hours=1), 7 * 86_400)
    usage = stored_usage(sessions)
    assert usage and all(value > 0 for value, _ in usage.values())

    assert RetentionJob(sessions, retention(tmp_path), leader).purge(datetime.now(UTC)).jobs == 1

    assert stored_usage(sessions) == usage
    with sessions() as s, s.begin():  # and what accrues next is what it would have been
        accrue_usage(s, NOW + timedelta(hours=2), 7 * 86_400)
    (after,) = stored_usage(sessions).values()
    (before,) = usage.values()
    assert after[0] > before[0]


def stored_usage(sessions: sessionmaker[Session]) -> dict[tuple[str, str], tuple[float, Any]]:
    with sessions() as s:
        return {(u.user_name, u.account): (u.usage, u.updated_at)
                for u in s.scalars(select(FairShareUsage))}


def test_a_deposed_leader_deletes_nothing(db_url: str, sessions: sessionmaker[Session],
                                          leader: Leadership, tmp_path: Path) -> None:
    job_id = ended(sessions, ("GPU-0",), 3)
    with sessions() as s, s.begin():  # another controller took over meanwhile
        s.execute(text("UPDATE leader SET epoch = epoch + 1 WHERE id = 1"))
    from gpusched.db.leadership import NotLeader

    job = RetentionJob(sessions, retention(tmp_path), leader)
    with pytest.raises(NotLeader):
        job.purge(datetime.now(UTC))
    assert job_id in stored(sessions, Job, Job.id)
    assert archived_ids(tmp_path / "archive") == [job_id]  # written before the refusal
    leader.release()
    successor = Leadership(psycopg_dsn(db_url))
    assert successor.try_acquire()
    try:
        purged = RetentionJob(sessions, retention(tmp_path), successor).purge(datetime.now(UTC))
    finally:
        successor.release()
    assert (purged.finished, purged.jobs) == (1, 0)
    assert archived_ids(tmp_path / "archive") == [job_id]
    assert job_id not in stored(sessions, Job, Job.id)


def test_the_usage_report_counts_archived_jobs_as_it_counted_them_stored(
        sessions: sessionmaker[Session], leader: Leadership, tmp_path: Path) -> None:
    ended(sessions, ("GPU-0", "GPU-1"), 3)
    ended(sessions, ("GPU-2",), 4)
    start, end = NOW - timedelta(days=3, hours=1), NOW  # the first job's last hour only
    with sessions() as s:
        before = accounting.usage_report(s, start, end)
    assert [r["gpu_hours"] for r in before] == [pytest.approx(2.0)]
    RetentionJob(sessions, retention(tmp_path), leader).purge(datetime.now(UTC))
    shelf = ArchiveShelf(tmp_path / "archive")
    with sessions() as s:
        stored_rows = accounting.usage_report(s, start, end)
        assert stored_rows == []
        counted = with_archived_usage(shelf, stored_rows, ArchiveQuery(start=start, end=end),
                                      lambda ids: present(s, ids))
        mine = with_archived_usage(shelf, [], ArchiveQuery(start=start, end=end, uid=ALICE.uid),
                                   lambda ids: present(s, ids))
        others = with_archived_usage(shelf, [], ArchiveQuery(start=start, end=end, uid=4242),
                                     lambda ids: present(s, ids))
    assert counted == (before, []) and mine == (before, []) and others == ([], [])
    with sessions() as s:
        rows, _ = with_archived_usage(shelf, [], ArchiveQuery(start=NOW - timedelta(days=10),
                                                              end=NOW),
                                      lambda ids: present(s, ids))
    assert [(r["jobs"], r["gpu_hours"]) for r in rows] == [(2, pytest.approx(6.0))]


def test_jobs_a_gpu_hour_budget_still_counts_stay(
        sessions: sessionmaker[Session], leader: Leadership, tmp_path: Path) -> None:
    """A budget counts the allocations of its current period (for ever without one):
    purging its jobs would give its GPU-hours back."""
    year = datetime(NOW.year, 1, 1, tzinfo=UTC)
    jobs = {name: ended(sessions, ("GPU-0",), 1) for name in
            ("this_year", "last_year", "unlimited", "other_user", "sub_account")}
    ends = {"this_year": year + timedelta(minutes=1), "last_year": year - timedelta(days=1),
            "unlimited": year - timedelta(days=400), "other_user": year - timedelta(days=400),
            "sub_account": year + timedelta(minutes=1)}
    accounts = {"this_year": "physics", "last_year": "physics", "unlimited": "chem",
                "other_user": "chem", "sub_account": "optics"}
    with sessions() as s, s.begin():
        s.execute(text("INSERT INTO accounts (name, parent) VALUES ('root', NULL) "
                       "ON CONFLICT DO NOTHING"))
        s.execute(text("INSERT INTO accounts (name, parent, gpu_hours, gpu_hours_period) "
                       "VALUES ('physics', 'root', 100, 'year'), ('chem', 'root', NULL, 'none'), "
                       "('optics', 'physics', NULL, 'none')"))
        s.execute(text("INSERT INTO account_users (user_name, account, gpu_hours, "
                       "gpu_hours_period) VALUES (:user, 'chem', 10, 'none')"),
                  {"user": "alice"})
        for name, job_id in jobs.items():
            s.execute(update(Job).where(Job.id == job_id).values(
                account=accounts[name], end_time=ends[name],
                user_name="bob" if name == "other_user" else "alice"))

    purged = RetentionJob(sessions, retention(tmp_path, purge_after=3600), leader).purge(
        datetime.now(UTC))

    assert sorted(archived_ids(tmp_path / "archive")) == sorted(
        [jobs["last_year"], jobs["other_user"]]), purged
    assert {jobs["this_year"], jobs["unlimited"], jobs["sub_account"]} <= stored(
        sessions, Job, Job.id)


def test_only_the_leader_purges(db_url: str, sessions: sessionmaker[Session],
                                leader: Leadership, tmp_path: Path) -> None:
    job_id = ended(sessions, ("GPU-0",), 3)
    standby = Leadership(psycopg_dsn(db_url))
    assert not standby.try_acquire()  # the fixture's controller leads
    RetentionJob(sessions, retention(tmp_path), standby).run()
    assert job_id in stored(sessions, Job, Job.id) and not (tmp_path / "archive").exists()
    RetentionJob(sessions, retention(tmp_path), leader).run()
    assert job_id not in stored(sessions, Job, Job.id)
    assert archived_ids(tmp_path / "archive") == [job_id]
