"""Fixtures for the security suite: two real unprivileged users against a cluster
that root started (the test process is root, as in CI)."""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.e2e.cluster import Cluster

ATTACKER_NAMES = ("gpusched-test", "gpusched-test2")


@dataclass(frozen=True)
class LocalUser:
    """A real unprivileged account of this machine."""

    uid: int
    gid: int
    name: str


def ensure_user(name: str) -> LocalUser:
    """The system user ``name``, created when missing."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", name], check=True, capture_output=True)
        entry = pwd.getpwnam(name)
    return LocalUser(entry.pw_uid, entry.pw_gid, entry.pw_name)


@pytest.fixture(scope="session")
def attackers() -> tuple[LocalUser, LocalUser]:
    """Two unprivileged users: ``mallory`` attacks, ``alice`` is the bystander."""
    if os.geteuid() != 0:
        pytest.fail("the security suite runs as root (it starts the cluster as root and "
                    "acts as two unprivileged users)")
    mallory, alice = (ensure_user(n) for n in ATTACKER_NAMES)
    return mallory, alice


@pytest.fixture
def cluster(db_url: str) -> Iterator[Cluster]:
    """A running controller and a 4-GPU agent, started by root, on a fresh database."""
    c = Cluster(db_url)
    try:
        yield c.up()
    finally:
        c.close()
