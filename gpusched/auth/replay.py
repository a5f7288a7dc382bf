"""The nonces of credentials already used, kept until the credentials expire.

Memory is bounded twice: an entry leaves when its credential could no longer be
accepted anyway, and the cache never holds more than ``capacity`` entries; when full of
unexpired ones it refuses new credentials (the caller retries) instead of growing or
forgetting a nonce that could then be replayed. One owner (a uid, or a node) may hold
at most ``per_owner`` entries, so a single user flooding the controller with fresh
credentials is refused before everyone else is.
"""

from __future__ import annotations

import heapq
import threading
from collections import Counter

from gpusched.errors import AuthError, LimitReached


class ReplayCache:
    """Remembers (host, nonce) pairs until their expiry time; thread-safe."""

    def __init__(self, capacity: int = 100_000, per_owner: int | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.per_owner = per_owner if per_owner is not None else max(1, capacity // 4)
        self._until: dict[str, float] = {}
        self._heap: list[tuple[float, str, str]] = []
        self._owners: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._until)

    def use(self, host: str, nonce: str, until: float, now: float, owner: str = "") -> None:
        """Record that the nonce is used, remembering it until ``until``.

        Raises AuthError when it was used before, LimitReached when the cache (or the
        owner's share of it) is full of credentials that have not expired yet.
        """
        key = f"{host}:{nonce}"
        with self._lock:
            self._forget_expired(now)
            if key in self._until:
                raise AuthError("credential replayed: it was already used")
            if len(self._until) >= self.capacity:
                raise LimitReached("too many credentials in use at once; try again in a "
                                   "few seconds")
            if self._owners[owner] >= self.per_owner:
                raise LimitReached("too many requests from one caller at once; try again "
                                   "in a few seconds")
            self._until[key] = until
            self._owners[owner] += 1
            heapq.heappush(self._heap, (until, key, owner))

    def _forget_expired(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] < now:
            _, key, owner = heapq.heappop(heap)
            del self._until[key]
            self._owners[owner] -= 1
            if not self._owners[owner]:
                del self._owners[owner]
