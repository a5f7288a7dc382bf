"""Dependency specs: any text parses to clauses that render and parse back to the
same clauses, or is refused with a DependencyError of one line."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.dependency import Dependency, DependencyError, parse_dependency
from tests.fuzz.fuzzing import fuzz, long_number, noisy_text, one_line

kind = st.sampled_from(["afterok", "afternotok", "afterany", "singleton", "after", "AFTEROK",
                        "afterok ", ""])
job_id = st.one_of(st.integers(0, 2**64).map(str), long_number(), st.sampled_from(["", " 5", "-1"]))
clause = st.builds(lambda k, ids: k + "".join(f":{i}" for i in ids), kind,
                   st.lists(job_id, max_size=4))
dependency_text = st.one_of(st.lists(clause, min_size=1, max_size=4).map(",".join),
                            noisy_text("afterokny:,singleto0123456789", 10))


def render(clauses: tuple[Dependency, ...]) -> str:
    return ",".join(c.kind + "".join(f":{i}" for i in c.job_ids) for c in clauses)


@fuzz(500)
@given(dependency_text)
def test_dependency_specs(text: str) -> None:
    try:
        clauses = parse_dependency(text)
    except DependencyError as err:
        one_line(err)
        return
    assert clauses and parse_dependency(render(clauses)) == clauses
    assert all(0 < i < 2**63 for c in clauses for i in c.job_ids)
