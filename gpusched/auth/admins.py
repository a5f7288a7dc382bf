"""Who is an administrator: root, or a member of ``[controller] admin_group``, judged
from the uid/gid a credential proved and the group database of the controller's host."""

from __future__ import annotations

import grp
import os
import pwd
import threading
import time


class AdminPolicy:
    """Answers "is this caller an administrator?" and "what is this uid's login name?";
    both lookups are cached briefly (``cache_seconds``) so that a directory service is
    not asked on every request."""

    def __init__(self, admin_group: str | None, cache_seconds: float = 60.0,
                 max_entries: int = 10_000) -> None:
        self.admin_group = admin_group
        self.cache_seconds, self.max_entries = cache_seconds, max_entries
        self._cache: dict[int, tuple[float, bool]] = {}
        self._names: dict[int, tuple[float, str]] = {}
        self._lock = threading.Lock()

    def is_admin(self, uid: int, gid: int, now: float | None = None) -> bool:
        """True for root and for members of the admin group (primary or supplementary).

        Membership is the uid's, from the group database: the credential's gid alone
        does not make anyone an administrator, since a setgid program lends its group."""
        if uid == 0:
            return True
        if self.admin_group is None:
            return False
        now = time.monotonic() if now is None else now
        with self._lock:
            hit = self._cache.get(uid)
            if hit is not None and hit[0] > now:
                return hit[1]
        answer = in_group(uid, self.admin_group)
        with self._lock:
            if len(self._cache) >= self.max_entries:
                self._cache.clear()
            self._cache[uid] = (now + self.cache_seconds, answer)
        return answer

    def user_name(self, uid: int, now: float | None = None) -> str:
        """The login name of ``uid`` (the number itself where it has none)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            hit = self._names.get(uid)
            if hit is not None and hit[0] > now:
                return hit[1]
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
        with self._lock:
            if len(self._names) >= self.max_entries:
                self._names.clear()
            self._names[uid] = (now + self.cache_seconds, name)
        return name


def in_group(uid: int, group: str) -> bool:
    """Whether the user ``uid`` belongs to ``group`` on this host, by the group database
    (primary group, member lists and what NSS adds). A group or user unknown here makes
    the answer no."""
    try:
        wanted = grp.getgrnam(group)
    except KeyError:
        return False
    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return False
    if user.pw_gid == wanted.gr_gid or user.pw_name in wanted.gr_mem:
        return True
    try:
        return wanted.gr_gid in os.getgrouplist(user.pw_name, user.pw_gid)
    except OSError:
        return False
