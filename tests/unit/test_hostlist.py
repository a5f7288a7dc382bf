"""Host lists as Slurm writes them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.hostlist import HostlistError, compress_hostlist, expand_hostlist


@pytest.mark.parametrize(("text", "names"), [
    ("gpu01", ["gpu01"]),
    ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
    ("gpu[1-3,7]", ["gpu1", "gpu2", "gpu3", "gpu7"]),
    ("gpu[08-10],login1", ["gpu08", "gpu09", "gpu10", "login1"]),
    ("rack[1-2]-node", ["rack1-node", "rack2-node"]),
    ("a[1-2],a2,b", ["a1", "a2", "b"]),  # duplicates dropped, order kept
    (" n[9-11] ", ["n9", "n10", "n11"]),
])
def test_expand(text: str, names: list[str]) -> None:
    assert expand_hostlist(text) == names


@pytest.mark.parametrize(("text", "needle"), [
    ("", "empty"), ("gpu[1-", "unbalanced"), ("gpu]1[", "unbalanced"),
    ("gpu[a-b]", "invalid range"), ("gpu[5-1]", "backwards"), ("g[[1]]", "nested"),
    ("bad name", "invalid host name"), ("n[1-200000]", "more than"),
])
def test_invalid(text: str, needle: str) -> None:
    with pytest.raises(HostlistError, match=needle):
        expand_hostlist(text)


def test_compress() -> None:
    assert compress_hostlist(["gpu01", "gpu02", "gpu03", "gpu05", "login"]) == "gpu[01-03,05],login"
    assert compress_hostlist(["n9", "n10", "n11"]) == "n[9-11]"
    assert compress_hostlist(["solo7"]) == "solo7"


@given(st.lists(st.tuples(st.sampled_from(["gpu", "cpu", "x-"]), st.integers(0, 300),
                          st.sampled_from([0, 2, 3])), max_size=40))
def test_compress_then_expand_round_trips(parts: list[tuple[str, int, int]]) -> None:
    names = list(dict.fromkeys(f"{p}{n:0{w}d}" if w else f"{p}{n}" for p, n, w in parts))
    expanded = expand_hostlist(compress_hostlist(names)) if names else []
    assert sorted(expanded) == sorted(names)
