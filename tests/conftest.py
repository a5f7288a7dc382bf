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


# The test files that take longest in all (about 20 s or more each in a run of
# ./run-tests on 2 cores), longest first. They are handed to the workers first, and
# ./run-tests keeps this order (--no-loadscope-reorder): a long file left for the end
# would keep one worker busy while the others have nothing left to do.
LONGEST_FIRST = (
    "tests/chaos/test_chaos.py", "tests/e2e/test_local_cluster.py",
    "tests/security/test_network.py", "tests/e2e/test_node_failure.py",
    "tests/security/test_submit.py", "tests/ops/test_up_gpus.py",
    "tests/agent/test_steps.py", "tests/e2e/test_steps.py",
    "tests/security/test_database.py", "tests/unit/test_typing.py",
    "tests/api_fuzz/test_schemathesis.py", "tests/security/test_authz_matrix.py",
    "tests/e2e/test_allocations.py", "tests/e2e/test_gqueue_filters.py",
    "tests/ops/test_idle_policy_e2e.py", "tests/e2e/test_node_choice.py",
    "tests/e2e/test_lifecycle.py", "tests/ops/test_mail_e2e.py",
    "tests/e2e/test_failover.py", "tests/e2e/test_gcontrol.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of LONGEST_FIRST first, in its order; the others as collected."""
    rank = {path: k for k, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


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
