"""What the fuzz tests share: how many examples each runs, and what a refusal must be.

Each test names its usual number of examples; ``GPUSCHED_FUZZ_FACTOR`` multiplies them
all (``GPUSCHED_FUZZ_FACTOR=50`` for a long run; the default keeps the whole directory
under a minute). A refusal is one of the project's errors, with a message of one
printable line; anything else a parser raises is a failure.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# Any character but the surrogates that no real argument or file can carry (``\udcff``,
# an undecodable byte of an argument, is among the AWKWARD pieces).
TEXT = st.characters(exclude_categories=("Cs",))
FACTOR = float(os.environ.get("GPUSCHED_FUZZ_FACTOR", "1"))


def fuzz(examples: int) -> settings:
    """Settings for a fuzz test of ``examples`` examples (times GPUSCHED_FUZZ_FACTOR)."""
    return settings(max_examples=max(1, round(examples * FACTOR)), deadline=None,
                    suppress_health_check=list(HealthCheck))


def one_line(err: BaseException) -> str:
    """The message of a refusal, checked to be one printable line."""
    message = getattr(err, "message", None)
    message = str(err) if message is None else message
    assert message, f"{type(err).__name__} without a message"
    assert message.isprintable(), f"{type(err).__name__} message not one printable line: {message!r}"
    return message


# Text that looks like what people type, with the characters parsers trip on mixed in:
# separators, digits of other scripts, controls, line breaks and very long numbers.
AWKWARD = ["", " ", ",", ":", "-", "[", "]", "%", "@", "=", "+", "\n", "\r", "\t", "\x00",
           "\u0663", "\u00a0", "\u2028", "\x1b", "\udcff", "'", '"', "\\", "#", "*", "|", ".", "_"]


def long_number() -> st.SearchStrategy[str]:
    """Digit runs from short to far past what int() converts (4300 digits)."""
    return st.one_of(st.integers(0, 10**20).map(str),
                     st.integers(1, 6000).map(lambda n: "9" * n),
                     st.integers(1, 30).map(lambda n: "0" * n + "1"))


def noisy_text(alphabet: str, max_size: int = 30) -> st.SearchStrategy[str]:
    """Text from ``alphabet`` and the awkward pieces above, with long numbers inside."""
    piece = st.one_of(st.text(alphabet, min_size=1, max_size=6), st.sampled_from(AWKWARD),
                      long_number(), st.text(TEXT, max_size=3))
    return st.lists(piece, max_size=max_size).map("".join)
