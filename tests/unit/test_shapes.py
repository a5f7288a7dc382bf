"""sbatch resource options: --gpus, --gres and memory sizes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.shapes import ShapeError, parse_gpus, parse_gres, parse_memory


@pytest.mark.parametrize(("text", "parsed"), [
    ("0", ((), 0)), ("8", ((), 8)), ("a100:2", (("a100",), 2)),
    ("A100|h100-80gb:2", (("a100", "h100-80gb"), 2)), ("1g.10gb:1", (("1g.10gb",), 1)),
])
def test_parse_gpus(text: str, parsed: tuple[tuple[str, ...], int]) -> None:
    assert parse_gpus(text) == parsed


@pytest.mark.parametrize(("text", "words"), [
    ("-1", "'-1' is not a whole number"), ("x", "'x' is not a whole number"),
    (":2", "expected N or TYPE:N"), ("a100:", "'' is not a whole number"),
    ("a 100:1", "'a 100' is not a GPU type"), ("a100||h100:1", "'' is not a GPU type"),
])
def test_bad_gpus_name_the_token(text: str, words: str) -> None:
    with pytest.raises(ShapeError, match="invalid --gpus") as err:
        parse_gpus(text)
    assert words in str(err.value)


@pytest.mark.parametrize(("text", "parsed"), [
    ("gpu", ((), 1)), ("gpu:4", ((), 4)), ("gpu:a100", (("a100",), 1)),
    ("gpu:l4:2", (("l4",), 2)),
])
def test_parse_gres(text: str, parsed: tuple[tuple[str, ...], int]) -> None:
    assert parse_gres(text) == parsed


@pytest.mark.parametrize("text", ["mps:1", "gpu:a:b:1", "gpu:a100:x"])
def test_bad_gres(text: str) -> None:
    with pytest.raises(ShapeError, match="--gres"):
        parse_gres(text)


@pytest.mark.parametrize(("text", "mib"), [
    ("4096", 4096), ("512M", 512), ("64G", 65536), ("1t", 1048576), ("2048K", 2), ("1K", 1),
    ("0", 0), ("16GB", 16384),
])
def test_parse_memory(text: str, mib: int) -> None:
    assert parse_memory(text) == mib


@given(st.lists(st.from_regex(r"[a-z0-9][a-z0-9.-]{0,8}", fullmatch=True), max_size=3),
       st.integers(0, 64))
def test_gpu_specs_round_trip(kinds: list[str], count: int) -> None:
    text = f"{'|'.join(kinds)}:{count}" if kinds else str(count)
    assert parse_gpus(text) == (tuple(kinds), count)
