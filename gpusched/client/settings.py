"""Where a client reaches the controllers, and how it proves who it is.

``$GPUSCHED_CONTROLLERS`` (``host:port,host:port``), else the top-level ``controllers``
list of the configuration file (``$GPUSCHED_CONFIG``, else /etc/gpusched/gpusched.toml
when it exists and this user may read it); with none, the local Unix socket. Only
``controllers`` and ``[auth]`` are read from the file, so a CLI never loads the rest of
the configuration.
"""

from __future__ import annotations

import os

from gpusched.errors import ConfigError

# Every ApiClient() asks local_socket_only(): this module loads nothing beyond os.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path

    from gpusched.auth.settings import AuthConfig
    from gpusched.client.endpoints import Endpoint

ENV_CONTROLLERS = "GPUSCHED_CONTROLLERS"


def _no_auth() -> AuthConfig:
    from gpusched.auth.settings import AuthConfig

    return AuthConfig()


class ClientSettings:
    """The controllers to try in turn (none: the Unix socket) and the ``[auth]`` settings."""

    __slots__ = ("controllers", "auth", "source")

    def __init__(self, controllers: tuple[Endpoint, ...], auth: AuthConfig, source: str) -> None:
        self.controllers = controllers
        self.auth = auth
        self.source = source

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClientSettings) and (
            self.controllers, self.auth, self.source) == (
            other.controllers, other.auth, other.source)

    def __repr__(self) -> str:
        return (f"ClientSettings(controllers={self.controllers!r}, auth={self.auth!r}, "
                f"source={self.source!r})")


def settings_file(environ: Mapping[str, str] | None = None) -> Path | None:
    """The configuration file a client reads (``$GPUSCHED_CONFIG``, else the system file
    when it exists and this user may read it), or None."""
    named = _settings_file_name(environ)
    if named is None:
        return None
    from pathlib import Path

    return Path(named)


def _settings_file_name(environ: Mapping[str, str] | None) -> str | None:
    from gpusched.places import SYSTEM_CONFIG

    env = os.environ if environ is None else environ
    named = env.get("GPUSCHED_CONFIG")
    if named:
        return named
    # An unreadable system file is a controller host's, for its daemons only.
    return SYSTEM_CONFIG if os.access(SYSTEM_CONFIG, os.R_OK) else None


def local_socket_only(environ: Mapping[str, str] | None = None) -> bool:
    """True when nothing names controllers over TCP: neither ``$GPUSCHED_CONTROLLERS`` nor
    a configuration file to read. A client then needs no settings (the user commands skip
    reading them: a few milliseconds of imports)."""
    env = os.environ if environ is None else environ
    return not env.get(ENV_CONTROLLERS, "").strip() and _settings_file_name(env) is None


def client_settings(environ: Mapping[str, str] | None = None) -> ClientSettings:
    """The settings of this process's environment and configuration file."""
    env = os.environ if environ is None else environ
    path = settings_file(env)
    controllers: tuple[Endpoint, ...] = ()
    auth: AuthConfig | None = None
    source = "<defaults>"
    if path is not None:
        from gpusched.auth.settings import parse_auth
        from gpusched.client.endpoints import endpoints_in
        from gpusched.configfile import TableReader, read_toml

        source = str(path)
        top = TableReader(source, read_toml(path), "")
        controllers = endpoints_in(top, "controllers")
        auth = parse_auth(top.sub("auth"))
    if env.get(ENV_CONTROLLERS, "").strip():
        controllers, source = controllers_from(env, controllers), f"${ENV_CONTROLLERS}"
    settings = ClientSettings(controllers, auth or _no_auth(), source)
    if controllers and settings.auth.method == "none":
        where = f"in {path}" if path is not None else (
            "in a configuration file ($GPUSCHED_CONFIG or /etc/gpusched/gpusched.toml)")
        raise ConfigError(f"{source}: controllers over TCP need credentials: set [auth] "
                          f"method to 'munge' or 'key' {where}")
    return settings


def controllers_from(environ: Mapping[str, str],
                     configured: tuple[Endpoint, ...]) -> tuple[Endpoint, ...]:
    """``$GPUSCHED_CONTROLLERS`` when set, else the configured list."""
    listed = environ.get(ENV_CONTROLLERS, "").strip()
    if not listed:
        return configured
    from gpusched.client.endpoints import parse_endpoints

    try:
        return parse_endpoints(e.strip() for e in listed.split(","))
    except ValueError as exc:
        raise ConfigError(f"{ENV_CONTROLLERS}: {exc}") from None


def node_credentials(auth: AuthConfig, node: str) -> Callable[[], str]:
    """What makes the agent of ``node``'s credentials, checked now: a key method host key
    must be this node's, and readable."""
    from gpusched.auth.backends import credential_source
    from gpusched.errors import AuthError, Unavailable

    source = credential_source(auth)
    if source is None:
        raise ConfigError("controllers: an agent reaches the controllers over TCP with node "
                          "credentials: set [auth] method to 'munge' or 'key'")

    def make() -> str:
        return source.authorization(node=node)

    try:
        make()
    except (ValueError, AuthError) as exc:
        raise ConfigError(f"[auth]: cannot make the credentials of node {node}: "
                          f"{getattr(exc, 'message', exc)}") from None
    except Unavailable:
        pass  # munged may come up later: each request tries again
    return make
