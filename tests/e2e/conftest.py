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
