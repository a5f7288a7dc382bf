"""A differential property test of licenses: for random cluster counts, running jobs and
queues, the pass (and its LicenseTracker alone) decide as a deliberately simple
reference that sums every held license again from scratch for each job; no plan ever
hands out more of a license than the cluster has; a job held for licenses could not
have them beside what runs, starts and is kept for reservations."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.licenses import Licenses, LicenseTracker
from gpusched.core.model import (
    GpuView,
    NodeState,
    NodeView,
    PartitionView,
    PendingJob,
    Policy,
    Reason,
    RunningJob,
    Snapshot,
)
from gpusched.core.plan import plan, queue_order

NAMES = ("matlab", "ansys", "comsol")
NOW = 1_000.0

totals_st = st.dictionaries(st.sampled_from(NAMES), st.integers(0, 4), max_size=3)
asks_st = st.dictionaries(st.sampled_from((*NAMES, "gone")), st.integers(1, 3), max_size=2).map(
    lambda d: tuple(sorted(d.items())))


def reference_fits(asked: Licenses, totals: dict[str, int], holders: list[Licenses]) -> bool:
    """Whether ``asked`` fits beside everything ``holders`` hold, summed from scratch."""
    for name, count in asked:
        held = sum(c for licenses in holders for n, c in licenses if n == name)
        if held + count > totals.get(name, 0):
            return False
    return True


@given(totals_st, st.lists(asks_st, max_size=6),
       st.lists(st.tuples(st.booleans(), asks_st), max_size=30))
@settings(max_examples=300, deadline=None)
def test_tracker_equals_the_reference(totals: dict[str, int], running: list[Licenses],
                                      steps: list[tuple[bool, Licenses]]) -> None:
    tracker = LicenseTracker(totals, [RunningJob(i, "a", (), licenses=l)
                                      for i, l in enumerate(running)])
    holders = list(running)
    for take, asked in steps:
        assert tracker.fits(asked) == reference_fits(asked, totals, holders)
        if take:
            tracker.take(asked)
            holders.append(asked)


def _snapshot(totals: dict[str, int], running: list[Licenses], queue: list[Licenses],
              gpus: int) -> Snapshot:
    node = NodeView("a", NodeState.UP, tuple(GpuView(f"a-{i}", i) for i in range(gpus)))
    held = tuple(RunningJob(100 + i, "a", (), end_time=NOW + 60 * (i + 1), licenses=l)
                 for i, l in enumerate(running))
    pending = tuple(PendingJob(i + 1, "gpu", 1 + i % 2, 1000, float(i), time_limit=3600,
                               user=f"u{i % 3}", licenses=l) for i, l in enumerate(queue))
    return Snapshot((node,), (PartitionView("gpu", ("a",)),), pending, held, licenses=totals)


@given(totals_st, st.lists(asks_st, max_size=4), st.lists(asks_st, max_size=12))
@settings(max_examples=300, deadline=None)
def test_with_gpus_to_spare_the_pass_equals_the_reference(
        totals: dict[str, int], running: list[Licenses], queue: list[Licenses]) -> None:
    snap = _snapshot(totals, running, queue, gpus=64)
    result = plan(snap, NOW, Policy())
    holders = list(running)
    expected_starts, expected_waits = set(), {}
    for job in queue_order(snap, NOW, Policy()):
        if reference_fits(job.licenses, totals, holders):
            expected_starts.add(job.job_id)
            holders.append(job.licenses)
        else:
            expected_waits[job.job_id] = Reason.LICENSES
    assert {s.job_id for s in result.starts} == expected_starts
    assert {p.job_id: p.reason for p in result.pending} == expected_waits
    assert not result.reservations


@given(totals_st, st.lists(asks_st, max_size=4), st.lists(asks_st, max_size=12),
       st.integers(1, 6), st.sampled_from(["none", "easy", "conservative"]))
@settings(max_examples=300, deadline=None)
def test_no_plan_hands_out_more_than_the_cluster_has(
        totals: dict[str, int], running: list[Licenses], queue: list[Licenses], gpus: int,
        backfill: str) -> None:
    snap = _snapshot(totals, running, queue, gpus)
    result = plan(snap, NOW, Policy(backfill=backfill))
    before: Counter[str] = Counter()
    for licenses in running:
        before.update(dict(licenses))
    after = before.copy()
    by_id = {job.job_id: job for job in snap.pending}
    for decided in (*result.starts, *result.reservations):
        after.update(dict(by_id[decided.job_id].licenses))
    for name, count in after.items():
        # Starts and reservations add only where the count allows (running jobs may
        # already be over a total an administrator lowered: then nothing more of it is
        # handed out).
        assert count <= max(totals.get(name, 0), before[name])
        if before[name] >= totals.get(name, 0):
            assert count == before[name]
    # A job held for its licenses is one that would not fit beside what runs, starts
    # and is kept for reservations; a reservation's licenses fit beside what runs.
    started = [by_id[s.job_id].licenses for s in result.starts]
    reserved = [by_id[r.job_id].licenses for r in result.reservations]
    for wait in result.pending:
        if wait.reason is Reason.LICENSES:
            assert not reference_fits(by_id[wait.job_id].licenses, totals,
                                      [*running, *started, *reserved])
    for kept in reserved:
        assert reference_fits(kept, totals, list(running))
