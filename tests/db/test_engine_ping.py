"""The controller's pool takes a connection again without a ping when it was given back
moments ago, and pings (and replaces) one idle longer: a connection PostgreSQL dropped
meanwhile costs no request an error."""

from __future__ import annotations

import time

from sqlalchemy import text

from gpusched.db import engine as engine_module
from gpusched.db.engine import make_engine


def test_a_dropped_idle_connection_is_replaced_before_use(db_url: str, monkeypatch) -> None:
    engine = make_engine(db_url, pool_size=1)
    try:
        with engine.connect() as conn:
            first = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        # Another session ends that backend, as a PostgreSQL restart would.
        with make_engine(db_url, pool_size=1).connect() as other:
            other.execute(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": first})
            other.commit()
        monkeypatch.setattr(engine_module, "PING_AFTER_IDLE", 0.0)
        with engine.connect() as conn:  # pinged, found dead, replaced
            second = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        assert second != first
    finally:
        engine.dispose()


def test_a_connection_given_back_moments_ago_is_not_pinged(db_url: str) -> None:
    engine = make_engine(db_url, pool_size=1)
    try:
        with engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        pings = []
        dialect = engine.dialect
        original = dialect.do_ping
        dialect.do_ping = lambda dbapi: pings.append(dbapi) or original(dbapi)  # type: ignore[method-assign]
        for _ in range(5):
            with engine.connect() as conn:
                assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() == pid
        assert pings == []
        time.sleep(engine_module.PING_AFTER_IDLE + 0.1)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        assert len(pings) == 1
    finally:
        engine.dispose()
