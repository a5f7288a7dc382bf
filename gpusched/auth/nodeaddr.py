"""The addresses a node may speak from, for the munge back-end: munged records the
IPv4 address a credential was made on, and a node credential is taken only from an
address of the node it names.

Where ``[controller] node_addresses`` lists a node, those addresses and no others;
else the node's name as the resolver (DNS, /etc/hosts) gives it, remembered for
``ttl`` seconds so that a lookup is not made on every request.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

Resolver = Callable[..., list[tuple[Any, ...]]]
FAILED_TTL = 5.0  # seconds a failed lookup is remembered


class NodeAddressBook:
    """Callable: node name -> the addresses it may speak from (see the module's doc)."""

    def __init__(self, configured: Mapping[str, Sequence[str]] | None = None,
                 ttl: float = 60.0, max_entries: int = 10_000,
                 resolve: Resolver = socket.getaddrinfo) -> None:
        self.configured = {name: tuple(addresses) for name, addresses in
                           (configured or {}).items()}
        self.ttl, self.max_entries = ttl, max_entries
        self._resolve = resolve
        self._cache: dict[str, tuple[float, tuple[str, ...]]] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str) -> Iterable[str]:
        if name in self.configured:
            return self.configured[name]
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(name)
            if hit is not None and hit[0] > now:
                return hit[1]
        addresses = self._lookup(name)
        with self._lock:
            if len(self._cache) >= self.max_entries:
                self._cache.clear()
            self._cache[name] = (now + (self.ttl if addresses else FAILED_TTL), addresses)
        return addresses

    def _lookup(self, name: str) -> tuple[str, ...]:
        try:
            found = self._resolve(name, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            return ()
        return tuple(dict.fromkeys(str(entry[4][0]) for entry in found))
