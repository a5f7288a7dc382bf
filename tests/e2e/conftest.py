"""Fixtures for end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.cluster import Cluster


@pytest.fixture
def cluster(db_url: str) -> Iterator[Cluster]:
    """A running controller and a 4-GPU agent on a fresh database."""
    c = Cluster(db_url)
    try:
        yield c.up()
    finally:
        c.close()


@pytest.fixture(scope="session")
def job_user() -> tuple[int, int, str]:
    """A real unprivileged user to submit jobs as (created when missing)."""
    import pwd
    import subprocess

    name = "gpusched-test"
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", name], check=True, capture_output=True)
        entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid, name
