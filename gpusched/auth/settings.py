"""The ``[auth]`` table of gpusched.toml: which back-end proves callers over TCP, and
where its keys and sockets are."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpusched.configfile import TableReader

METHODS = ("none", "munge", "key")


@dataclass(frozen=True)
class AuthConfig:
    """Settings of the authentication back-ends.

    ``method``: "none" (the local Unix socket only, callers known by SO_PEERCRED),
    "munge" or "key". ``key_file``/``previous_key_file``: the master key (controllers;
    the previous one only during a key change); ``host_key_file``: this host's derived
    key (agents and ``gpusched authd``); ``ttl``: seconds a credential lives; ``skew``:
    seconds of clock difference tolerated; ``replay_cache``: credentials remembered at
    once against replay (more in flight are refused until some expire).
    """

    method: str = "none"
    key_file: Path = Path("/etc/gpusched/auth/master.key")
    previous_key_file: Path | None = None
    host_key_file: Path = Path("/etc/gpusched/auth/host.key")
    munge_socket: Path = Path("/run/munge/munge.socket.2")
    authd_socket: Path = Path("/run/gpusched-auth/authd.sock")
    ttl: int = 60
    skew: int = 30
    replay_cache: int = 100_000


def _path(r: TableReader, key: str, default: Path | None) -> Path | None:
    value = r.get(key, str, None if default is None else str(default), "an absolute path")
    if value is None:
        return None
    if not value.startswith("/") or "\0" in value or len(value) > 1024:
        raise r.fail(key, "an absolute path")
    return Path(value)


def _whole(r: TableReader, key: str, default: int, low: int, high: int, what: str) -> int:
    expected = f"a whole number of {what} from {low} to {high}"
    value = r.get(key, int, default, expected)
    if not low <= value <= high:
        raise r.fail(key, expected)
    return int(value)


def parse_auth(r: TableReader) -> AuthConfig:
    """Validate the ``[auth]`` table into an AuthConfig."""
    r.check_keys({"method", "key_file", "previous_key_file", "host_key_file", "munge_socket",
                  "authd_socket", "ttl", "skew", "replay_cache"})
    d = AuthConfig()
    method = r.get("method", str, d.method, "one of 'none', 'munge', 'key'")
    if method not in METHODS:
        raise r.fail("method", "one of 'none', 'munge', 'key'")
    key_file = _path(r, "key_file", d.key_file)
    previous = _path(r, "previous_key_file", None)
    if previous is not None and previous == key_file:
        raise r.fail("previous_key_file", "a file other than key_file")
    return AuthConfig(
        method=method,
        key_file=key_file or d.key_file,
        previous_key_file=previous,
        host_key_file=_path(r, "host_key_file", d.host_key_file) or d.host_key_file,
        munge_socket=_path(r, "munge_socket", d.munge_socket) or d.munge_socket,
        authd_socket=_path(r, "authd_socket", d.authd_socket) or d.authd_socket,
        ttl=_whole(r, "ttl", d.ttl, 1, 3600, "seconds"),
        skew=_whole(r, "skew", d.skew, 0, 3600, "seconds"),
        replay_cache=_whole(r, "replay_cache", d.replay_cache, 1000, 10_000_000,
                            "credentials"),
    )
