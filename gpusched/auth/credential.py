"""What every authentication back-end shares: the identity a credential proves, the
signer and verifier interfaces, and the ``Authorization`` header a credential travels in.

A request carries ``Authorization: <scheme> <token>`` where the scheme names the
back-end (``GPUSCHED-MUNGE`` or ``GPUSCHED-KEY``) and the token is printable ASCII of at
most ``MAX_TOKEN`` characters. A credential proves a user (uid, gid, the host it was
issued on) or, when ``node`` is set, that the caller is the agent of that node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from gpusched.errors import AuthError

MAX_TOKEN = 4096
HEADER = "Authorization"
SCHEME_MUNGE = "GPUSCHED-MUNGE"
SCHEME_KEY = "GPUSCHED-KEY"
SCHEMES = (SCHEME_MUNGE, SCHEME_KEY)
MAX_UID = 4294967294  # (uid_t)-1 means "no user" to the kernel: never a caller

# A host name as signed into a credential (a short name or a fully qualified one), and
# a node name as the configuration allows it.
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_TOKEN_CHARS = re.compile(r"[!-~]+")  # printable ASCII, no space


@dataclass(frozen=True)
class Identity:
    """Who a verified credential speaks for.

    ``host``: for the key back-end, the host name whose key signed it; for munge, the
    IPv4 address munged recorded as the credential's origin. ``node``: set only for a
    node (agent) credential, the node it proved to be.
    """

    uid: int
    gid: int
    host: str
    node: str | None = None
    method: str = ""


@dataclass(frozen=True)
class Credential:
    """The content of a credential, as signed (key back-end) or decoded (munge)."""

    uid: int
    gid: int
    host: str
    issued_at: int
    expires_at: int
    nonce: str
    node: str | None = None
    key_id: str = ""

    def identity(self, method: str) -> Identity:
        """The identity this credential proves, once its signature has been checked."""
        return Identity(self.uid, self.gid, self.host, self.node, method)


class CredentialSource(Protocol):
    """What a client holds to authenticate: a fresh header value for every request."""

    scheme: str

    def authorization(self, *, node: str | None = None) -> str:
        """A fresh ``<scheme> <token>`` for this process (a node credential with ``node``)."""
        ...


class Verifier(Protocol):
    """Checks a token of one back-end; raises AuthError on anything but a good one."""

    scheme: str

    def verify(self, token: str, now: float) -> Identity:
        """The identity ``token`` proves at time ``now`` (seconds since the epoch)."""
        ...


def authorization_value(scheme: str, token: str) -> str:
    """The ``Authorization`` header value carrying ``token`` under ``scheme``."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown authorization scheme {scheme!r}")
    return f"{scheme} {token}"


def parse_authorization(value: str | bytes | None) -> tuple[str, str]:
    """Split an ``Authorization`` header value into (scheme, token).

    The scheme is matched without regard to case, as HTTP does; the token must be one
    run of printable ASCII no longer than MAX_TOKEN. Anything else is an AuthError.
    """
    if value is None:
        raise AuthError("no credential: this server needs an Authorization header "
                        f"({' or '.join(SCHEMES)})")
    if isinstance(value, bytes):
        if len(value) > MAX_TOKEN + 64:
            raise AuthError(f"credential too long (over {MAX_TOKEN} bytes)")
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            raise AuthError("malformed Authorization header: not ASCII") from None
    if len(value) > MAX_TOKEN + 64:
        raise AuthError(f"credential too long (over {MAX_TOKEN} bytes)")
    scheme, _, token = value.strip(" \t").partition(" ")
    token = token.strip(" \t")
    canonical = next((s for s in SCHEMES if s.lower() == scheme.lower()), None)
    if canonical is None:
        raise AuthError("malformed Authorization header: expected "
                        f"'{SCHEME_MUNGE} <credential>' or '{SCHEME_KEY} <token>'")
    check_token(token)
    return canonical, token


def check_token(token: str) -> None:
    """Refuse a token that is empty, too long or not one run of printable ASCII."""
    if not isinstance(token, str) or not token:
        raise AuthError("malformed credential: empty")
    if len(token) > MAX_TOKEN:
        raise AuthError(f"credential too long (over {MAX_TOKEN} bytes)")
    if not _TOKEN_CHARS.fullmatch(token):
        raise AuthError("malformed credential: not printable ASCII")
