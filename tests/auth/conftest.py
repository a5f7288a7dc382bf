"""Fixtures of the authentication tests: private munged daemons (a real one, with its
own key), and the unprivileged users of the security suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.auth.munged import Munged, munge_installed
from tests.security.conftest import attackers  # noqa: F401


@pytest.fixture(scope="module")
def munged() -> Iterator[Munged]:
    """A munged of its own for this module's tests."""
    if not munge_installed():
        pytest.fail("munge is not installed (./run-tests installs it: apt-get install munge)")
    daemon = Munged()
    try:
        yield daemon
    finally:
        daemon.stop()
