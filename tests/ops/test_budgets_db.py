"""GPU-hour budgets against a real PostgreSQL: stored by ``admin apply`` (and bounded by
the database too), the usage of a period from the allocations (ended runs for the time
they held their GPUs, running runs until now, a share as its fraction, the period cut
at its UTC boundary, sub-accounts counted in their parents' budgets), the snapshot's
budgets, the balance and the per-period report. Every figure is worked out by hand."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gpusched.adminconfig import parse_admin_config
from gpusched.config import PartitionConfig
from gpusched.core.model import Plan, Start
from gpusched.db import agents, budgets, submit
from gpusched.db.admin import apply_config, plan_changes
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.jobs import Identity
from gpusched.db.models import Allocation, Job, Partition
from gpusched.db.partitions import sync_partitions
from gpusched.db.schedule import apply_plan, load_snapshot

NOW = datetime(2026, 11, 10, tzinfo=UTC)  # usage is read as of this time
NOV = datetime(2026, 11, 1, tzinfo=UTC)
HOUR = 3600.0
ALICE = Identity(1000, 1000, name="alice")
CONFIG = {
    "account": [{"name": "physics", "gpu_hours": 100, "gpu_hours_period": "month"},
                {"name": "theory", "parent": "physics"},
                {"name": "chem", "gpu_hours": 7.5}],
    "user": [{"name": "alice", "accounts": ["physics", "theory"],
              "gpu_hours": {"theory": 10}, "gpu_hours_period": "year"},
             {"name": "bob", "accounts": ["physics", "chem"]}],
}


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    """n1 with GPU-0..GPU-3; GPU-3 is shared by MPS in 100 units (partition mps)."""
    engine = make_engine(db_url, pool_size=2)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),
                            PartitionConfig("mps", nodes=("n1",))))
        s.execute(update(Partition).where(Partition.name == "mps")
                  .values(sharing="mps", shares=100))
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": [
            {"index": i, "uuid": f"GPU-{i}"} for i in range(4)]})
        apply_config(s, parse_admin_config([("budgets.toml", CONFIG)]))
    yield factory
    engine.dispose()


def run(sessions: sessionmaker[Session], user: str, account: str, uuids: tuple[str, ...],
        hours: tuple[float, float | None], share: int | None = None) -> int:
    """A job of ``user`` in ``account`` that held ``uuids`` (a share of ``share`` units of
    the first) from NOV + hours[0] to NOV + hours[1] (None: still running)."""
    body: dict[str, object] = {"gpus": len(uuids)}
    if share is not None:
        body = {"partition": "mps", "share_mode": "mps", "share": share}
    with sessions() as s, s.begin():
        job_id = submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", **body},
                                   ALICE).id
        s.execute(update(Job).where(Job.id == job_id).values(user_name=user, account=account))
    with sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        apply_plan(s, snapshot, Plan(starts=(Start(
            job_id, "n1", uuids, shares=() if share is None else ((uuids[0], share, 0),)),)),
            node_ids)
    begin = NOV + timedelta(hours=hours[0])
    end = None if hours[1] is None else NOV + timedelta(hours=hours[1])
    with sessions() as s, s.begin():
        s.execute(update(Allocation).where(Allocation.job_id == job_id)
                  .values(allocated_at=begin, released_at=end))
        s.execute(update(Job).where(Job.id == job_id).values(
            start_time=begin, end_time=end, time_limit=None,
            **({} if end is None else {"state": "COMPLETED", "exit_code": 0})))
    return job_id


def test_admin_apply_stores_budgets_and_shows_their_changes(
        sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        rows = dict(s.execute(text(
            "SELECT name, (gpu_hours, gpu_hours_period)::text FROM accounts")).all())
        users = dict(s.execute(text(
            "SELECT user_name || '@' || account, (gpu_hours, gpu_hours_period)::text "
            "FROM account_users")).all())
    assert rows == {"root": "(,none)", "physics": "(100,month)", "theory": "(,none)",
                    "chem": "(7.5,none)"}
    assert users == {"alice@physics": "(,year)", "alice@theory": "(10,year)",
                     "bob@physics": "(,none)", "bob@chem": "(,none)"}
    raised = {**CONFIG, "account": [{**CONFIG["account"][0], "gpu_hours": 250},
                                   *CONFIG["account"][1:]]}
    with sessions() as s, s.begin():
        changes = plan_changes(s, parse_admin_config([("raised.toml", raised)]))
    assert changes == ["~ account physics: gpu_hours 100.0 -> 250.0"]


def test_the_database_refuses_a_budget_out_of_bounds(sessions: sessionmaker[Session]) -> None:
    for change in ("gpu_hours = -1", "gpu_hours = 2e9", "gpu_hours_period = 'week'"):
        with sessions() as s, pytest.raises(IntegrityError), s.begin():
            s.execute(text(f"UPDATE accounts SET {change} WHERE name = 'physics'"))


def test_a_periods_usage_is_worked_out_from_the_allocations(
        sessions: sessionmaker[Session]) -> None:
    run(sessions, "alice", "physics", ("GPU-0", "GPU-1"), (-48, -47))  # October: not counted
    run(sessions, "alice", "physics", ("GPU-0",), (-2, 3))  # 3 h in November
    run(sessions, "bob", "theory", ("GPU-1",), (24, 26))  # a sub-account: 2 h
    run(sessions, "alice", "theory", ("GPU-2",), (200, None))  # running: until NOW, 16 h
    run(sessions, "alice", "physics", ("GPU-3",), (0, 8), share=25)  # a quarter: 2 h
    run(sessions, "bob", "chem", ("GPU-0",), (-100, -96))  # chem, no period: 4 h
    with sessions() as s:
        snapshot, _ = load_snapshot(s)
        found = {(b.account, b.user): (b.used_s / HOUR, b.period) for b in budgets.load_budgets(
            s, snapshot.accounts, NOW.timestamp())}
    assert found == {("physics", None): (pytest.approx(3 + 2 + 16 + 2), "month"),
                     ("chem", None): (pytest.approx(4), "none"),
                     ("theory", "alice"): (pytest.approx(16), "year")}


def test_the_report_shows_each_period_and_the_balance_what_callers_may_see(
        sessions: sessionmaker[Session]) -> None:
    run(sessions, "alice", "physics", ("GPU-0", "GPU-1"), (-48, -47))  # October: 2 h
    run(sessions, "bob", "theory", ("GPU-1",), (24, 26))  # November: 2 h
    with sessions() as s:
        rows = budgets.report(s, datetime(2026, 10, 15, tzinfo=UTC), NOW, NOW)
        snapshot, _ = load_snapshot(s)
    shown = [(r["account"], r["user"], r["period_start"], r["used_gpu_hours"]) for r in rows]
    assert shown == [("chem", None, None, 0.0),
                     ("physics", None, "2026-10-01T00:00:00+00:00", pytest.approx(2)),
                     ("physics", None, "2026-11-01T00:00:00+00:00", pytest.approx(2)),
                     ("theory", "alice", "2026-01-01T00:00:00+00:00", 0.0)]
    assert rows[1]["period_end"] == "2026-11-01T00:00:00+00:00"
    keys = {(r["account"], r["user"]) for r in budgets.balance(snapshot, None, None)}
    assert keys == {("physics", None), ("chem", None), ("theory", "alice")}
    assert {(r["account"], r["user"]) for r in budgets.balance(snapshot, "alice", None)} == {
        ("physics", None), ("theory", "alice")}
    assert {(r["account"], r["user"]) for r in budgets.balance(snapshot, "bob", "chem")} == {
        ("chem", None)}
    assert {(r["account"], r["user"]) for r in budgets.balance(snapshot, None, "theory")} == {
        ("physics", None), ("theory", "alice")}
    physics = next(r for r in budgets.balance(snapshot, None, "physics")
                   if r["user"] is None)
    assert physics["budget_gpu_hours"] == 100
    assert physics["used_gpu_hours"] + physics["left_gpu_hours"] == pytest.approx(100)


def test_the_usage_kept_between_passes_equals_a_fresh_read(
        sessions: sessionmaker[Session]) -> None:
    """A pass keeps each period's usage up to a settled minute and extends it; at every
    later moment (a run ending between them, hours passing) it equals a fresh read."""
    run(sessions, "alice", "physics", ("GPU-0",), (-2, 3))
    running = run(sessions, "bob", "theory", ("GPU-1",), (200, None))
    run(sessions, "alice", "theory", ("GPU-3",), (100, None), share=50)
    with sessions() as s:
        tree = load_snapshot(s)[0].accounts
    moments = [NOW.timestamp() + offset for offset in (0, 45, 130, 200, 3700, 30_000)]
    seen = []
    for i, at in enumerate(moments):
        if i == 3:  # bob's run ends 20 s before this moment, after the last settled one
            with sessions() as s, s.begin():
                s.execute(update(Allocation).where(Allocation.job_id == running).values(
                    released_at=datetime.fromtimestamp(at - 20, UTC)))
        with sessions() as s:
            kept = {(b.account, b.user): b.used_s for b in budgets.load_budgets(s, tree, at)}
            budgets._KEPT.entries.clear()
            fresh = {(b.account, b.user): b.used_s for b in budgets.load_budgets(s, tree, at)}
        assert kept == pytest.approx(fresh, abs=1e-6), (i, kept, fresh)
        seen.append(fresh[("physics", None)])
    # physics: alice's 3 h, bob's run from 08:00 on the 9th (16 h), alice's half GPU from
    # 04:00 on the 5th (116 h).
    assert seen[0] == pytest.approx((3 + 16 + 0.5 * 116) * HOUR)
    assert seen[3] - seen[2] == pytest.approx(0.5 * 70 + 50)
    assert seen[5] - seen[4] == pytest.approx(0.5 * (30_000 - 3700))
