"""Advance reservations in the pass: jobs outside one never start where they would run
into it (ReqNodeNotAvail), jobs in one run only on what it holds while it lasts (or wait
with reason Reservation), GPU-count holds, MAINT, FLEX, DAILY repeats; --explain."""

from __future__ import annotations

import pytest

from gpusched.core.explain import explain
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
from gpusched.core.plan import plan
from gpusched.core.reservations import (
    DAY,
    AdvanceReservation,
    ReservationError,
    active,
    check_flags,
    check_name,
    check_names,
    check_window,
    held_at,
    may_use,
    next_occurrence,
    pick_holds,
    state_of,
)

NOW = 1_000_000.0
HOUR = 3600.0


def _node(name: str, gpus: int = 4) -> NodeView:
    return NodeView(name, NodeState.UP, tuple(GpuView(f"{name}-g{i}", i) for i in range(gpus)),
                    cpus=32, memory_mb=64_000)


def _job(job_id: int, gpus: int = 1, limit: int | None = 3600, resv: str | None = None,
         user: str = "alice", nodes: int = 1, account: str | None = "research") -> PendingJob:
    return PendingJob(job_id, "gpu", gpus, 1000, NOW - 100 + job_id, limit, user=user,
                      account=account, reservation=resv, nodes=nodes)


def _snap(pending: tuple[PendingJob, ...], resvs: tuple[AdvanceReservation, ...],
          running: tuple[RunningJob, ...] = (), nodes: int = 2) -> Snapshot:
    views = tuple(_node(f"n{i}") for i in range(1, nodes + 1))
    return Snapshot(views, (PartitionView("gpu", tuple(v.name for v in views)),), pending,
                    running=running, advance_reservations=resvs)


def _resv(name: str = "r1", start: float = NOW + HOUR, length: float = 2 * HOUR,
          holds: tuple[tuple[str, int], ...] = (("n1", 0),), users: tuple[str, ...] = ("alice",),
          flags: tuple[str, ...] = ()) -> AdvanceReservation:
    return AdvanceReservation(name, start, start + length, holds, users, (), frozenset(flags))


def _where(decided: object, job_id: int) -> set[str]:
    return {n for s in decided.starts if s.job_id == job_id  # type: ignore[attr-defined]
            for n in (s.nodes or (s.node,))}


def _reason(decided: object, job_id: int) -> Reason:
    return next(p.reason for p in decided.pending if p.job_id == job_id)  # type: ignore[attr-defined]


def test_a_job_that_would_run_into_a_reservation_goes_elsewhere_or_waits() -> None:
    resv = _resv()
    # Two hours: would run into r1 on n1 (from in an hour), so it starts on n2.
    decided = plan(_snap((_job(1, 4, 2 * 3600),), (resv,)), NOW, Policy())
    assert _where(decided, 1) == {"n2"}
    # With n2 full, it waits: room on n1 now, only the reservation keeps it off.
    busy = RunningJob(9, "n2", tuple(f"n2-g{i}" for i in range(4)), end_time=NOW + 10 * HOUR)
    decided = plan(_snap((_job(1, 4, 2 * 3600),), (resv,), (busy,)), NOW, Policy())
    assert not decided.starts and _reason(decided, 1) is Reason.REQ_NODE_NOT_AVAIL
    # One that ends before the reservation begins backfills onto n1.
    decided = plan(_snap((_job(1, 4, 2 * 3600), _job(2, 4, 1800)), (resv,), (busy,)),
                   NOW, Policy())
    assert _where(decided, 2) == {"n1"}
    # After the reservation: an hour-long job on n1 waits till its end (expected start).
    decided = plan(_snap((_job(3, 4, 3600),), (_resv(start=NOW + 600),), (busy,)), NOW,
                   Policy())
    assert not decided.starts
    assert decided.pending[0].expected_start == pytest.approx(NOW + 600 + 2 * HOUR)


