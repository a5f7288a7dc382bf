"""The ``munge`` back-end: a MUNGE credential on every request.

munged gives the uid and gid of the process that made the credential, the IPv4 address
of the host it was made on, and refuses credentials that are forged (another key),
replayed (decoded before by this munged) or expired. The payload says what the
credential is for, so one made for another service is not taken::

    gpusched 1 user
    gpusched 1 node NAME

The payload is chosen by whoever makes the credential, so a node credential is taken
only from a uid in ``node_uids`` (root) and only from an address the node may speak from.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable

from gpusched.auth.credential import (
    NODE_NAME,
    SCHEME_MUNGE,
    Identity,
    authorization_value,
    check_token,
)
from gpusched.auth.mungeclient import (
    DAEMON_ERRORS,
    EMUNGE_CRED_EXPIRED,
    EMUNGE_CRED_REPLAYED,
    EMUNGE_CRED_REWOUND,
    MAX_PAYLOAD,
    MungeClient,
)
from gpusched.errors import AuthError, Unavailable

DEFAULT_TTL = 60
_USER_PAYLOAD = b"gpusched 1 user"
_NODE_PREFIX = b"gpusched 1 node "
_CREDENTIAL = re.compile(r"MUNGE:[A-Za-z0-9+/]+={0,2}:")

NodeAddresses = Callable[[str], Iterable[str]]


def payload_for(node: str | None) -> bytes:
    """What a gpusched credential carries: who it is for."""
    if node is None:
        return _USER_PAYLOAD
    if not NODE_NAME.fullmatch(node):
        raise ValueError(f"invalid node name {node!r}")
    return _NODE_PREFIX + node.encode("ascii")


class MungeSigner:
    """Makes credentials of the calling process through munged."""

    scheme = SCHEME_MUNGE

    def __init__(self, client: MungeClient, ttl: int = DEFAULT_TTL) -> None:
        if not 1 <= ttl <= 86400:
            raise ValueError("ttl must be 1 to 86400 seconds")
        self.client, self.ttl = client, ttl

    def sign(self, *, node: str | None = None) -> str:
        """A MUNGE credential of this process's uid/gid (a node credential with ``node``)."""
        return self.client.encode(payload_for(node), self.ttl)

    def authorization(self, *, node: str | None = None) -> str:
        """A header value carrying a fresh credential."""
        return authorization_value(SCHEME_MUNGE, self.sign(node=node))


class MungeVerifier:
    """Checks MUNGE credentials through the controller host's munged."""

    scheme = SCHEME_MUNGE

    def __init__(self, client: MungeClient, *, ttl: int = DEFAULT_TTL,
                 node_addresses: NodeAddresses | None = None,
                 node_uids: Iterable[int] = (0,)) -> None:
        self.client, self.ttl = client, ttl
        self.node_addresses = node_addresses
        self.node_uids = frozenset(node_uids)

    def verify(self, token: str, now: float) -> Identity:
        """The identity a good, unused credential proves; AuthError for anything else,
        Unavailable when munged cannot be asked. munged keeps the time: ``now`` is not
        used."""
        check_token(token)
        if not _CREDENTIAL.fullmatch(token):
            raise AuthError("malformed credential: not a MUNGE credential")
        decoded = self.client.decode(token)
        if decoded.status in DAEMON_ERRORS:
            raise Unavailable(f"munge: cannot check the credential: {decoded.message}")
        if decoded.status == EMUNGE_CRED_REPLAYED:
            raise AuthError("credential replayed: munged has already decoded it")
        if decoded.status == EMUNGE_CRED_EXPIRED:
            raise AuthError("credential expired (munge)")
        if decoded.status == EMUNGE_CRED_REWOUND:
            raise AuthError("credential refused: made in the future (check the clocks)")
        if decoded.status != 0:
            raise AuthError(f"credential refused by munge: {decoded.message}")
        if not 0 < decoded.ttl <= self.ttl:
            raise AuthError(f"credential refused: time-to-live of {decoded.ttl} s (this "
                            f"controller accepts 1 to {self.ttl} s)")
        node = self._node(decoded.payload)
        if node is not None:
            self._check_node(node, decoded.uid, decoded.address)
        return Identity(decoded.uid, decoded.gid, decoded.address, node, "munge")

    @staticmethod
    def _node(payload: bytes) -> str | None:
        if payload == _USER_PAYLOAD:
            return None
        if len(payload) <= MAX_PAYLOAD and payload.startswith(_NODE_PREFIX):
            name = payload[len(_NODE_PREFIX):].decode("ascii", "replace")
            if NODE_NAME.fullmatch(name):
                return name
        raise AuthError("credential refused: not made for gpusched")

    def _check_node(self, node: str, uid: int, address: str) -> None:
        if uid not in self.node_uids:
            raise AuthError(f"credential refused: uid {uid} cannot speak for node {node} "
                            "(a node credential must come from root)")
        if self.node_addresses is None:
            raise AuthError(f"credential refused: node {node}: this controller knows no "
                            "address for it")
        allowed = set()
        for entry in self.node_addresses(node):
            try:
                allowed.add(ipaddress.ip_address(entry))
            except ValueError:
                continue
        try:
            origin = ipaddress.ip_address(address)
        except ValueError:
            origin = None
        if origin is None or origin not in allowed:
            raise AuthError(f"credential refused: node {node} does not speak from {address}")
