"""Properties of advance reservations against simple references: a reservation's
occurrences are those a brute-force walk over its repeats finds; who may use one is the
textbook allow/deny rule; and for random clusters, reservations, running jobs and queues,
every plan keeps each reservation's windows (no job outside it started where it would
run into one, counting GPUs for GPU-count holds), starts a reservation's jobs only on
what it holds while it goes on and ending by its end, and never gives a GPU twice."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.model import (
    GpuView,
    NodeState,
    NodeView,
    PartitionView,
    PendingJob,
    Policy,
    RunningJob,
    Snapshot,
    Start,
)
from gpusched.core.plan import plan
from gpusched.core.reservations import (
    DAY,
    WEEK,
    AdvanceReservation,
    active,
    may_use,
    occurrences,
)

NOW = 10 * WEEK
NODES = ("n1", "n2", "n3")
GPUS = 4


def reference_occurrences(resv: AdvanceReservation, after: float, until: float
                          ) -> list[tuple[float, float]]:
    """Every repeat from the first, kept when it ends after ``after`` and starts before
    ``until`` (no arithmetic shortcut)."""
    period = resv.period
    found, k = [], 0
    while True:
        start = resv.start + k * (period or 0)
        if start >= until or (period is None and k > 0):
            return found
        if start + (resv.end - resv.start) > after:
            found.append((start, start + resv.end - resv.start))
        k += 1


@given(st.integers(0, 20 * DAY), st.integers(1, DAY), st.sampled_from(((), ("DAILY",),
                                                                       ("WEEKLY",))),
       st.integers(0, 30 * DAY), st.integers(0, 10 * DAY))
@settings(max_examples=300, deadline=None)
def test_occurrences_equal_the_brute_force_walk(start: int, length: int, flags: tuple[str, ...],
                                                 after: int, span: int) -> None:
    resv = AdvanceReservation("r", float(start), float(start + length), (("n1", 0),),
                              ("a",), (), frozenset(flags))
    until = float(after + span)
    assert list(occurrences(resv, float(after), until)) == reference_occurrences(
        resv, float(after), until)
    going = [w for w in reference_occurrences(resv, float(after), after + 1.0)
             if w[0] <= after < w[1]]
    assert active(resv, float(after)) == (going[0] if going else None)


names_st = st.lists(st.sampled_from(("alice", "bob", "carol")), max_size=2, unique=True)


@given(names_st, st.booleans(), names_st, st.booleans(), st.sampled_from(("alice", "bob")),
       st.sampled_from((None, "alice", "bob")))
@settings(max_examples=200, deadline=None)
def test_may_use_is_allow_and_deny(users: list[str], deny_users: bool, accounts: list[str],
                                   deny_accounts: bool, user: str, account: str | None) -> None:
    u = tuple(("-" if deny_users else "") + n for n in users)
    a = tuple(("-" if deny_accounts else "") + n for n in accounts)
    resv = AdvanceReservation("r", 0, 1, (("n1", 0),), u, a)

    def ok(listed: list[str], deny: bool, name: str | None) -> bool:
        if not listed:
            return True
        return (name not in listed) if deny else (name in listed)

    expected = bool(users or accounts) and ok(users, deny_users, user) and ok(
        accounts, deny_accounts, account)
    assert may_use(resv, user, account) is expected


resv_st = st.builds(
    lambda name, start, length, holds, flags: AdvanceReservation(
        name, NOW + start, NOW + start + length, holds, ("alice",), (), frozenset(flags)),
    st.sampled_from(("r1", "r2")), st.integers(-3600, 4 * 3600), st.integers(600, 4 * 3600),
    st.lists(st.tuples(st.sampled_from(NODES), st.integers(0, GPUS)), min_size=1, max_size=2,
             unique_by=lambda h: h[0]).map(lambda h: tuple(sorted(h))),
    st.sampled_from(((), ("FLEX",), ("DAILY",), ("MAINT",))))
job_st = st.tuples(st.integers(0, GPUS), st.sampled_from((600, 3600, 3 * 3600, None)),
                   st.sampled_from((None, None, "r1", "r2")), st.sampled_from(("alice", "bob")),
                   st.sampled_from((1, 1, 1, 2)))
run_st = st.tuples(st.sampled_from(NODES), st.integers(1, 2), st.integers(60, 6 * 3600),
                   st.sampled_from((None, "r1")))


def _intervals_overlap(a: float, b: float, c: float, d: float) -> bool:
    return a < d and c < b


@given(st.lists(resv_st, max_size=2, unique_by=lambda r: r.name), st.lists(run_st, max_size=4),
       st.lists(job_st, min_size=1, max_size=8), st.sampled_from(("easy", "conservative")))
@settings(max_examples=300, deadline=None)
def test_plans_keep_every_reservation(resvs: list[AdvanceReservation],
                                      runs: list[tuple[str, int, int, str | None]],
                                      jobs: list[tuple[int, int | None, str | None, str, int]],
                                      backfill: str) -> None:
    nodes = tuple(NodeView(n, NodeState.UP, tuple(GpuView(f"{n}-{i}", i) for i in range(GPUS)),
                           cpus=16, memory_mb=1000) for n in NODES)
    used: Counter[str] = Counter()
    running = []
    for i, (node, gpus, left, in_resv) in enumerate(runs):
        free = [f"{node}-{g}" for g in range(GPUS) if f"{node}-{g}" not in used][:gpus]
        used.update(free)
        if free:
            running.append(RunningJob(100 + i, node, tuple(free), user="alice",
                                      end_time=NOW + left, start_time=NOW - 60,
                                      reservation=in_resv))
    pending = tuple(PendingJob(i + 1, "p", gpus, 1000, NOW - 100 + i, limit, user=user,
                               reservation=resv, nodes=nodes)
                    for i, (gpus, limit, resv, user, nodes) in enumerate(jobs))
    snapshot = Snapshot(nodes, (PartitionView("p", NODES),), pending, running=tuple(running),
                        advance_reservations=tuple(resvs))
    decided = plan(snapshot, NOW, Policy(backfill=backfill))
    given_out = [u for s in decided.starts for u in s.gpu_uuids]
    assert len(given_out) == len(set(given_out)) and not set(given_out) & set(used)
    by_id = {j.job_id: j for j in pending}
    by_name = {r.name: r for r in resvs}
    def on(start: Start, node: str) -> int:
        return sum(1 for u in start.gpu_uuids if u.startswith(node + "-"))

    def check_node(start: Start, job: PendingJob, node: str, end: float) -> None:
        resv = by_name.get(job.reservation or "")
        inside = (resv is not None and may_use(resv, job.user, job.account)
                  and active(resv, NOW) is not None
                  and node in resv.nodes)
        if resv is not None and not resv.flex:
            window = active(resv, NOW)
            assert inside and window is not None and end <= window[1], (start, resv)
            held = dict(resv.holds)[node]
            if held:
                # The plan's starts in it take no more than its hold leaves beside what
                # already runs in it (which may be more than the hold: a hold made
                # smaller while its jobs run).
                started = sum(on(s, node) for s in decided.starts
                              if by_id[s.job_id].reservation == resv.name)
                ran = sum(len(r.gpu_uuids) for r in running if r.node == node
                          and r.reservation == resv.name)
                assert started <= max(0, held - ran), (started, held, ran)
        if inside:
            return  # runs on what its reservation holds
        # Outside every reservation: never into a whole-node window, and never more GPUs
        # than a GPU-count hold leaves (counting what runs there outside it).
        for other in resvs:
            held = dict(other.holds).get(node)
            if held is None:
                continue
            for w_start, w_end in occurrences(other, NOW, NOW + 6 * WEEK):
                if not _intervals_overlap(NOW, end, w_start, w_end):
                    continue
                assert held != 0, (start, other)
                at = max(NOW, w_start)
                outside = sum(on(s, node) for s in decided.starts
                              if by_id[s.job_id].reservation != other.name
                              and NOW + (s.time_limit or by_id[s.job_id].time_limit
                                         or float("inf")) > at)
                before = sum(len(r.gpu_uuids) for r in running if r.node == node
                             and r.reservation != other.name and (r.end_time or 0) > at)
                assert outside + before + held <= GPUS or before + held > GPUS, (start, other)

    for start in decided.starts:
        job = by_id[start.job_id]
        limit = start.time_limit if start.time_limit is not None else job.time_limit
        end = NOW + (limit if limit is not None else float("inf"))
        assert start.time_limit is None or (
            job.reservation in by_name and (job.time_limit is None
                                            or start.time_limit < job.time_limit))
        for node in start.nodes or (start.node,):
            check_node(start, job, node, end)
