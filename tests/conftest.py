"""Session-wide fixtures: a real PostgreSQL per worker, and the fake NVML library."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.nvml_fixture import fake_nvml, fake_nvml_factory, fake_nvml_lib  # noqa: F401
from tests.pg import ScratchPostgres


@pytest.fixture(scope="session")
def postgres() -> Iterator[ScratchPostgres]:
    """The worker's PostgreSQL server with a migrated template database."""
    pg = ScratchPostgres()
    yield pg
    pg.close()


@pytest.fixture
def db_url(postgres: ScratchPostgres) -> str:
    """A fresh, fully migrated database for one test."""
    return postgres.fresh_database()
