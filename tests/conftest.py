"""Session-wide fixtures: a real PostgreSQL per worker, and the fake NVML library."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.nvml_fixture import fake_nvml, fake_nvml_factory, fake_nvml_lib  # noqa: F401
from tests.pg import ScratchPostgres

# ./run-tests, the gate every change passes, draws the same examples on every run (a
# seed per test), so that it fails for what a change did, not for what one run happened
# to draw; pytest run directly draws new ones, and keeps the failures it finds.
settings.register_profile("gate", derandomize=True)
if os.environ.get("GPUSCHED_TEST_PROFILE") == "gate":
    settings.load_profile("gate")


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
