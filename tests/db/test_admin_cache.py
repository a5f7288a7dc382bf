"""The admin tables kept between passes, against a real PostgreSQL: every writer sends
the ``admin`` NOTIFY with its commit, the listener turns it into a new generation, a
pass reads the tables only when they may have changed, and a lost listener, a new
leader or an old copy make the next pass read them again."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import event, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from gpusched.adminconfig import parse_admin_config
from gpusched.config import PartitionConfig, load_config
from gpusched.controller.events import Events
from gpusched.controller.scheduler import SchedulerLoop
from gpusched.db import agents, jobs, submit
from gpusched.db.admin import apply_config
from gpusched.db.admincache import AdminCache
from gpusched.db.engine import make_engine, make_sessionmaker, psycopg_dsn
from gpusched.db.models import Job, Qos
from gpusched.db.notify import notify_in, open_listener, received
from gpusched.db.partitions import sync_partitions
from gpusched.errors import ConfigError

ALICE = jobs.Identity(1000, 1000)
ADMIN_TABLES = ("partitions", "accounts", "account_users", "qos")


def wait_for(check: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    """Poll ``check`` until it is truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
    return value


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    e = make_engine(db_url, pool_size=3)
    yield e
    e.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return make_sessionmaker(engine)


@pytest.fixture
def other_controller(db_url: str) -> Iterator[sessionmaker[Session]]:
    """Sessions of an engine of its own, as another controller's."""
    e = make_engine(db_url, pool_size=1)
    yield make_sessionmaker(e)
    e.dispose()


@pytest.fixture
def events(db_url: str) -> Iterator[Events]:
    """A controller's wake-up hub, listening."""
    hub = Events()
    thread = hub.listen(psycopg_dsn(db_url))
    wait_for(lambda: hub.admin_generation() is not None, "the listener to connect")
    yield hub
    hub.stop()
    thread.join(timeout=5)


def statements(engine: Engine) -> list[str]:
    """Every SQL statement ``engine`` runs from now on, appended as it runs."""
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)
    return seen


def reads_admin_tables(seen: list[str]) -> bool:
    return any(f"FROM {table}" in s for s in seen for table in ADMIN_TABLES)


def config(partition_state: str = "up", max_jobs: int | None = None) -> Any:
    qos: dict[str, Any] = {"name": "normal"}
    if max_jobs is not None:
        qos["max_jobs_per_user"] = max_jobs
    return parse_admin_config([("admin.toml", {
        "partition": [{"name": "gpu", "default": True, "state": partition_state}],
        "qos": [qos]})])


def apply(sessions: sessionmaker[Session], admin: Any) -> None:
    with sessions() as s, s.begin():
        apply_config(s, admin)


# -- every writer of the admin tables sends the NOTIFY, with its commit ---------------

WRITERS: dict[str, Callable[[Session], object]] = {
    "admin apply: partitions": lambda s: apply_config(s, parse_admin_config([("p.toml", {
        "partition": [{"name": "gpu", "max_gpus_per_job": 2}]})])),
    "admin apply: accounts": lambda s: apply_config(s, parse_admin_config([("a.toml", {
        "account": [{"name": "lab", "shares": 3}]})])),
    "admin apply: users": lambda s: apply_config(s, parse_admin_config([("u.toml", {
        "account": [{"name": "lab"}], "user": [{"name": "alice", "accounts": ["lab"]}]})])),
    "admin apply: qos": lambda s: apply_config(s, parse_admin_config([("q.toml", {
        "qos": [{"name": "normal", "max_jobs_per_user": 3}]})])),
    "partitions seeded from gpusched.toml": lambda s: sync_partitions(
        s, (PartitionConfig("gpu", default=True),)),
    "an UPDATE by hand": lambda s: s.execute(update(Qos).values(priority=5)),
    "a DELETE by hand": lambda s: s.execute(text("DELETE FROM account_users")),
    "a TRUNCATE by hand": lambda s: s.execute(text("TRUNCATE qos")),
}


