"""Migrations produce exactly the models' schema, and undo cleanly."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, pool

from gpusched.db.migrate import current, downgrade, upgrade
from gpusched.db.models import Base
from tests.pg import ScratchPostgres


def _diff(url: str) -> list[object]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return list(compare_metadata(MigrationContext.configure(conn), Base.metadata))
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_head_from_empty_matches_models(postgres: ScratchPostgres) -> None:
    url = postgres.empty_database()
    assert current(url) is None
    upgrade(url)
    assert current(url) is not None
    assert _tables(url) == set(Base.metadata.tables) | {"alembic_version"}
    assert _diff(url) == []


def test_downgrade_base_removes_everything_and_upgrade_again(postgres: ScratchPostgres) -> None:
    url = postgres.empty_database()
    upgrade(url)
    downgrade(url)
    assert _tables(url) == {"alembic_version"}
    assert current(url) is None
    upgrade(url)
    assert _diff(url) == []
