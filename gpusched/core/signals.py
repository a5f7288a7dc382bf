"""Signals as users write them: ``USR1``, ``SIGUSR1`` or ``10``, and sbatch's
``--signal=[{R|B}:]SIG[@TIME]`` warning before the time limit."""

from __future__ import annotations

import signal
from typing import NamedTuple

DEFAULT_WARN_SECONDS = 60  # sbatch's default TIME
MAX_WARN_SECONDS = 65535  # the most sbatch accepts


class SignalError(ValueError):
    """A signal or --signal text that cannot be read; the message names it."""


class WarnSignal(NamedTuple):
    """Send ``number`` ``seconds`` before the time limit, to the batch script alone
    (``B:``) or to the whole job."""

    number: int
    seconds: int = DEFAULT_WARN_SECONDS
    batch_only: bool = False

    def text(self) -> str:
        """The canonical ``[B:]SIG@TIME`` form (SIG by name when it has one)."""
        try:
            name = signal.Signals(self.number).name[3:]
        except ValueError:  # a real-time signal without a name of its own
            name = str(self.number)
        return f"{'B:' if self.batch_only else ''}{name}@{self.seconds}"


def parse_signal(text: str, flag: str = "--signal") -> int:
    """A signal by name (``USR1``, ``SIGUSR1``) or number."""
    word = text.strip().upper()
    if word.isascii() and word.isdigit():
        number = int(word)
        if 1 <= number < signal.NSIG:
            return number
    elif word:
        try:
            return int(signal.Signals[word if word.startswith("SIG") else "SIG" + word])
        except KeyError:
            pass
    raise SignalError(f"invalid {flag} {text!r}: expected a signal name such as USR1 or a "
                      f"number from 1 to {signal.NSIG - 1}")


def parse_warn_signal(text: str) -> WarnSignal:
    """sbatch's ``--signal=[{R|B}:]SIG[@TIME]``: SIG a name or number, TIME seconds
    (0 to 65535, default 60) before the time limit. ``R:`` (the default) signals the
    whole job, ``B:`` only its batch script."""
    body = text.strip()
    batch_only = False
    head, colon, rest = body.partition(":")
    if colon:
        if head.upper() not in ("R", "B", "RB", "BR"):
            raise SignalError(f"invalid --signal {text!r}: the prefix is R: or B:")
        batch_only, body = "B" in head.upper() and "R" not in head.upper(), rest
    sig, at, seconds = body.partition("@")
    try:
        number = parse_signal(sig)
    except SignalError:
        raise SignalError(f"invalid --signal {text!r}: SIG is a signal name such as USR1 or "
                          f"a number from 1 to {signal.NSIG - 1}") from None
    if not at:
        return WarnSignal(number, DEFAULT_WARN_SECONDS, batch_only)
    word = seconds.strip()
    if not (word.isascii() and word.isdigit()) or int(word) > MAX_WARN_SECONDS:
        raise SignalError(f"invalid --signal {text!r}: @TIME is 0 to {MAX_WARN_SECONDS} seconds")
    return WarnSignal(number, int(word), batch_only)
