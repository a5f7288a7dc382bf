"""A partition's state at submit: DRAIN and INACTIVE take no new job, named or the
default one (as sbatch's "Required partition not available"), and a refusal stores
nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from gpusched.db import submit
from gpusched.db.models import Job
from gpusched.errors import UsageError
from tests.db.node import ALICE, node_sessions


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    with node_sessions(db_url, [{"index": 0, "uuid": "GPU-0"}]) as factory:
        yield factory


def _set_state(sessions: sessionmaker[Session], state: str) -> None:
    with sessions() as s, s.begin():
        s.execute(text("UPDATE partitions SET state = :state WHERE name = 'gpu'"),
                  {"state": state})


def _submit(sessions: sessionmaker[Session], **body: object) -> int:
    with sessions() as s, s.begin():
        return submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", "gpus": 1,
                                     **body}, ALICE).id


def _jobs(sessions: sessionmaker[Session]) -> int:
    with sessions() as s:
        return int(s.scalar(select(func.count()).select_from(Job)) or 0)


@pytest.mark.parametrize("named", [True, False])
def test_a_draining_partition_takes_no_new_job(sessions: sessionmaker[Session],
                                               named: bool) -> None:
    assert _submit(sessions, **({"partition": "gpu"} if named else {})) > 0
    _set_state(sessions, "DRAIN")
    with pytest.raises(UsageError, match="draining: it takes no new jobs"):
        _submit(sessions, **({"partition": "gpu"} if named else {}))
    assert _jobs(sessions) == 1
    _set_state(sessions, "UP")
    assert _submit(sessions) > 0 and _jobs(sessions) == 2


def test_an_inactive_partition_is_refused_by_name(sessions: sessionmaker[Session]) -> None:
    _set_state(sessions, "INACTIVE")
    with pytest.raises(UsageError, match="invalid partition specified: gpu"):
        _submit(sessions, partition="gpu")
    with pytest.raises(UsageError):
        _submit(sessions)
    assert _jobs(sessions) == 0
