"""From ``[auth]`` settings to the objects the server and the clients use.

Server side: ``Authenticator`` checks the ``Authorization`` header of a request with
the configured back-end. Client side: ``credential_source`` gives whatever makes this
process's credentials (munge, this host's key when readable, else the local authd).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from gpusched.auth.credential import (
    SCHEME_KEY,
    SCHEME_MUNGE,
    CredentialSource,
    Identity,
    Verifier,
    parse_authorization,
)
from gpusched.auth.munge import NodeAddresses
from gpusched.auth.settings import AuthConfig
from gpusched.errors import AuthError


class Authenticator:
    """Checks the ``Authorization`` header value of a request; thread-safe."""

    def __init__(self, verifier: Verifier) -> None:
        self.verifier = verifier
        self.scheme = verifier.scheme

    def authenticate(self, header: str | bytes | None, now: float | None = None) -> Identity:
        """The identity the header's credential proves; AuthError for anything else."""
        scheme, token = parse_authorization(header)
        if scheme != self.scheme:
            raise AuthError(f"this controller takes {self.scheme} credentials, not {scheme}")
        return self.verifier.verify(token, time.time() if now is None else now)


def verifier_for(cfg: AuthConfig, *, node_addresses: NodeAddresses | None = None,
                 node_uids: Iterable[int] = (0,), munge_prefer: str = "auto") -> Verifier:
    """The verifier of the configured method (a controller's), keys read and checked now.

    ``node_addresses(name)`` gives the addresses node ``name`` may speak from (munge
    only: a key credential proves its host by the key itself). Raises ConfigError for
    an unusable key file and ValueError for method "none", which has no verifier.
    """
    if cfg.method == "key":
        from gpusched.auth.keys import read_master_key
        from gpusched.auth.keytoken import KeyVerifier
        from gpusched.auth.replay import ReplayCache

        previous = (read_master_key(cfg.previous_key_file)
                    if cfg.previous_key_file is not None else None)
        return KeyVerifier(read_master_key(cfg.key_file), previous, ttl=cfg.ttl,
                           skew=cfg.skew, replay=ReplayCache(cfg.replay_cache))
    if cfg.method == "munge":
        from gpusched.auth.munge import MungeVerifier
        from gpusched.auth.mungeclient import munge_client

        return MungeVerifier(munge_client(cfg.munge_socket, munge_prefer), ttl=cfg.ttl,
                             node_addresses=node_addresses, node_uids=node_uids)
    raise ValueError(f"auth method {cfg.method!r} has no credentials to verify")


def authenticator_for(cfg: AuthConfig, *, node_addresses: NodeAddresses | None = None,
                      node_uids: Iterable[int] = (0,)) -> Authenticator | None:
    """An Authenticator for the configured method, or None for method "none"."""
    if cfg.method == "none":
        return None
    return Authenticator(verifier_for(cfg, node_addresses=node_addresses, node_uids=node_uids))


def credential_source(cfg: AuthConfig, *, munge_prefer: str = "auto") -> CredentialSource | None:
    """What makes this process's credentials, or None for method "none".

    key: a process that can read this host's key file (root, the agent) signs itself;
    any other asks the local ``gpusched authd``.
    """
    if cfg.method == "munge":
        from gpusched.auth.munge import MungeSigner
        from gpusched.auth.mungeclient import munge_client

        return MungeSigner(munge_client(cfg.munge_socket, munge_prefer), cfg.ttl)
    if cfg.method == "key":
        if os.access(cfg.host_key_file, os.R_OK, effective_ids=True):
            from gpusched.auth.keys import read_host_key
            from gpusched.auth.keytoken import KeySigner

            return KeySigner(read_host_key(cfg.host_key_file), cfg.ttl)
        from gpusched.auth.authd import AuthdClient

        return AuthdClient(cfg.authd_socket)
    return None


SCHEME_OF_METHOD = {"munge": SCHEME_MUNGE, "key": SCHEME_KEY}
