"""gsrun's event loop on the C module ``select``: a poll(2) object that keeps a value
for each descriptor it watches, as selectors.PollSelector does, and the accept of a
listening _socket.socket. selectors (and socket.py, which loads it) loads enum and
math: a few milliseconds of every gsrun start.
"""

from __future__ import annotations

import _socket
from select import POLLIN, POLLOUT, poll

TYPE_CHECKING = False
if TYPE_CHECKING:
    from socket import socket as Socket

# What the event loop waits for on a descriptor (selectors' names, poll's bits).
EVENT_READ = POLLIN
EVENT_WRITE = POLLOUT


class Poller:
    """The event loop's poll(2) object with a value kept for each descriptor, as
    selectors.PollSelector keeps one (the same events come back)."""

    def __init__(self) -> None:
        self._poll = poll()
        self._data: dict[int, object] = {}

    def register(self, fileobj: int | Socket, events: int, data: object) -> None:
        """Watch ``fileobj`` (a descriptor or a socket) for ``events``; KeyError if it
        is watched already."""
        fd = _descriptor(fileobj)
        if fd in self._data:
            raise KeyError(f"{fileobj!r} is already registered")
        self._poll.register(fd, events)
        self._data[fd] = data

    def modify(self, fileobj: int | Socket, events: int, data: object) -> None:
        """KeyError if ``fileobj`` is not watched."""
        fd = _descriptor(fileobj)
        if fd not in self._data:
            raise KeyError(f"{fileobj!r} is not registered")
        self._poll.modify(fd, events)
        self._data[fd] = data

    def unregister(self, fileobj: int | Socket) -> None:
        """KeyError if ``fileobj`` is not watched."""
        fd = _descriptor(fileobj)
        del self._data[fd]
        self._poll.unregister(fd)

    def select(self, timeout: float) -> list[tuple[object, int]]:
        """(data, events) of each descriptor ready within ``timeout`` seconds; an error
        or hang-up counts as both readable and writable (as selectors has it)."""
        wait = timeout * 1000
        millis = int(wait) + (int(wait) < wait)  # rounded up: never wake too early
        ready: list[tuple[object, int]] = []
        try:
            found = self._poll.poll(millis)
        except InterruptedError:
            return ready
        for fd, event in found:
            events = 0
            if event & ~POLLIN:
                events |= EVENT_WRITE
            if event & ~POLLOUT:
                events |= EVENT_READ
            if fd in self._data:
                ready.append((self._data[fd], events))
        return ready

    def close(self) -> None:
        self._data.clear()


def _descriptor(fileobj: int | Socket) -> int:
    """The descriptor of ``fileobj``; ValueError for a closed socket."""
    fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
    if fd < 0:
        raise ValueError(f"invalid file descriptor {fd}")
    return fd


def accept(listener: Socket) -> Socket:
    """A connection waiting on ``listener`` (socket.socket.accept on _socket)."""
    fd, _ = listener._accept()  # type: ignore[attr-defined]
    sock: Socket = _socket.socket(listener.family, listener.type, listener.proto,  # type: ignore[assignment]
                                  fileno=fd)
    return sock
