"""OUT_OF_MEMORY where job states are listed: an ended state, not ok for dependencies,
``OOM`` in gqueue and gacct filters."""

from __future__ import annotations

import pytest

from gpusched.cli.gacct import STATES as GACCT_STATES
from gpusched.cli.listing import parse_states, short_state
from gpusched.core.dependency import dependency_reason, parse_dependency
from gpusched.core.model import JobState, Reason
from gpusched.db.accounting import SHOWN_STATES
from gpusched.db.models import JOB_STATES

OOM = JobState.OUT_OF_MEMORY


def test_out_of_memory_is_an_ended_state_everywhere_states_are_listed() -> None:
    assert OOM.terminal and OOM.short == "OOM" and short_state("OUT_OF_MEMORY") == "OOM"
    assert "OUT_OF_MEMORY" in JOB_STATES and "OUT_OF_MEMORY" in SHOWN_STATES
    assert "OUT_OF_MEMORY" in GACCT_STATES
    assert parse_states("oom,CD") == ["OUT_OF_MEMORY", "COMPLETED"]
    assert parse_states("OUT_OF_MEMORY", "--state", GACCT_STATES) == ["OUT_OF_MEMORY"]


@pytest.mark.parametrize(("kind", "reason"), [
    ("afterok", Reason.DEPENDENCY_NEVER_SATISFIED),  # never: it did not succeed
    ("afternotok", None),  # met: running out of memory is not ok
    ("afterany", None),
])
def test_an_out_of_memory_job_is_not_ok_for_its_dependants(kind: str,
                                                          reason: Reason | None) -> None:
    deps = parse_dependency(f"{kind}:7")
    assert dependency_reason(deps, {7: OOM}, singleton_busy=False) == reason
    assert dependency_reason(deps, {7: JobState.PENDING}, singleton_busy=False) \
        is Reason.DEPENDENCY  # a requeued job (its prolog failed) holds them back
