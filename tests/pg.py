"""A throwaway PostgreSQL for the test session: one per xdist worker, one template
database migrated once, and a fresh copy of it for every test."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path

import psycopg

from gpusched.db.embedded import EmbeddedPostgres
from gpusched.db.migrate import upgrade

TEMPLATE = "gpusched_template"
_FAST = {
    "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
    "max_connections": "300", "shared_buffers": "64MB",
}


class ScratchPostgres:
    """The session's server plus a counter for per-test database names."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(dir="/tmp", prefix="gpusched-pg-"))
        os.chmod(self.root, 0o755)
        self.server = EmbeddedPostgres(self.root / "data", self.root / "sock")
        self.server.init()
        self.server.start(_FAST)
        self._names = itertools.count()
        self.server.create_database(TEMPLATE)
        upgrade(self.server.url(TEMPLATE))

    def admin(self) -> psycopg.Connection:
        """An autocommit connection to the maintenance database."""
        return psycopg.connect(self.server.url().replace("+psycopg", ""), autocommit=True)

    def empty_database(self) -> str:
        """A new database with no schema; returns its SQLAlchemy URL."""
        name = f"empty_{os.getpid()}_{next(self._names)}"
        self.server.create_database(name)
        return self.server.url(name)

    def fresh_database(self) -> str:
        """A new database copied from the migrated template; returns its URL."""
        name = f"test_{os.getpid()}_{next(self._names)}"
        self.server.create_database(name, template=TEMPLATE)
        return self.server.url(name)

    def close(self) -> None:
        """Stop the server and remove its files."""
        self.server.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
