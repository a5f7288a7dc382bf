"""gsrun --pty's own terminal: raw while the step runs, so that every key (Ctrl-C,
Ctrl-Z, Ctrl-D included) goes to the task's terminal on its node as typed, and the
same as before on every way out.

Raw mode is left on return (``restore``), and around a stop (SIGTSTP from outside:
the shell that started gsrun gets its terminal back, and raw mode returns on SIGCONT).
A signal that would end gsrun without Python's unwinding (SIGUSR1, SIGUSR2, SIGALRM,
SIGVTALRM, SIGPROF, SIGXCPU, SIGXFSZ) restores the terminal, then ends gsrun by that
signal as it would have. The signals gsrun forwards to its tasks (INT, TERM, HUP, QUIT)
do not end it: the normal way out restores the terminal.

On _signal, the C module under signal.py (which loads enum): gsrun starts fast.
"""

from __future__ import annotations

import os
import termios

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal  # the same functions and numbers, typed
    from typing import Any
else:
    import _signal

_FATAL = (_signal.SIGUSR1, _signal.SIGUSR2, _signal.SIGALRM, _signal.SIGVTALRM,
          _signal.SIGPROF, _signal.SIGXCPU, _signal.SIGXFSZ)


def raw_mode(mode: list[Any]) -> list[Any]:
    """``mode`` (termios attributes) made raw: bytes in as typed, no echo, no signals or
    flow control from keys, 8 bits, output as written."""
    iflag, oflag, cflag, lflag, ispeed, ospeed, cc = mode
    cc = list(cc)
    cc[termios.VMIN], cc[termios.VTIME] = 1, 0
    return [iflag & ~(termios.BRKINT | termios.ICRNL | termios.INPCK | termios.ISTRIP
                      | termios.IXON),
            oflag & ~termios.OPOST,
            (cflag & ~(termios.CSIZE | termios.PARENB)) | termios.CS8,
            lflag & ~(termios.ECHO | termios.ICANON | termios.IEXTEN | termios.ISIG),
            ispeed, ospeed, cc]


class LocalTerminal:
    """The terminal on ``fd`` (gsrun's stdin), put in raw mode by ``raw``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.saved: list[Any] = termios.tcgetattr(fd)
        self.is_raw = False
        self._old: dict[int, Any] = {}

    @classmethod
    def of_stdin(cls) -> LocalTerminal | None:
        """gsrun's stdin as a terminal; None when it is not one."""
        try:
            return cls(0) if os.isatty(0) else None
        except termios.error:
            return None

    def size(self) -> tuple[int, int] | None:
        """(rows, columns) of the terminal now; None if it cannot be told."""
        try:
            columns, rows = os.get_terminal_size(self.fd)
        except OSError:
            return None
        return min(rows, 65_535), min(columns, 65_535)

    def raw(self) -> bool:
        """Raw mode (input taken as typed, no echo, no signals from keys, output as
        written), and the handlers that give the terminal back before gsrun stops or
        dies; False, and nothing changed, if the terminal refuses it."""
        for sig in (_signal.SIGTSTP, _signal.SIGCONT, *_FATAL):
            self._old.setdefault(sig, _signal.signal(sig, self._on_signal))
        try:
            self._set_raw()
        except termios.error:
            self.restore()
            return False
        return True

    def _set_raw(self) -> None:
        # TCSADRAIN: keys typed before the step started are kept for it.
        termios.tcsetattr(self.fd, termios.TCSADRAIN, raw_mode(self.saved))
        self.is_raw = True

    def _set_saved(self) -> None:
        if self.is_raw:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)
            self.is_raw = False

    def restore(self) -> None:
        """The terminal as it was, and the signals' handlers as they were."""
        try:
            self._set_saved()
        except termios.error:
            pass  # the terminal went away
        for sig, handler in self._old.items():
            _signal.signal(sig, handler)
        self._old.clear()

    def _on_signal(self, signum: int, frame: object) -> None:
        if signum == _signal.SIGCONT:
            if self._old and not self.is_raw:
                self._set_raw()
            return
        try:
            self._set_saved()
        except termios.error:
            pass
        if signum == _signal.SIGTSTP:
            os.kill(os.getpid(), _signal.SIGSTOP)  # raw mode comes back with SIGCONT
            return
        self.restore()
        _signal.signal(signum, _signal.SIG_DFL)
        os.kill(os.getpid(), signum)
