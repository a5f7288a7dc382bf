"""QOS access per association and submit limits, against a real database."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpusched.adminconfig import parse_admin_config
from gpusched.db.admin import apply_config
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.jobs import Identity
from gpusched.db.models import Job, JobScript
from gpusched.db.submit import submit_job
from gpusched.errors import ConfigError, LimitReached, UsageError

ALICE = Identity(1000, 1000, "alice")
BOB = Identity(1001, 1001, "bob")
ROOT = Identity(0, 0, "root")
CONFIG: dict[str, Any] = {
    "partition": [{"name": "gpu", "default": True}],
    "account": [
        {"name": "physics", "qos": ["normal", "high"], "default_qos": "normal"},
        {"name": "theory", "parent": "physics"},
        {"name": "bio"},
    ],
    "user": [
        {"name": "alice", "accounts": ["theory", "bio"], "max_submit_jobs": 5},
        {"name": "bob", "accounts": ["bio"]},
        {"name": "carol", "accounts": ["theory"], "qos": ["scavenger"]},
        {"name": "root", "accounts": ["bio"]},
    ],
    "qos": [{"name": "normal"}, {"name": "high", "priority": 100},
            {"name": "scavenger", "max_submit_jobs_per_user": 3}],
}


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url, pool_size=4)
    maker = make_sessionmaker(engine)
    with maker() as s, s.begin():
        apply_config(s, parse_admin_config([("test.toml", CONFIG)]))
    yield maker
    engine.dispose()


def _submit(sessions: sessionmaker[Session], who: Identity, _limit: int | None = None,
            **body: object) -> Job:
    with sessions() as s, s.begin():
        job = submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", **body}, who, _limit)
        s.expunge(job)
        return job


def _stored(sessions: sessionmaker[Session]) -> tuple[int, int]:
    with sessions() as s:
        return (s.scalar(select(func.count()).select_from(Job)) or 0,
                s.scalar(select(func.count()).select_from(JobScript)) or 0)


def test_users_get_their_accounts_qos_list_and_default(sessions: sessionmaker[Session]) -> None:
    assert _submit(sessions, ALICE).qos == "normal"  # theory inherits physics's default
    assert _submit(sessions, ALICE, qos="high").qos == "high"
    with pytest.raises(UsageError, match=r"high is not one of the QOS you may use \(normal\)"):
        _submit(sessions, ALICE, account="bio", qos="high")  # bio has no list: normal only
    with pytest.raises(UsageError, match="scavenger is not one of"):
        _submit(sessions, BOB, qos="scavenger")
    # carol's own list replaces her account's; her default is the first of it.
    assert _submit(sessions, Identity(1002, 1002, "carol")).qos == "scavenger"
    with pytest.raises(UsageError, match="normal is not one of the QOS you may use"):
        _submit(sessions, Identity(1002, 1002, "carol"), qos="normal")
    with pytest.raises(UsageError, match="invalid qos specification: gold"):
        _submit(sessions, ALICE, qos="gold")


def test_administrators_may_use_any_qos(sessions: sessionmaker[Session]) -> None:
    assert _submit(sessions, ROOT, qos="scavenger").qos == "scavenger"


def test_a_refused_qos_stores_nothing(sessions: sessionmaker[Session]) -> None:
    before = _stored(sessions)
    with pytest.raises(UsageError):
        _submit(sessions, BOB, qos="high")
    assert _stored(sessions) == before


def test_association_and_qos_submit_limits(sessions: sessionmaker[Session]) -> None:
    for _ in range(5):
        _submit(sessions, ALICE)
    before = _stored(sessions)
    with pytest.raises(LimitReached, match=r"alice has 5 jobs .*AssocMaxSubmitJobLimit"):
        _submit(sessions, ALICE)
    assert _stored(sessions) == before
    carol = Identity(1002, 1002, "carol")
    _submit(sessions, carol, array="0-1")  # two tasks count as two jobs
    with pytest.raises(LimitReached, match=r"2 more jobs would exceed the 3 allowed by the "
                                           r"MaxSubmitJobsPerUser of QOS scavenger"):
        _submit(sessions, carol, array="5-6")
    _submit(sessions, carol)
    with sessions() as s, s.begin():  # ended jobs no longer count
        s.execute(Job.__table__.update().where(Job.uid == carol.uid)  # type: ignore[attr-defined]
                  .values(state="COMPLETED"))
    assert _submit(sessions, carol, array="0-2").array_tasks == "0-2"


def test_the_clusters_default_limit_spares_administrators(sessions: sessionmaker[Session]) -> None:
    _submit(sessions, BOB, _limit=2)
    _submit(sessions, BOB, _limit=2)
    with pytest.raises(LimitReached, match=r"\[MaxSubmitJobLimit\]"):
        _submit(sessions, BOB, _limit=2)
    for _ in range(3):
        _submit(sessions, ROOT, _limit=2)


def test_concurrent_submissions_cannot_pass_a_limit_together(
        sessions: sessionmaker[Session]) -> None:
    """Eight submissions at once against a limit of five: exactly five are stored."""
    results: list[str] = []
    barrier = threading.Barrier(8)

    def one() -> None:
        barrier.wait(timeout=10)
        try:
            _submit(sessions, BOB, _limit=5)
            results.append("ok")
        except LimitReached:
            results.append("refused")

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == ["ok"] * 5 + ["refused"] * 3


@pytest.mark.parametrize("bad, needle", [
    ({"user": [{"name": "x", "accounts": ["bio"], "qos": ["gold"]}]}, "QOS 'gold' is not declared"),
    ({"user": [{"name": "x", "accounts": ["bio"], "qos": ["normal"], "default_qos": "high"}]},
     "default_qos: expected one of the QOS"),
    ({"user": [{"name": "x", "accounts": ["bio"], "qos": []}]}, "a non-empty list"),
    ({"user": [{"name": "x", "accounts": ["bio"], "max_submit_jobs": -1}]}, "max_submit_jobs"),
])
def test_bad_qos_access_in_the_admin_files_is_refused(bad: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_admin_config([("t.toml", {**CONFIG, **bad})])


def test_a_qos_list_naming_an_unknown_stored_qos_is_refused(
        sessions: sessionmaker[Session]) -> None:
    only_users = {"account": CONFIG["account"],
                  "user": [{"name": "x", "accounts": ["bio"], "qos": ["gold"]}]}
    with sessions() as s, s.begin(), pytest.raises(ConfigError, match="QOS 'gold' does not exist"):
        apply_config(s, parse_admin_config([("t.toml", only_users)]))
