"""Tokens of the ``key`` back-end: HMAC-SHA256 over the credential's fields, signed with
the issuing host's derived key, checked by the controller with the master key.

A token is one line of ASCII, fields joined by ':'::

    1:KEYID:HOST:NODE:UID:GID:ISSUED:EXPIRES:NONCE:MAC

``KEYID`` names the master key the host key was derived from (so a verifier can hold a
current and a previous one during a change); ``NODE`` is empty for a user credential;
``ISSUED``/``EXPIRES`` are whole seconds since the epoch; ``NONCE`` is 32 hex digits;
``MAC`` is the unpadded URL-safe base64 of HMAC-SHA256(host key, everything before it).
A node credential must be signed by the key of the host named like the node.
"""

from __future__ import annotations

import base64
import hmac
import re
import secrets
import time

from gpusched.auth.credential import (
    MAX_TOKEN,
    MAX_UID,
    NODE_NAME,
    SCHEME_KEY,
    Credential,
    Identity,
    authorization_value,
    check_token,
)
from gpusched.auth.keys import HostKey, MasterKey, derive_host_key
from gpusched.auth.replay import ReplayCache
from gpusched.errors import AuthError

VERSION = "1"
DEFAULT_TTL = 60
DEFAULT_SKEW = 30
_KEPT_HOST_KEYS = 4096  # derived host keys a verifier keeps
_NUM = r"(?:0|[1-9][0-9]{0,9})"
_TOKEN = re.compile(
    rf"{VERSION}:(?P<kid>[0-9a-f]{{16}}):(?P<host>[A-Za-z0-9][A-Za-z0-9_.-]{{0,252}}):"
    rf"(?P<node>(?:[A-Za-z0-9][A-Za-z0-9_.-]{{0,63}})?):(?P<uid>{_NUM}):(?P<gid>{_NUM}):"
    rf"(?P<issued>{_NUM}):(?P<expires>{_NUM}):(?P<nonce>[0-9a-f]{{32}}):"
    r"(?P<mac>[A-Za-z0-9_-]{43})")


def _mac(secret: bytes, signed: str) -> str:
    digest = hmac.digest(secret, signed.encode("ascii"), "sha256")  # one C call
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _signed_part(c: Credential) -> str:
    return (f"{VERSION}:{c.key_id}:{c.host}:{c.node or ''}:{c.uid}:{c.gid}:"
            f"{c.issued_at}:{c.expires_at}:{c.nonce}")


class KeySigner:
    """Signs credentials as the host whose key it holds (root's agent, ``gpusched authd``)."""

    scheme = SCHEME_KEY

    def __init__(self, key: HostKey, ttl: int = DEFAULT_TTL) -> None:
        if not 1 <= ttl <= 86400:
            raise ValueError("ttl must be 1 to 86400 seconds")
        self.key, self.ttl = key, ttl

    def sign(self, uid: int, gid: int, *, node: str | None = None,
             now: float | None = None) -> str:
        """A token proving (uid, gid) on this host, or this host's node when ``node``."""
        if not (0 <= uid <= MAX_UID and 0 <= gid <= MAX_UID):
            raise ValueError(f"uid and gid must be 0 to {MAX_UID}")
        if node is not None and node != self.key.host:
            raise ValueError(f"the key of host {self.key.host!r} cannot sign for node {node!r}")
        if node is not None and not NODE_NAME.fullmatch(node):
            raise ValueError(f"invalid node name {node!r}")
        issued = int(time.time() if now is None else now)
        credential = Credential(uid=uid, gid=gid, host=self.key.host, issued_at=issued,
                                expires_at=issued + self.ttl, nonce=secrets.token_hex(16),
                                node=node, key_id=self.key.key_id)
        signed = _signed_part(credential)
        return f"{signed}:{_mac(self.key.secret, signed)}"

    def authorization(self, *, node: str | None = None) -> str:
        """A header value for this process's own uid/gid (or its node)."""
        import os

        return authorization_value(SCHEME_KEY, self.sign(os.geteuid(), os.getegid(), node=node))


def decode_token(token: str) -> tuple[Credential, str]:
    """The fields of a token and its MAC, unchecked; AuthError when malformed."""
    check_token(token)
    match = _TOKEN.fullmatch(token)
    if match is None:
        raise AuthError("malformed credential: not a gpusched key token")
    uid, gid = int(match["uid"]), int(match["gid"])
    if uid > MAX_UID or gid > MAX_UID:
        raise AuthError("malformed credential: uid or gid out of range")
    credential = Credential(uid=uid, gid=gid, host=match["host"],
                            issued_at=int(match["issued"]), expires_at=int(match["expires"]),
                            nonce=match["nonce"], node=match["node"] or None,
                            key_id=match["kid"])
    return credential, match["mac"]


class KeyVerifier:
    """Checks key tokens with the master key (and, during a change, the previous one)."""

    scheme = SCHEME_KEY

    def __init__(self, current: MasterKey, previous: MasterKey | None = None, *,
                 ttl: int = DEFAULT_TTL, skew: int = DEFAULT_SKEW,
                 replay: ReplayCache | None = None) -> None:
        self.masters = {current.key_id: current}
        if previous is not None and previous.key_id != current.key_id:
            self.masters[previous.key_id] = previous
        self.ttl, self.skew = ttl, skew
        self.replay = replay if replay is not None else ReplayCache()
        self._secrets: dict[tuple[str, str], bytes] = {}  # derived host keys, bounded

    def _host_secret(self, key_id: str, host: str) -> bytes:
        found = self._secrets.get((key_id, host))
        if found is not None:
            return found
        master = self.masters.get(key_id)
        if master is None:
            raise AuthError(f"credential signed with an unknown key (key id {key_id}); the "
                            "host's key file may be from a retired or another master key")
        secret = derive_host_key(master, host).secret
        if len(self._secrets) >= _KEPT_HOST_KEYS:
            self._secrets.clear()  # many hosts, or made-up names: derived again as needed
        self._secrets[(key_id, host)] = secret
        return secret

    def check(self, token: str, now: float) -> Credential:
        """The credential ``token`` carries, if signed and current; no replay check."""
        if len(token) > MAX_TOKEN:
            raise AuthError(f"credential too long (over {MAX_TOKEN} bytes)")
        credential, mac = decode_token(token)
        secret = self._host_secret(credential.key_id, credential.host)
        if not hmac.compare_digest(_mac(secret, token[: -len(mac) - 1]), mac):
            raise AuthError("credential refused: bad signature")
        if credential.node is not None and credential.node != credential.host:
            raise AuthError(f"credential refused: host {credential.host} cannot speak for "
                            f"node {credential.node}")
        lifetime = credential.expires_at - credential.issued_at
        if not 0 < lifetime <= self.ttl:
            raise AuthError(f"credential refused: lifetime of {lifetime} s (this controller "
                            f"accepts 1 to {self.ttl} s)")
        if credential.issued_at > now + self.skew:
            raise AuthError(f"credential refused: issued {credential.issued_at - now:.0f} s in "
                            "the future (check the clocks)")
        if credential.expires_at + self.skew < now:
            raise AuthError(f"credential expired {now - credential.expires_at:.0f} s ago")
        return credential

    def verify(self, token: str, now: float) -> Identity:
        """The identity a good, unused token proves; AuthError for anything else."""
        credential = self.check(token, now)
        owner = f"node:{credential.node}" if credential.node else f"uid:{credential.uid}"
        self.replay.use(credential.host, credential.nonce, credential.expires_at + self.skew,
                        now, owner)
        return credential.identity("key")
