"""A request that fails for want of what it needs (the database's pool exhausted, the
database out of reach) is answered 503 with one line in the log, not a 500 with a
traceback per request."""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as SqlTimeoutError

from gpusched.client import ApiClient
from gpusched.controller.http import Request, Router
from gpusched.controller.main import UNAVAILABLE
from gpusched.errors import Unavailable
from tests.controller.test_http_server import Handlers, serving


class Starved(Handlers):
    def router(self) -> Router:
        r = super().router()
        r.add("GET", "/pool", self.pool)
        r.add("GET", "/db", self.db)
        r.add("GET", "/driver", self.driver)
        return r

    def pool(self, request: Request) -> tuple[int, dict[str, object]]:
        raise SqlTimeoutError("QueuePool limit of size 20 overflow 20 reached, connection "
                              "timed out, timeout 30.00\n(Background on this error at: ...)")

    def db(self, request: Request) -> tuple[int, dict[str, object]]:
        raise OperationalError("SELECT 1", {}, Exception("connection refused"))

    def driver(self, request: Request) -> tuple[int, dict[str, object]]:
        # A statement run on the driver's connection (db.engine.driver) when the
        # database went away meanwhile.
        raise psycopg.OperationalError("server closed the connection unexpectedly")


def test_a_starved_request_is_503_with_one_log_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    handlers = Starved()
    with serving(tmp_path, handlers) as server:
        server.service.unavailable = UNAVAILABLE  # as the controller sets it
        client = ApiClient(server.path, rounds=1)
        with caplog.at_level(logging.INFO):
            for path in ("/pool", "/pool", "/pool", "/db", "/driver"):
                with pytest.raises(Unavailable, match="cannot serve this now"):
                    client.request("GET", path)
            with pytest.raises(Exception) as bug:  # anything else is still a bug: 500
                client.request("GET", "/broken")
    assert "internal error" in str(bug.value)
    starved = [r for r in caplog.records if "could not serve" in r.getMessage()]
    # One a kind (by the error's class name: SQLAlchemy's and psycopg's OperationalError
    # are one kind).
    assert [r.levelno for r in starved] == [logging.WARNING, logging.WARNING]
    assert all(r.exc_info is None for r in starved)
    assert "QueuePool limit" in starved[0].getMessage()
    assert "Background" not in starved[0].getMessage()
