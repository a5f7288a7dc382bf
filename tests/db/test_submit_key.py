"""A submission sent twice with the same ``submit_key`` (a lost answer, a failover to
another controller) is one job, against a real database: in turn, and at once from two
transactions."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.jobs import Identity
from gpusched.db.models import Job
from gpusched.db.partitions import sync_partitions
from gpusched.db.submit import store_submission, submit_job
from gpusched.errors import UsageError

ALICE = Identity(1000, 1000, "alice")
BOB = Identity(1001, 1001, "bob")
BODY = {"script": "#!/bin/sh\necho hi\n", "work_dir": "/tmp/work"}


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url, pool_size=4)
    maker = make_sessionmaker(engine)
    with maker() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),))
    yield maker
    engine.dispose()


def _jobs(sessions: sessionmaker[Session]) -> int:
    with sessions() as s:
        return s.scalar(select(func.count()).select_from(Job)) or 0


def _submit(sessions: sessionmaker[Session], who: Identity,
            **fields: Any) -> tuple[int, bool]:
    with sessions() as s, s.begin():
        job, created = store_submission(s, {**BODY, **fields}, who)
        return job.id, created


def test_the_same_key_sent_again_gives_the_first_job(sessions: sessionmaker[Session]) -> None:
    first = _submit(sessions, ALICE, submit_key="k-1", name="first")
    again = _submit(sessions, ALICE, submit_key="k-1", name="changed meanwhile")
    assert first == (first[0], True)
    assert again == (first[0], False)
    assert _jobs(sessions) == 1
    with sessions() as s:
        job = s.get(Job, first[0])
        assert job is not None and (job.name, job.submit_key) == ("first", "k-1")


def test_keys_are_per_user_and_no_key_is_never_deduplicated(
        sessions: sessionmaker[Session]) -> None:
    alice, bob = _submit(sessions, ALICE, submit_key="same"), _submit(sessions, BOB,
                                                                      submit_key="same")
    assert alice[0] != bob[0] and alice[1] and bob[1]
    plain = {_submit(sessions, ALICE)[0] for _ in range(2)}
    assert len(plain) == 2
    assert _jobs(sessions) == 4


def test_an_array_sent_twice_is_one_array(sessions: sessionmaker[Session]) -> None:
    first = _submit(sessions, ALICE, submit_key="arr", array="0-3")
    assert _submit(sessions, ALICE, submit_key="arr", array="0-3") == (first[0], False)
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Job)
                        .where(Job.array_job_id == first[0])) == 1


@pytest.mark.parametrize("key", ["", "x" * 65, "has space", "naïve", "tab\t", 17, ["k"]])
def test_a_bad_key_is_refused_and_nothing_stored(sessions: sessionmaker[Session],
                                                 key: object) -> None:
    with pytest.raises(UsageError, match="submit_key: expected 1 to 64 printable ASCII"), \
            sessions() as s, s.begin():
        submit_job(s, {**BODY, "submit_key": key}, ALICE)
    assert _jobs(sessions) == 0


def test_a_key_of_64_printable_characters_is_taken(sessions: sessionmaker[Session]) -> None:
    key = "".join(chr(c) for c in range(0x21, 0x21 + 64))
    assert _submit(sessions, ALICE, submit_key=key)[1]
    assert _submit(sessions, ALICE, submit_key=key)[1] is False


def test_two_copies_at_once_store_one_job(sessions: sessionmaker[Session]) -> None:
    """The first copy has stored its job but not committed when the second arrives (as
    when two controllers get the same submission): the second waits for the first
    and gives its job."""
    first = sessions()
    first.begin()
    job, created = store_submission(first, {**BODY, "submit_key": "race"}, ALICE)
    assert created
    answers: list[tuple[int, bool]] = []
    second = threading.Thread(target=lambda: answers.append(
        _submit(sessions, ALICE, submit_key="race")))
    second.start()
    second.join(1.0)
    assert second.is_alive(), "the second copy did not wait for the first transaction"
    job_id = job.id
    first.commit()
    first.close()
    second.join(30)
    assert answers == [(job_id, False)]
    assert _jobs(sessions) == 1
