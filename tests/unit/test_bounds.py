"""The bounds of a job's request (gpusched.core.bounds) and of dependencies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.core import bounds
from gpusched.core.bounds import BoundError
from gpusched.core.dependency import (
    MAX_DEPENDENCY_IDS,
    DependencyError,
    parse_dependency,
)

HOSTILE = ["\x1b]0;pwned\x07", "a\x1b[2Jb", "evil\u202etxt.sh", "x\u2066y", "\x85", "a\nb",
           "a\rb", "zero\u200bwidth", "\x00", "\ud800"]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_characters_are_refused_in_names_and_paths(text: str) -> None:
    with pytest.raises(BoundError, match="U\\+"):
        bounds.check_text("name", text, 200)
    with pytest.raises(BoundError):
        bounds.check_path("output", "/tmp/" + text)


@given(st.text(max_size=50))
def test_a_name_passes_exactly_when_every_character_prints(text: str) -> None:
    try:
        assert bounds.check_text("name", text, 50) == text
        accepted = True
    except BoundError:
        accepted = False
    assert accepted == (bool(text) and text.isprintable())


def test_normal_text_passes() -> None:
    for text in ("train-resnet_50.v2", "étude 中文 🚀", "a b"):
        assert bounds.check_text("name", text, 200) == text


def test_paths_are_shorter_than_path_max_in_bytes() -> None:
    assert bounds.check_path("work_dir", "/" + "a" * 4094)
    with pytest.raises(BoundError, match="shorter than 4096 bytes"):
        bounds.check_path("work_dir", "/" + "a" * 4095)
    with pytest.raises(BoundError, match="shorter than 4096 bytes"):
        bounds.check_path("work_dir", "/" + "é" * 2048)  # 4097 bytes in UTF-8


def test_environment_and_arguments_are_bounded() -> None:
    with pytest.raises(BoundError, match="more than the 1048576 allowed"):
        bounds.check_environment({"BIG": "x" * (1024 * 1024)})
    with pytest.raises(BoundError, match="not a variable name"):
        bounds.check_environment({"A=B": "1"})
    with pytest.raises(BoundError, match="NUL"):
        bounds.check_environment({"A": "1\x002"})
    with pytest.raises(BoundError, match="more than the 10000 allowed"):
        bounds.check_environment({f"V{i}": "" for i in range(10_001)})
    assert bounds.check_environment({"PATH": "/bin", "EMPTY": ""}) == {"PATH": "/bin", "EMPTY": ""}
    with pytest.raises(BoundError, match="arguments, more than"):
        bounds.check_args(["x"] * 4097)
    with pytest.raises(BoundError, match="bytes, more than"):
        bounds.check_args(["x" * 300_000])
    with pytest.raises(BoundError, match="NUL"):
        bounds.check_args(["a\x00"])
    with pytest.raises(BoundError, match="more than the 4194304 allowed"):
        bounds.check_script("#!/bin/sh\n" + "#" * 4 * 1024 * 1024)
    with pytest.raises(BoundError, match="NUL"):
        bounds.check_script("#!/bin/sh\n\x00")
    # A lone surrogate (JSON "\ud800", or a byte decoded with surrogateescape) cannot
    # be stored as text: refused, naming where.
    with pytest.raises(BoundError, match="script: not valid UTF-8 text .* U\\+D800"):
        bounds.check_script("#!/bin/sh\n\ud800")
    with pytest.raises(BoundError, match="args: not valid UTF-8"):
        bounds.check_args(["ok", "\udcff"])
    with pytest.raises(BoundError, match="the value of LANG: not valid UTF-8"):
        bounds.check_environment({"LANG": "C\udc80"})
    with pytest.raises(BoundError, match="environment: not valid UTF-8"):
        bounds.check_environment({"\udc80": "x"})
    assert bounds.check_environment({"NAME": "caf\u00e9 \U0001f600"}) == {
        "NAME": "caf\u00e9 \U0001f600"}


@pytest.mark.parametrize("text", ["9223372036854775808", "0", "-1", "1" * 4300, "１２", "1e3", "x"])
def test_job_ids_no_job_can_have_are_none(text: str) -> None:
    assert bounds.parse_job_id(text) is None


def test_job_ids_round_trip() -> None:
    assert bounds.parse_job_id("9223372036854775807") == 2**63 - 1
    assert bounds.parse_id_list("ids", "3,1,3,,2") == [3, 1, 2]
    with pytest.raises(BoundError, match="job ids from 1"):
        bounds.parse_id_list("ids", "1,9223372036854775808")
    with pytest.raises(BoundError, match="more than 3 job ids"):
        bounds.parse_id_list("ids", "1,2,3,4", limit=3)


@given(st.lists(st.integers(1, 2**63 - 1), max_size=30))
def test_id_lists_round_trip(ids: list[int]) -> None:
    assert bounds.parse_id_list("ids", ",".join(map(str, ids))) == list(dict.fromkeys(ids))


def test_a_dependency_counts_each_job_once_and_names_a_bounded_number() -> None:
    (clause,) = parse_dependency("afterok:" + ":".join(["1"] * 20_000 + ["2"]))
    assert clause.job_ids == (1, 2)
    many = ":".join(str(i) for i in range(1, MAX_DEPENDENCY_IDS + 2))
    with pytest.raises(DependencyError, match=f"more than {MAX_DEPENDENCY_IDS} jobs"):
        parse_dependency(f"afterok:{many}")
    with pytest.raises(DependencyError, match="characters, more than"):
        parse_dependency("afterok:" + "1:" * 40_000 + "1")
    for bad in ("afterok:" + "9" * 4300, "afterok:9223372036854775808"):
        with pytest.raises(DependencyError, match="job ids from 1 to"):
            parse_dependency(bad)