def test_a_job_in_a_reservation_runs_only_on_it_and_only_while_it_lasts() -> None:
    resv = _resv(start=NOW - 60)
    decided = plan(_snap((_job(1, 2, 1800, "r1"), _job(2, 4, 1800, "r1")), (resv,)), NOW,
                   Policy())
    # One fits on n1 at a time (the bigger goes first); never on n2, which is free.
    assert len(decided.starts) == 1 and decided.starts[0].node == "n1"
    assert decided.pending[0].reason in (Reason.RESOURCES, Reason.PRIORITY)
    # Not begun yet: it waits with reason Reservation, expected at the start.
    later = _resv(start=NOW + HOUR)
    decided = plan(_snap((_job(1, 1, 1800, "r1"),), (later,)), NOW, Policy())
    assert not decided.starts and _reason(decided, 1) is Reason.RESERVATION
    assert decided.pending[0].expected_start == later.start
    # A time limit past the reservation's end (or none) is cut to end there, in whole
    # minutes (Slurm ends it then); with less than a minute left it waits.
    decided = plan(_snap((_job(1, 1, 3 * 3600, "r1"), _job(2, 1, None, "r1")), (resv,)),
                   NOW, Policy())
    assert {s.job_id: s.time_limit for s in decided.starts} == {1: 7140, 2: 7140}
    ending = _resv(start=NOW - 2 * HOUR + 30)
    snap = _snap((_job(1, 1, 600, "r1"),), (ending,))
    decided = plan(snap, NOW, Policy())
    assert not decided.starts and _reason(decided, 1) is Reason.RESERVATION
    assert "less than a minute" in explain(snap, NOW, Policy(), 1).blockers[0].detail
    short = plan(_snap((_job(1, 1, 600, "r1"),), (resv,)), NOW, Policy())
    assert short.starts[0].time_limit is None  # a limit that fits is left as it is
    # Another user, or a reservation that is gone: it waits, never started elsewhere.
    decided = plan(_snap((_job(1, 1, 1800, "r1", user="bob"), _job(2, 1, 1800, "gone")),
                         (resv,)), NOW, Policy())
    assert not decided.starts
    assert {p.reason for p in decided.pending} == {Reason.RESERVATION}


def test_jobs_outside_keep_off_an_active_reservation_and_its_jobs_count() -> None:
    resv = _resv(start=NOW - 60)
    jobs = (_job(1, 4, 600, "r1"), _job(2, 4, 600), _job(3, 4, 600))
    decided = plan(_snap(jobs, (resv,)), NOW, Policy())
    assert _where(decided, 1) == {"n1"} and _where(decided, 2) == {"n2"}
    assert 3 not in {s.job_id for s in decided.starts}


def test_a_gpu_count_reservation_holds_that_many_gpus_and_its_jobs_use_them() -> None:
    resv = _resv(start=NOW - 60, holds=(("n1", 2),))
    # Two GPUs of n1 are left to others; a 3-GPU job outside goes to n2.
    decided = plan(_snap((_job(1, 2, 600), _job(2, 3, 600)), (resv,)), NOW, Policy())
    assert _where(decided, 1) == {"n1"} and _where(decided, 2) == {"n2"}
    # Inside: 2 GPUs at most on n1; one already running in it leaves one.
    mine = RunningJob(7, "n1", ("n1-g0",), user="alice", end_time=NOW + 600,
                      reservation="r1")
    decided = plan(_snap((_job(1, 2, 600, "r1"), _job(2, 1, 600, "r1"), _job(3, 2, 600)),
                         (resv,), (mine,), nodes=1), NOW, Policy())
    assert not _where(decided, 1) and _where(decided, 2) == {"n1"}
    started = {u for s in decided.starts for u in s.gpu_uuids}
    assert len(started) == 3 and "n1-g0" not in started  # 1 in it, 2 for others
    assert 3 in {s.job_id for s in decided.starts}


