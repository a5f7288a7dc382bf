"""Schema migrations through Alembic (``gpusched db upgrade``)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig

import gpusched.migrations


def alembic_config(url: str) -> AlembicConfig:
    """An Alembic config pointing at the packaged migrations and ``url``."""
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(Path(gpusched.migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision``."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    """Migrate the database at ``url`` down to ``revision``."""
    command.downgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    """The revision the database is at, or None if unmigrated."""
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine, pool

    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
