"""Job retention on a real cluster: the controller's periodic purge archives jobs that
ended more than a day ago (made old in the database) and deletes them; gacct shows them
from the archives exactly as it showed them stored, to an administrator every job, to a
user only their own; the archive files stay unreadable to users."""

from __future__ import annotations

import json
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from tests.e2e.cluster import BIN, Cluster, wait_for
from tests.security.conftest import LocalUser, ensure_user, run_as

TIMES = ("submit_time", "start_time", "end_time")


@pytest.fixture
def archive_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="gpusched-archive-"))
    root.chmod(0o755)  # others may pass through: the archive directory itself stops them
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cluster(db_url: str, archive_root: Path) -> Iterator[Cluster]:
    c = Cluster(db_url, controller_toml=f"""
[controller.retention]
purge_job_after = "1-00:00:00"
archive_dir = "{archive_root / 'archive'}"
interval = 1
batch_size = 1
""")
    try:
        yield c.up()
    finally:
        c.close()


def gacct(cluster: Cluster, user: LocalUser | None, *args: str) -> str:
    argv = [str(BIN / "gacct"), *args]
    result = run_as(user, argv, env=cluster.env, cwd=cluster.work) if user else \
        cluster.run("gacct", *args)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    return result.stdout


def untimed(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records without the times the test moved back."""
    return [{k: [{**run, "start": None, "end": None} for run in v] if k == "runs" else v
             for k, v in r.items() if k not in TIMES} for r in records]


def test_purged_jobs_are_shown_from_the_archives_to_whom_they_belong(
        db_url: str, cluster: Cluster, archive_root: Path) -> None:
    user = ensure_user("gpusched-test")
    mine = cluster.submit("-G", "2", "-J", "root-job", "--wrap", "exit 0")
    submitted = run_as(user, [str(BIN / "gsubmit"), "--parsable", "-G", "1", "-J", "user-job",
                              "--wrap", "exit 4"], env=cluster.env, cwd=cluster.work)
    assert submitted.returncode == 0, submitted.stderr
    theirs = int(submitted.stdout)
    cluster.wait_state(mine, "COMPLETED")
    cluster.wait_state(theirs, "FAILED")
    both = f"{mine},{theirs}"
    table = gacct(cluster, None, "-P", "-j", both)
    as_json = json.loads(gacct(cluster, None, "--json", "-j", both))["jobs"]
    assert [r["job_id"] for r in as_json] == [mine, theirs]
    assert len(table.splitlines()) == 3

    engine = create_engine(db_url)
    try:
        with engine.begin() as conn:  # both ended two days ago, as far as anyone can tell
            conn.execute(text(
                "UPDATE jobs SET submit_time = submit_time - interval '2 days', "
                "start_time = start_time - interval '2 days', "
                "end_time = end_time - interval '2 days' WHERE id IN (:a, :b)"),
                {"a": mine, "b": theirs})
            conn.execute(text(
                "UPDATE allocations SET allocated_at = allocated_at - interval '2 days', "
                "released_at = released_at - interval '2 days' WHERE job_id IN (:a, :b)"),
                {"a": mine, "b": theirs})

        def left() -> int:
            with engine.connect() as conn:
                return int(conn.execute(text("SELECT count(*) FROM jobs WHERE id IN (:a, :b)"),
                                        {"a": mine, "b": theirs}).scalar_one())
        wait_for(lambda: left() == 0, 30, "the purge", seen=cluster.logs)
    finally:
        engine.dispose()

    directory = archive_root / "archive"
    files = sorted(directory.iterdir())
    assert len(files) == 2, files  # one job a batch
    for path in [directory, *files]:
        assert path.stat().st_uid == 0  # the controller's user
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o600}

    # An administrator sees both as before, to the character.
    assert gacct(cluster, None, "-P", "-j", both) == table
    archived = json.loads(gacct(cluster, None, "--json", "-j", both))["jobs"]
    assert untimed(archived) == untimed(as_json)
    assert [r["end_time"] < as_json[0]["end_time"] for r in archived] == [True, True]
    # A user sees their own job only; the archive files themselves are closed to them.
    lines = gacct(cluster, user, "-P", "-j", both).splitlines()
    assert lines == [table.splitlines()[0], table.splitlines()[2]]
    assert lines[1].startswith(f"{theirs}|user-job|") and "|FAILED|4:0|" in lines[1]
    assert json.loads(gacct(cluster, user, "--json", "-S", "now-3days"))["jobs"] == [
        archived[1]]
    for path in (directory, files[0]):
        peek = run_as(user, ["cat", str(path)])
        assert peek.returncode != 0 and "Permission denied" in peek.stderr, peek


def test_a_controller_refuses_an_archive_directory_others_may_write(
        db_url: str, archive_root: Path) -> None:
    directory = archive_root / "archive"
    directory.mkdir(mode=0o700)
    directory.chmod(0o775)
    c = Cluster(db_url, controller_toml=f"""
[controller.retention]
purge_job_after = "30-00:00:00"
archive_dir = "{directory}"
""")
    try:
        controller = c.start("controller")
        assert controller.wait(timeout=60) == 2
        log = (c.root / "controller.log").read_text()
        assert f"controller.retention.archive_dir: {directory} must be a directory of the " \
               "controller's user that no one else may write (mode 0700)" in log, log
        assert "Traceback" not in log, log
        assert stat.S_IMODE(directory.stat().st_mode) == 0o775  # left as it was
    finally:
        c.close()