@pytest.mark.parametrize("writer", list(WRITERS))
def test_every_writer_of_the_admin_tables_notifies_on_commit_only(
        db_url: str, sessions: sessionmaker[Session], writer: str) -> None:
    with open_listener(psycopg_dsn(db_url)) as conn:
        with sessions() as s:
            with s.begin():
                WRITERS[writer](s)
                s.flush()
                assert list(received(conn, 0.2)) == []  # not before the commit
            assert "admin" in wait_for(lambda: list(received(conn, 0.5)), "the NOTIFY")
        with sessions() as s:
            s.begin()
            WRITERS[writer](s)
            s.flush()
            s.rollback()
        assert "admin" not in list(received(conn, 0.3))  # rolled back: nothing heard


def test_job_writes_send_no_admin_notify(db_url: str, sessions: sessionmaker[Session]) -> None:
    apply(sessions, config())
    with open_listener(psycopg_dsn(db_url)) as conn:
        with sessions() as s, s.begin():
            submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", "gpus": 1}, ALICE)
        with sessions() as s, s.begin():
            s.execute(update(Job).values(reason="Priority"))
        assert "admin" not in list(received(conn, 0.3))


# -- the listener's generation ------------------------------------------------------

def test_another_controllers_change_moves_the_generation_before_its_wake_up(
        events: Events, other_controller: sessionmaker[Session]) -> None:
    before = events.admin_generation()
    events.scheduler.clear()
    with other_controller() as s, s.begin():
        apply_config(s, config("down"))
        notify_in(s, "sched")  # as the API's admin apply does
    wait_for(events.scheduler.is_set, "the wake-up")
    # Both arrive on one connection in order: a pass woken by it sees the change.
    after = events.admin_generation()
    assert after is not None and after != before


def test_a_lost_listener_connection_is_no_longer_trusted_and_reconnects_with_a_new_generation(
        db_url: str, events: Events, sessions: sessionmaker[Session]) -> None:
    cache = AdminCache(events.admin_generation, 3600.0)
    with sessions() as s:
        cache.tables(s)
        cache.tables(s)
    assert cache.loads == 1
    before = events.admin_generation()
    with psycopg.connect(psycopg_dsn(db_url), autocommit=True) as admin:
        killed = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE query = 'LISTEN gpusched' AND datname = current_database()"
                               ).fetchall()
    assert killed == [(True,)]
    wait_for(lambda: events.admin_generation() is None, "the listener to notice")
    with sessions() as s:
        cache.tables(s)  # no listener: read, and not kept
        cache.tables(s)
    assert cache.loads == 3
    wait_for(lambda: events.admin_generation() not in (None, before), "the listener to reconnect")
    with sessions() as s:
        cache.tables(s)
        cache.tables(s)
    assert cache.loads == 4


# -- the copy ---------------------------------------------------------------------

def test_a_copy_read_while_a_change_came_in_is_not_used(
        engine: Engine, sessions: sessionmaker[Session]) -> None:
    generation = [7]

    @event.listens_for(engine, "before_cursor_execute")
    def change_during_the_read(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "FROM qos" in statement and generation[0] == 7:
            generation[0] = 8  # as if the listener heard a change meanwhile
    cache = AdminCache(lambda: generation[0], 3600.0)
    with sessions() as s:
        cache.tables(s)
        cache.tables(s)
        assert cache.loads == 2
        cache.tables(s)
    assert cache.loads == 2


def test_a_copy_is_read_again_once_older_than_the_safety_net(
        sessions: sessionmaker[Session]) -> None:
    now = [100.0]
    cache = AdminCache(lambda: 1, 60.0, clock=lambda: now[0])
    never = AdminCache(lambda: 1, 0.0)
    with sessions() as s:
        cache.tables(s)
        now[0] = 159.0
        cache.tables(s)
        assert cache.loads == 1
        now[0] = 160.5
        cache.tables(s)
        assert cache.loads == 2
        never.tables(s)
        never.tables(s)
        assert never.loads == 2
        cache.drop()
        cache.tables(s)
        assert cache.loads == 3


# -- passes ----------------------------------------------------------------------

@pytest.fixture
def leader(db_url: str, sessions: sessionmaker[Session], events: Events
           ) -> Iterator[SchedulerLoop]:
    """A leader's loop (passes run by the test) on one node of 2 GPUs."""
    apply(sessions, config())
    with sessions() as s, s.begin():
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": [
            {"index": i, "uuid": f"GPU-{i}"} for i in range(2)]})
    loop = SchedulerLoop(sessions, events, psycopg_dsn(db_url), admin_max_age=3600.0)
    assert loop.leadership.try_acquire()
    yield loop
    try:
        loop.stop()
    except RuntimeError:  # its thread never started: passes were the test's own
        loop.leadership.release()


