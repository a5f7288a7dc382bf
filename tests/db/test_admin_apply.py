"""admin apply against a real database: the difference, the change, idempotence."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpusched.adminconfig import load_admin_config, parse_admin_config
from gpusched.db.admin import apply_config, plan_changes
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.models import Account, AccountUser, Partition, Qos

ETC = Path(__file__).resolve().parents[2] / "etc"


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url, pool_size=2)
    yield make_sessionmaker(engine)
    engine.dispose()


def _apply(sessions: sessionmaker[Session], config: object) -> list[str]:
    with sessions() as s, s.begin():
        return apply_config(s, config)  # type: ignore[arg-type]


def test_apply_the_examples_then_nothing_changes(sessions: sessionmaker[Session]) -> None:
    config = load_admin_config([ETC / "partitions.toml", ETC / "accounts.toml"])
    changes = _apply(sessions, config)
    assert "+ partition gpu (nodes [" in changes[0]
    assert ("+ account physics (parent root, shares 60, qos [normal,scavenger], default_qos "
            "normal)") in changes
    assert "+ user alice@theory (shares 1, is_default True, max_submit_jobs 1000)" in changes
    assert "+ billing h100-80gb (weight 2.0)" in changes
    with sessions() as s:
        assert plan_changes(s, config) == []
        tree = {a.name: a.parent for a in s.scalars(select(Account))}
        assert tree == {"root": None, "physics": "root", "theory": "physics",
                        "experiment": "physics", "bio": "root"}
        assert {(u.user_name, u.account, u.is_default) for u in s.scalars(select(AccountUser))} == {
            ("alice", "theory", True), ("alice", "experiment", False), ("bob", "bio", True)}
        gpu = s.get(Partition, "gpu")
        assert gpu is not None and (gpu.max_time, gpu.priority_tier, gpu.max_gpus_per_job) == (
            172800, 1, 8)
    assert _apply(sessions, config) == []


def test_changes_removals_and_inactive_partitions(sessions: sessionmaker[Session]) -> None:
    _apply(sessions, load_admin_config([ETC / "partitions.toml", ETC / "accounts.toml"]))
    smaller = parse_admin_config([("new.toml", {
        "partition": [{"name": "gpu", "nodes": "gpu[01-16]", "default": True,
                       "max_time": "1-00:00:00", "default_time": "4:00:00", "priority_tier": 1,
                       "max_gpus_per_job": 8}],
        "account": [{"name": "physics", "shares": 60}],
        "qos": [{"name": "normal", "priority": 20}],
    })])
    with sessions() as s:
        planned = plan_changes(s, smaller)
    assert "~ partition gpu: max_time 2-00:00:00 -> 1-00:00:00" in planned
    assert "~ partition debug: state -> INACTIVE" in planned
    assert {"- account theory", "- account experiment", "- account bio"} <= set(planned)
    assert {"- user alice@theory", "- user bob@bio"} <= set(planned)
    assert "- qos scavenger" in planned
    assert any(line.startswith("~ qos normal: priority 10 -> 20") for line in planned)
    assert _apply(sessions, smaller) == planned
    with sessions() as s:
        debug = s.get(Partition, "debug")
        assert debug is not None and debug.state == "INACTIVE"
        assert [q.name for q in s.scalars(select(Qos))] == ["normal"]
        assert {a.name for a in s.scalars(select(Account))} == {"root", "physics"}
        # users went with the accounts they referred to; no user table was given
        assert list(s.scalars(select(AccountUser))) == []


def test_accounts_alone_keep_the_users_of_remaining_accounts(sessions: sessionmaker[Session]) -> None:
    _apply(sessions, load_admin_config([ETC / "accounts.toml"]))
    only_bio = parse_admin_config([("a.toml", {"account": [{"name": "bio", "shares": 40}]})])
    changes = _apply(sessions, only_bio)
    assert "- user alice@theory" in changes and "- user bob@bio" not in changes
    with sessions() as s:
        assert [(u.user_name, u.account) for u in s.scalars(select(AccountUser))] == [("bob", "bio")]


def _submit(sessions: sessionmaker[Session], user: str, **body: object) -> tuple[str | None, str | None]:
    from gpusched.db.jobs import Identity
    from gpusched.db.submit import submit_job

    with sessions() as s, s.begin():
        job = submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", **body},
                         Identity(1000, 1000, user))
        return job.account, job.qos


def test_jobs_charge_one_of_their_users_accounts_and_a_qos(sessions: sessionmaker[Session]) -> None:
    from gpusched.errors import UsageError

    _apply(sessions, load_admin_config([ETC / "partitions.toml"]))
    assert _submit(sessions, "alice") == (None, None)  # no accounts or QOS configured yet
    with pytest.raises(UsageError, match="no accounts are configured"):
        _submit(sessions, "alice", account="theory")
    _apply(sessions, load_admin_config([ETC / "accounts.toml"]))
    assert _submit(sessions, "alice") == ("theory", "normal")  # her default, the normal QOS
    assert _submit(sessions, "alice", account="experiment", qos="scavenger") == (
        "experiment", "scavenger")
    for body, needle in [
        ({"account": "bio"}, "may not charge account bio"),
        ({"partition": "debug"}, "partition debug does not allow account theory"),
        ({"qos": "gold"}, "invalid qos specification: gold"),
        ({"qos": "normal", "time_limit": 36 * 3600, "partition": "gpu"}, "MaxWall"),
    ]:
        with pytest.raises(UsageError, match=needle):
            _submit(sessions, "alice", **body)
    with pytest.raises(UsageError, match="carl has no account"):
        _submit(sessions, "carl")
    assert _submit(sessions, "bob", partition="debug") == ("bio", "normal")


def test_usage_accrues_from_running_jobs_and_feeds_the_snapshot(sessions: sessionmaker[Session]) -> None:
    from datetime import UTC, datetime, timedelta

    from gpusched.core.model import Plan, Start
    from gpusched.db import agents
    from gpusched.db.schedule import apply_plan, load_snapshot
    from gpusched.db.usage import accrue_usage

    _apply(sessions, load_admin_config([ETC / "partitions.toml", ETC / "accounts.toml"]))
    with sessions() as s, s.begin():
        agents.register_node(s, {"node": "gpu01", "uid": 0, "gpus": [
            {"index": i, "uuid": f"GPU-{i}"} for i in range(2)]})
    job_id = _submit_id(sessions, "alice", gpus=2)
    _submit_id(sessions, "bob", gpus=1)
    with sessions() as s, s.begin():
        snapshot, node_ids = load_snapshot(s)
        apply_plan(s, snapshot, Plan(starts=(Start(job_id, "gpu01", ("GPU-0", "GPU-1")),)), node_ids)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    with sessions() as s, s.begin():
        assert accrue_usage(s, start, half_life=0) == 1  # first sight: nothing billed yet
    with sessions() as s, s.begin():
        accrue_usage(s, start + timedelta(seconds=100), half_life=0)
    with sessions() as s:
        snapshot, _ = load_snapshot(s)
    assert snapshot.usage == {("alice", "theory"): 200.0}  # 2 GPUs x 100 s, billing weight 1
    assert {(p.user, p.account, p.qos) for p in snapshot.pending} == {("bob", "bio", "normal")}
    assert ("alice", "theory") in {(u.user, u.account) for u in snapshot.user_shares}
    assert snapshot.qos_priority == {"normal": 10, "scavenger": 0}
    assert {p.name: p.tier for p in snapshot.partitions} == {"gpu": 1, "debug": 2, "inference": 0}


def _submit_id(sessions: sessionmaker[Session], user: str, **body: object) -> int:
    from gpusched.db.jobs import Identity
    from gpusched.db.submit import submit_job

    with sessions() as s, s.begin():
        return submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp", **body},
                          Identity(1000, 1000, user)).id


def test_partition_sharing_is_applied_changed_and_read_by_the_admin_cache(
        sessions: sessionmaker[Session]) -> None:
    from gpusched.db.admincache import load_admin_tables
    from gpusched.errors import ConfigError

    def config(**inference: object) -> object:
        return parse_admin_config([("p.toml", {"partition": [
            {"name": "gpu", "nodes": "gpu[01-04]", "default": True},
            {"name": "inference", "nodes": "gpu[05-06]", **inference}]})])

    changes = _apply(sessions, config(sharing="mps"))
    assert "+ partition inference (nodes [gpu05,gpu06], is_default False, priority_tier 0, " \
           "state UP, requeue True, sharing mps, shares 100)" in changes
    assert _apply(sessions, config(sharing="mps")) == []
    assert _apply(sessions, config(sharing="shard", shares=8)) == [
        "~ partition inference: sharing mps -> shard; shares 100 -> 8"]
    with sessions() as s:
        stored = {p.name: (p.sharing, p.shares) for p in s.scalars(select(Partition))}
        assert stored == {"gpu": (None, None), "inference": ("shard", 8)}
        views = {p.name: (p.sharing, p.shares) for p in load_admin_tables(s).partitions}
        assert views == {"gpu": (None, 0), "inference": ("shard", 8)}
    # A node two partitions would share differently: refused before anything is applied.
    with pytest.raises(ConfigError, match="partitions 'inference' .* and 'more' .* would share "
                                          "the GPUs of node gpu06 differently"):
        parse_admin_config([("p.toml", {"partition": [
            {"name": "inference", "nodes": "gpu[05-06]", "sharing": "shard", "shares": 8},
            {"name": "more", "nodes": "gpu06", "sharing": "mps"}]})])
    assert _apply(sessions, config()) == [
        "~ partition inference: sharing shard -> None; shares 8 -> None"]
