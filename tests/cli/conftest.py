"""Fixtures of the command-line tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusched.cli import gsubmit


@pytest.fixture
def listener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A socket the commands would reach the controller on (the only one they know of:
    no configuration file or controller list, no gsubmit input variables, run from a
    directory of the test's own); a refusal never connects to it."""
    path = tmp_path / "c.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    server.setblocking(False)
    monkeypatch.setenv("GPUSCHED_SOCKET", str(path))
    monkeypatch.delenv("GPUSCHED_CONFIG", raising=False)
    monkeypatch.delenv("GPUSCHED_CONTROLLERS", raising=False)
    monkeypatch.chdir(tmp_path)
    for name in gsubmit.INPUT_VARIABLES.values():
        monkeypatch.delenv(name, raising=False)
    yield server
    server.close()