def job_row(sessions: sessionmaker[Session], job_id: int) -> tuple[str, str]:
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job.state, job.reason


def changed_by_other(other: sessionmaker[Session], events: Events, admin: Any) -> None:
    """Apply ``admin`` as another controller would, and wait until its NOTIFY is heard."""
    before = events.admin_generation()
    apply(other, admin)
    wait_for(lambda: events.admin_generation() != before, "the admin NOTIFY")


def test_the_next_pass_uses_a_changed_partition_and_passes_in_between_read_nothing(
        engine: Engine, sessions: sessionmaker[Session], leader: SchedulerLoop,
        events: Events, other_controller: sessionmaker[Session]) -> None:
    seen = statements(engine)
    leader.run_pass()
    assert reads_admin_tables(seen) and leader.admin_cache.loads == 1
    changed_by_other(other_controller, events, config("down"))
    with sessions() as s, s.begin():
        job_id = submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp",
                                       "gpus": 1}, ALICE).id
    leader.run_pass()
    assert job_row(sessions, job_id) == ("PENDING", "PartitionDown")
    assert leader.admin_cache.loads == 2
    seen.clear()
    leader.run_pass()
    leader.run_pass()
    assert not reads_admin_tables(seen) and leader.admin_cache.loads == 2
    assert job_row(sessions, job_id) == ("PENDING", "PartitionDown")
    changed_by_other(other_controller, events, config("up"))
    leader.run_pass()
    assert job_row(sessions, job_id)[0] == "RUNNING"
    assert reads_admin_tables(seen) and leader.admin_cache.loads == 3


def test_the_next_pass_uses_a_changed_qos_limit(
        sessions: sessionmaker[Session], leader: SchedulerLoop, events: Events,
        other_controller: sessionmaker[Session]) -> None:
    changed_by_other(other_controller, events, config(max_jobs=1))
    with sessions() as s, s.begin():
        first, second = (submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp",
                                                "gpus": 1}, ALICE).id for _ in range(2))
    leader.run_pass()
    leader.run_pass()
    assert job_row(sessions, first)[0] == "RUNNING"
    assert job_row(sessions, second) == ("PENDING", "QOSMaxJobsPerUserLimit")
    changed_by_other(other_controller, events, config(max_jobs=2))
    leader.run_pass()
    assert job_row(sessions, second)[0] == "RUNNING"


def test_a_new_leader_reads_the_tables_afresh(leader: SchedulerLoop) -> None:
    leader.run_pass()
    leader.run_pass()
    assert leader.admin_cache.loads == 1
    leader.leadership.release()
    leader.start()  # takes leadership back, as a standby would
    wait_for(lambda: leader.stats.passes >= 3, "the new leader's pass")
    assert leader.is_leader and leader.admin_cache.loads == 2


# -- the setting ---------------------------------------------------------------------

@pytest.mark.parametrize("value", ["-1", "3601", '"60"', "nan", "inf"])
def test_admin_cache_max_age_out_of_bounds_is_one_clear_error(tmp_path: Path, value: str) -> None:
    path = tmp_path / "gpusched.toml"
    path.write_text(f"[scheduler]\nadmin_cache_max_age = {value}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "scheduler.admin_cache_max_age" in str(caught.value)
    assert "0 to 3600 seconds" in str(caught.value)


def test_admin_cache_max_age_default_and_zero(tmp_path: Path) -> None:
    path = tmp_path / "gpusched.toml"
    path.write_text("")
    assert load_config(path).scheduler.admin_cache_max_age == 60.0
    path.write_text("[scheduler]\nadmin_cache_max_age = 0\n")
    assert load_config(path).scheduler.admin_cache_max_age == 0.0
