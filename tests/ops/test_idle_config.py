"""The idle-GPU policy's settings: validated at load (file, key, what was expected),
stored by admin apply (and bounded by the database itself), and the pure rule that says
what is due for a job at a given time."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gpusched.adminconfig import AdminConfig, parse_admin_config
from gpusched.core.idle_policy import IdlePolicy, due, effective, policy_from
from gpusched.db.admin import apply_config, plan_changes
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.models import Partition, Qos
from gpusched.errors import ConfigError

GOOD = """
[[partition]]
name = "gpu"
idle_warn_after = "1:00:00"
idle_action = "requeue"
idle_action_after = "30:00"

[[partition]]
name = "debug"
idle_warn_after = "10:00"
idle_action = "WARN"

[[qos]]
name = "scavenger"
idle_warn_after = "0:30"
idle_action = "cancel"
idle_action_after = "0:10"

[[qos]]
name = "long"
idle_action = "off"
"""


def _parse(body: str) -> AdminConfig:
    return parse_admin_config([("idle.toml", tomllib.loads(body))])


def test_the_settings_load_into_seconds() -> None:
    config = _parse(GOOD)
    gpu, debug = config.partitions or ()
    scavenger, long = config.qos or ()
    assert (gpu.idle_warn_after, gpu.idle_action, gpu.idle_action_after) == (3600, "requeue", 1800)
    assert (debug.idle_warn_after, debug.idle_action, debug.idle_action_after) == (600, "warn", None)
    assert (scavenger.idle_warn_after, scavenger.idle_action_after) == (30, 10)
    assert (long.idle_action, long.idle_warn_after, long.idle_action_after) == ("off", None, None)


PARTITION = '[[partition]]\nname = "p"\n'
QOS = '[[qos]]\nname = "q"\n'


@pytest.mark.parametrize(("body", "message"), [
    (PARTITION + 'idle_action = "kill"\n',
     'partition[0].idle_action: expected one of "off", "warn", "requeue", "cancel", got \'kill\''),
    (PARTITION + 'idle_warn_after = "10:00"\n',
     "partition[0].idle_action: expected one of \"off\", \"warn\", \"requeue\", \"cancel\" "
     "(idle_warn_after and idle_action_after need it), got None"),
    (PARTITION + 'idle_action = "requeue"\nidle_action_after = "10:00"\n',
     'partition[0].idle_warn_after: expected a time (required with idle_action = "requeue"), '
     "got None"),
    (PARTITION + 'idle_action = "cancel"\nidle_warn_after = "10:00"\n',
     'partition[0].idle_action_after: expected a time (required with idle_action = "cancel"), '
     "got None"),
    (PARTITION + 'idle_action = "warn"\nidle_warn_after = "10:00"\nidle_action_after = "1:00"\n',
     'partition[0].idle_action_after: expected nothing with idle_action = "warn" (no action '
     "follows), got '1:00'"),
    (QOS + 'idle_action = "off"\nidle_warn_after = "10:00"\n',
     'qos[0].idle_warn_after: expected nothing with idle_action = "off" (it exempts from the '
     "policy), got '10:00'"),
    (QOS + 'idle_action = "warn"\nidle_warn_after = "30-00:00:01"\n',
     "qos[0].idle_warn_after: expected a time from '0:01' (a second) to '30-00:00:00' (30 days), "
     "such as '30:00', got '30-00:00:01'"),
    (QOS + 'idle_action = "warn"\nidle_warn_after = 600\n',
     "qos[0].idle_warn_after: expected a time from '0:01' (a second) to '30-00:00:00' (30 days), "
     "such as '30:00', got 600"),
    (QOS + 'idle_action = "cancel"\nidle_warn_after = "1:00"\nidle_action_after = "0:00"\n',
     "qos[0].idle_action_after: expected a time from '0:01'"),
    (QOS + 'idle_action = "cancel"\nidle_warn_after = "UNLIMITED"\nidle_action_after = "1"\n',
     "qos[0].idle_warn_after: expected a time from '0:01'"),
    (QOS + 'idle_action = 3\n', 'qos[0].idle_action: expected one of "off", "warn"'),
    (QOS + 'idle_actions = "warn"\n', "qos[0].idle_actions: unknown key"),
])
def test_bad_settings_are_refused_naming_file_and_key(body: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _parse(body)
    assert str(caught.value).startswith(f"idle.toml: {message}")


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url, pool_size=2)
    yield make_sessionmaker(engine)
    engine.dispose()


def test_apply_stores_the_policy_and_shows_the_change(sessions: sessionmaker[Session]) -> None:
    config = _parse(GOOD)
    with sessions() as s, s.begin():
        changes = apply_config(s, config)
    assert any(line.startswith("+ partition gpu (") and "idle_warn_after 1:00:00" in line
               and "idle_action requeue" in line and "idle_action_after 30:00" in line
               for line in changes), changes
    with sessions() as s:
        gpu = s.get(Partition, "gpu")
        assert gpu is not None
        assert (gpu.idle_warn_after, gpu.idle_action, gpu.idle_action_after) == (3600, "requeue", 1800)
        rows = {q.name: (q.idle_warn_after, q.idle_action, q.idle_action_after)
                for q in s.scalars(select(Qos))}
        assert rows == {"scavenger": (30, "cancel", 10), "long": (None, "off", None)}
    # Taking the policy away is a change like any other; applying it again changes nothing.
    without = _parse(GOOD.replace('idle_action = "requeue"\n', 'idle_action = "warn"\n')
                     .replace('idle_action_after = "30:00"\n', ""))
    with sessions() as s:
        assert plan_changes(s, without) == [
            "~ partition gpu: idle_action requeue -> warn; idle_action_after 30:00 -> none"]
    with sessions() as s, s.begin():
        apply_config(s, config)
    with sessions() as s:
        assert plan_changes(s, config) == []


@pytest.mark.parametrize("statement", [
    "UPDATE partitions SET idle_warn_after = 0",
    "UPDATE partitions SET idle_action_after = 2592001",
    "UPDATE qos SET idle_action = 'explode'",
    "UPDATE qos SET idle_warn_after = -5",
])
def test_the_database_keeps_the_bounds(sessions: sessionmaker[Session], statement: str) -> None:
    with sessions() as s, s.begin():
        apply_config(s, _parse(GOOD))
    with sessions() as s, pytest.raises(IntegrityError):
        s.execute(text(statement))


def test_the_qos_policy_wins_and_off_exempts() -> None:
    part = IdlePolicy("requeue", 60, 60, "partition gpu")
    qos = IdlePolicy("cancel", 30, 10, "QOS scavenger")
    off = IdlePolicy("off", source="QOS long")
    assert effective(part, None) is part and effective(part, qos) is qos
    assert effective(part, off) is None and effective(None, None) is None
    assert policy_from("partition gpu", None, None, None) is None
    assert policy_from("QOS q", "warn", 5, None) == IdlePolicy("warn", 5, None, "QOS q")


def test_what_is_due_when() -> None:
    policy = IdlePolicy("cancel", 60, 30, "partition gpu")
    start = datetime(2026, 11, 28, 4, 0, tzinfo=UTC)
    at = lambda s: start + timedelta(seconds=s)  # noqa: E731
    assert due(policy, None, None, at(500), 1.0) is None  # busy
    assert due(policy, start, None, at(59), 1.0) is None
    warn = due(policy, start, None, at(60), 1.0)
    assert warn is not None and warn.step == "warn"
    assert warn.message == ("its GPUs idle (at most 1% busy) for 1:00 (partition gpu idle "
                            "policy); it will be cancelled in 0:30 unless they are used")
    assert due(policy, start, at(60), at(89), 1.0) is None
    act = due(policy, start, at(60), at(90), 1.0)
    assert act is not None and act.step == "cancel"
    assert act.reason == ("GPUs idle (at most 1% busy) for 1:30, 0:30 after the warning "
                          "(partition gpu idle policy)")
    warn_only = IdlePolicy("warn", 60, None, "QOS q")
    assert due(warn_only, start, at(60), at(10_000), 1.0) is None  # warned; nothing follows
    assert due(None, start, None, at(10_000), 1.0) is None
