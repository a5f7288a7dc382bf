"""Fixtures for the security suite: two real unprivileged users against a cluster
that root started (the test process is root, as in CI)."""

from __future__ import annotations

import os
import pwd
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

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


def _hidden_ancestor(path: Path) -> Path | None:
    """The highest directory above ``path`` that other users cannot pass through."""
    for parent in reversed(path.parents):
        if parent != Path("/") and not os.stat(parent).st_mode & 0o001:
            return parent
    return None


def run_as(user: LocalUser, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
           cwd: Path | str | None = None, timeout: float = 60,
           stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``user``: a real process of that user, as if from their shell.

    The test interpreter may live under a directory other users cannot enter (Python
    installed in /root, as on the CI machines); then the command runs in a mount
    namespace of its own where that directory is replaced by an empty one holding only
    the interpreter, so the user reaches Python and nothing else of it."""
    base = Path(sys.base_prefix).resolve()
    hidden = _hidden_ancestor(base)
    drop = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups", "--",
            *argv]
    if hidden is None:
        command = drop
    else:
        holder = tempfile.mkdtemp(prefix="gpusched-python-")
        script = " && ".join([
            f"mount --bind {shlex.quote(str(base))} {shlex.quote(holder)}",
            f"mount -t tmpfs -o mode=0755,size=1m gpusched-test {shlex.quote(str(hidden))}",
            f"mkdir -p {shlex.quote(str(base))}",
            f"mount --move {shlex.quote(holder)} {shlex.quote(str(base))}",
            "exec " + shlex.join(drop)])
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    try:
        return subprocess.run(command, capture_output=True, text=True, env=dict(env or os.environ),
                              cwd=cwd, timeout=timeout, input=stdin)
    finally:
        if hidden is not None:
            os.rmdir(holder)


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
