"""Array specs: any text parses to a canonical spec that parses back to itself and
names the ids the text named, or is refused with an ArrayError of one line."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.arrays import (
    MAX_TASKS,
    ArrayError,
    drop_first,
    iter_tasks,
    parse_array,
    task_bounds,
)
from tests.fuzz.fuzzing import fuzz, long_number, noisy_text, one_line

small = st.integers(0, 2000).map(str) | long_number()
run = st.one_of(small, st.builds(lambda a, b: f"{a}-{b}", small, small),
                st.builds(lambda a, b, s: f"{a}-{b}:{s}", small, small, small))
spec_text = st.one_of(
    st.builds(lambda runs, cap: ",".join(runs) + cap, st.lists(run, min_size=1, max_size=5),
              st.sampled_from(["", "%"]) | small.map(lambda n: f"%{n}")),
    noisy_text("0123456789-,:%", 12))


def named_ids(text: str) -> set[int]:
    """The ids a well-formed text names, read the plain way."""
    ids: set[int] = set()
    for token in text.split("%")[0].split(","):
        span, _, step = token.strip().partition(":")
        first, _, last = span.partition("-")
        ids.update(range(int(first), int(last or first) + 1, int(step or 1)))
    return ids


@fuzz(500)
@given(spec_text)
def test_array_specs(text: str) -> None:
    try:
        spec = parse_array(text)
    except ArrayError as err:
        one_line(err)
        return
    assert parse_array(spec.text()) == spec
    ids = list(iter_tasks(spec.tasks))
    assert ids == sorted(named_ids(text)) and 0 < len(ids) <= MAX_TASKS
    assert task_bounds(spec.tasks) == (len(ids), ids[0], ids[-1])
    # What is left after the first task names the other ids (in a text of the same runs,
    # not always the canonical one: 0-4:2 leaves 2-4:2, not 2,4).
    left = drop_first(spec.tasks, 1)
    assert (list(iter_tasks(left)) if left is not None else []) == ids[1:]