def test_flex_jobs_may_run_outside_and_maint_blocks_everyone() -> None:
    flex = _resv(start=NOW + HOUR, flags=("FLEX",))
    decided = plan(_snap((_job(1, 1, 600, "r1"),), (flex,)), NOW, Policy())
    assert decided.starts  # before it begins, anywhere it fits
    maint = _resv(start=NOW + 60, holds=(("n1", 0), ("n2", 0)), users=("root",),
                  flags=("MAINT",))
    decided = plan(_snap((_job(1, 1, 600), _job(2, 1, 30)), (maint,)), NOW, Policy())
    assert _reason(decided, 1) is Reason.REQ_NODE_NOT_AVAIL
    assert 2 in {s.job_id for s in decided.starts}  # ends before it: drained around it
    # A job that asks for no GPU, CPU or memory fits anywhere, and still keeps off it.
    decided = plan(_snap((_job(3, 0, 600), _job(4, 0, 30)), (maint,)), NOW, Policy())
    assert _reason(decided, 3) is Reason.REQ_NODE_NOT_AVAIL
    assert 4 in {s.job_id for s in decided.starts}


def test_daily_repeats_and_explain_says_which() -> None:
    daily = _resv(start=NOW - DAY + HOUR, length=2 * HOUR, flags=("DAILY",))
    assert active(daily, NOW) is None and next_occurrence(daily, NOW) == (NOW + HOUR,
                                                                          NOW + 3 * HOUR)
    assert held_at(daily, NOW + 2 * HOUR) == {"n1": 0} and not held_at(daily, NOW)
    assert state_of(daily, NOW + 2 * HOUR + DAY) == "ACTIVE"
    busy = RunningJob(9, "n2", tuple(f"n2-g{i}" for i in range(4)), end_time=NOW + 10 * DAY)
    snap = _snap((_job(1, 1, 2 * 3600), _job(2, 1, 1800, "r1")), (daily,), (busy,))
    decided = plan(snap, NOW, Policy())
    assert _reason(decided, 1) is Reason.REQ_NODE_NOT_AVAIL
    text = " ".join(b.detail for b in explain(snap, NOW, Policy(), 1).blockers)
    assert "reservation r1" in text and "n1" in text
    said = explain(snap, NOW, Policy(), 2)
    assert said.reason is Reason.RESERVATION
    assert [b.reason for b in said.blockers] == [Reason.RESERVATION]
    assert "begins" in said.blockers[0].detail


def test_who_may_use_a_reservation() -> None:
    both = AdvanceReservation("r", 0, 1, (("n1", 0),), ("alice",), ("physics",))
    assert may_use(both, "alice", "physics") and not may_use(both, "alice", "chem")
    assert not may_use(both, "bob", "physics")
    but = AdvanceReservation("r", 0, 1, (("n1", 0),), ("-bob",))
    assert may_use(but, "alice", None) and not may_use(but, "bob", None)
    assert not may_use(AdvanceReservation("r", 0, 1, (("n1", 0),)), "alice", None)


@pytest.mark.parametrize("call, words", [
    (lambda: check_name(""), "invalid reservation name"),
    (lambda: check_name("a b"), "invalid reservation name"),
    (lambda: check_name("x" * 65), "invalid reservation name"),
    (lambda: check_flags(["MAINT", "nope"]), "unknown reservation flag 'NOPE'"),
    (lambda: check_flags(["daily", "weekly"]), "cannot both"),
    (lambda: check_names("users", ["alice", "-bob"]), "not both"),
    (lambda: check_names("users", ["a;b"]), "invalid name"),
    (lambda: check_window(10, 10, None), "end after"),
    (lambda: check_window(0, 2 * DAY, DAY), "at most a day"),
    (lambda: pick_holds({"n1": 2}, {"n1": True}, 3, None), "only 2 GPU"),
    (lambda: pick_holds({"n1": 2}, {"n1": False}, None, 1), "only 0 node"),
])
def test_bad_reservations_are_refused_with_one_line(call: object, words: str) -> None:
    with pytest.raises(ReservationError, match=words):
        call()  # type: ignore[operator]


def test_gpu_counts_take_the_nodes_with_most_free_first() -> None:
    assert pick_holds({"n1": 1, "n2": 4, "n3": 3}, {}, 6, None) == (("n2", 4), ("n3", 2))
    assert pick_holds({"n1": 4, "n2": 4}, {"n1": False, "n2": True}, None, 1) == (("n2", 0),)
