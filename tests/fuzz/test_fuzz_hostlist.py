"""Host lists: any text expands to names that compress and expand back to the same
names, or is refused with a HostlistError of one line."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.hostlist import HostlistError, compress_hostlist, expand_hostlist
from tests.fuzz.fuzzing import fuzz, noisy_text, one_line

NAME = re.compile(r"[A-Za-z0-9_.-]+")
name_chars = st.text("abgpu019-_.", min_size=1, max_size=8)
bracket = st.builds(lambda first, span, width: f"{first:0{width}d}" + (
    f"-{first + span:0{width}d}" if span else ""),
    st.integers(0, 120), st.integers(0, 30), st.integers(0, 4))
item = st.one_of(name_chars, st.builds(lambda p, rs, s: f"{p}[{','.join(rs)}]{s}", name_chars,
                                       st.lists(bracket, min_size=1, max_size=3),
                                       st.sampled_from(["", "x", "-ib"])))
plausible = st.lists(item, min_size=1, max_size=5).map(",".join)


def check(text: str) -> None:
    try:
        names = expand_hostlist(text)
    except HostlistError as err:
        one_line(err)
        return
    assert names and len(set(names)) == len(names)
    assert all(NAME.fullmatch(n) for n in names), names
    again = expand_hostlist(compress_hostlist(names))
    assert sorted(again) == sorted(names), (text, compress_hostlist(names))


@fuzz(300)
@given(plausible)
def test_plausible_host_lists(text: str) -> None:
    check(text)


@fuzz(400)
@given(noisy_text("gpu0129[],-", 12))
def test_any_text_as_a_host_list(text: str) -> None:
    check(text)


@fuzz(200)
@given(st.lists(st.from_regex(NAME, fullmatch=True), min_size=1, max_size=20))
def test_any_names_compress_and_expand_back(names: list[str]) -> None:
    text = compress_hostlist(names)
    assert sorted(expand_hostlist(text)) == sorted(dict.fromkeys(names)), text
