"""How the authorisation matrix's callers act as themselves: a child process that took
the caller's uid and gid does the work (the kernel and munged see it, not the test
process, which is root), and, for the munge back-end, real MUNGE credentials.

A MUNGE credential carries the uid and gid of the process that asked munged for it,
so a user's credentials are made by a child that took the user's uid: a batch at a
time (one process makes ``BATCH``), each used once (munged refuses a replay) and only
while it is well within its time-to-live. An agent's credential is root's, this
process's, made by the munged of the agent's node, which stamps the node's address.
"""

from __future__ import annotations

import os
import pwd
import time
import traceback
from collections.abc import Callable, Mapping

from gpusched.auth.munge import DEFAULT_TTL, MungeSigner
from gpusched.auth.mungeclient import MungeClient

BATCH = 64  # credentials one child process makes
FRESH = DEFAULT_TTL / 2  # seconds a made credential is used for (it lives DEFAULT_TTL)


def as_uid(uid: int, gid: int, work: Callable[[], bytes]) -> bytes:
    """What ``work`` gives, run by a child process that took ``uid`` and ``gid`` (and no
    supplementary groups but its account's)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            try:
                try:
                    os.initgroups(pwd.getpwuid(uid).pw_name, gid)
                except KeyError:
                    os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                data = work()
                code = 0
            except BaseException:
                data = traceback.format_exc().encode()
            view = memoryview(data)
            while view:
                view = view[os.write(write_end, view):]
        finally:
            os._exit(code)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    data = b"".join(chunks)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the work as uid {uid} failed: {data!r}"
    return data


class MungeCallers:
    """``Authorization`` values with real MUNGE credentials for each caller but the
    anonymous one (who sends none)."""

    def __init__(self, users: Mapping[str, tuple[int, int]], login: MungeClient,
                 agents: Mapping[str, tuple[str, MungeClient]]) -> None:
        self.users = dict(users)  # caller -> (uid, gid)
        self.login = MungeSigner(login)  # the munged of the users' host
        # caller -> its node, and that node's munged
        self.agents = {caller: (node, MungeSigner(client))
                       for caller, (node, client) in agents.items()}
        self._made: dict[str, tuple[float, list[str]]] = {}  # caller -> (when, unused)
        self.processes = 0  # children that made users' credentials

    def header(self, caller: str) -> str:
        """A fresh header value of ``caller``'s, never given before."""
        if caller in self.agents:
            node, signer = self.agents[caller]
            return signer.authorization(node=node)
        when, unused = self._made.get(caller, (0.0, []))
        if not unused or time.monotonic() - when > FRESH:
            when, unused = time.monotonic(), self._batch(caller)
            self._made[caller] = (when, unused)
        return unused.pop()

    def _batch(self, caller: str) -> list[str]:
        """``BATCH`` header values made by a process of ``caller``'s uid and gid."""
        uid, gid = self.users[caller]
        signer = self.login
        made = as_uid(uid, gid, lambda: "\n".join(
            signer.authorization() for _ in range(BATCH)).encode()).decode().split("\n")
        self.processes += 1
        assert len(made) == BATCH and len(set(made)) == BATCH, made
        return made
