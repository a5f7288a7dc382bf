"""Output file name patterns (sbatch --output), expanded as Slurm does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.outputs import (
    DEFAULT_OUTPUT_PATTERN,
    MAX_PAD_WIDTH,
    NO_TASK,
    StepPlace,
    expand_output_pattern,
    output_pattern_error,
)


@pytest.mark.parametrize(("pattern", "expected"), [
    ("gpusched-%j.out", "gpusched-17.out"),
    ("%x-%j.log", "train-17.log"),
    ("/home/%u/logs/%j", "/home/alice/logs/17"),
    ("100%%-%j", "100%-17"),
    ("%%j", "%j"),                 # an escaped %, then a plain j
    ("%%%j", "%17"),
    ("%5j.out", "00017.out"),      # Slurm's zero padding
    ("%2j", "17"),                 # padding never truncates
    ("%5x", "train"),              # and does not apply to names
    ("%n-%t.out", "%n-%t.out"),    # unknown here: kept as written
    ("50%", "50%"),
    ("", ""),
])
def test_expand_output_pattern(pattern: str, expected: str) -> None:
    assert expand_output_pattern(pattern, 17, "train", "alice") == expected


def test_default_pattern_is_slurm_like() -> None:
    assert expand_output_pattern(DEFAULT_OUTPUT_PATTERN, 3, "x", "u") == "gpusched-3.out"


def test_values_are_not_expanded_again() -> None:
    # A job named "%j" must not have its name's % taken for a specifier.
    assert expand_output_pattern("%x-%u", 9, "%j", "%%") == "%j-%%"


@given(st.text(alphabet=st.characters(blacklist_characters="%\\")))
def test_text_without_percent_is_unchanged(text: str) -> None:
    assert expand_output_pattern(text, 1, "n", "u") == text


@given(st.text(alphabet=st.characters(blacklist_characters="\\")))
def test_doubled_percents_expand_to_the_text(text: str) -> None:
    escaped = text.replace("%", "%%")
    assert expand_output_pattern(escaped, 1, "n", "u") == text


def test_array_ids_and_their_padding() -> None:
    assert expand_output_pattern("%A_%a.out", 40, "x", "u", 12, 3) == "12_3.out"
    assert expand_output_pattern("%4a-%5A-%j", 40, "x", "u", 12, 3) == "0003-00012-40"


def test_array_ids_of_a_job_outside_any_array_are_slurms() -> None:
    assert expand_output_pattern("%A_%a", 40, "x", "u") == f"40_{NO_TASK}" == "40_4294967294"


def test_node_name() -> None:
    assert expand_output_pattern("%N-%x-%u-%j.out", 7, "train", "alice", node="gpu03") == \
        "gpu03-train-alice-7.out"
    assert expand_output_pattern("%5N.out", 7, "t", "a", node="gpu03") == "gpu03.out"


@pytest.mark.parametrize("width", ["11", "999999999", "99999999999999999999", "0" * 50 + "5"])
def test_expand_never_pads_past_the_bound(width: str) -> None:
    # The database may hold what submit refuses; the agent expanding it must neither
    # raise (OverflowError) nor build a huge name.
    expanded = expand_output_pattern(f"/tmp/%{width}j.out", 17, "n", "u")
    assert expanded == "/tmp/" + "17".zfill(MAX_PAD_WIDTH) + ".out"


def test_expand_keeps_widths_within_the_bound() -> None:
    assert expand_output_pattern(f"%{MAX_PAD_WIDTH}j", 3, "n", "u") == "3".zfill(MAX_PAD_WIDTH)
    assert output_pattern_error(f"%{MAX_PAD_WIDTH}j") is None
    assert output_pattern_error(f"%{MAX_PAD_WIDTH + 1}j") is not None


def test_step_task_specifiers() -> None:
    place = StepPlace(step_id=3, task_id=5, node_index=1)
    assert expand_output_pattern("out-%j.%s-%t-%n-%N.txt", 12, "x", "u", node="gpu02",
                                 step=place) == "out-12.3-5-1-gpu02.txt"
    assert expand_output_pattern("%3t.%2n.%4s", 12, "x", "u", step=place) == "005.01.0003"
    assert expand_output_pattern("%%t-%t", 12, "x", "u", step=place) == "%t-5"


def test_step_specifiers_are_kept_in_a_batch_jobs_pattern() -> None:
    assert expand_output_pattern("%s-%5t-%n-%j", 12, "x", "u") == "%s-%5t-%n-12"


def test_step_specifier_widths_are_bounded() -> None:
    assert output_pattern_error("%11t") is not None
    place = StepPlace(0, 7, 0)
    assert expand_output_pattern("%99t", 1, "x", "u", step=place) == "7".zfill(MAX_PAD_WIDTH)


def test_a_backslash_escapes_a_space_and_turns_expansion_off() -> None:
    # As Slurm's: a pattern with a backslash is taken as written, backslashes dropped.
    assert expand_output_pattern("my\\ dir/out-%j.txt", 7, "n", "u") == "my dir/out-%j.txt"
    assert expand_output_pattern("a\\\\b%x", 7, "n", "u") == "ab%x"


@given(st.text(), st.text())
def test_a_pattern_with_a_backslash_loses_only_its_backslashes(head: str, tail: str) -> None:
    pattern = head + "\\" + tail
    assert expand_output_pattern(pattern, 3, "%j", "u") == "".join(
        c for c in pattern if c != "\\")
