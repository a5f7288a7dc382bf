"""A replay frees each pass it is done with by reference counting (``Replay._drop_last``
breaks the cycles a pass holds): the cyclic collector, whose walks cost a long replay
more than the passes themselves, finds nothing left behind."""

from __future__ import annotations

import gc

import pytest

from gpusched.sim.cluster import uniform
from gpusched.sim.replay import SimPolicy, simulate
from gpusched.sim.traces import TraceJob

JOBS = [TraceJob(i, float(i // 3), float(5 + i % 7), 10 + i % 5, 1 + i % 6, cpus=4 * (i % 2),
                 mem_mb=100 * (i % 3)) for i in range(1, 150)]


@pytest.mark.parametrize("backfill", ["none", "easy", "conservative"])
@pytest.mark.parametrize("kill", [True, False])
def test_a_replay_leaves_no_cycles_behind(backfill: str, kill: bool) -> None:
    # The process may hold frozen objects of its own, which a replay leaves frozen
    # together with its own: start from none.
    gc.unfreeze()
    gc.collect()
    gc.disable()
    try:
        result = simulate(JOBS, uniform(3, 4), SimPolicy(backfill=backfill, kill=kill))
        left = gc.collect()
    finally:
        gc.enable()
    assert len(result.records) == len(JOBS) and result.passes > 10
    assert left == 0
    assert not gc.get_freeze_count()  # what the replay froze is thawed again
