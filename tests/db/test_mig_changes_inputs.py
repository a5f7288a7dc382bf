"""Dynamic MIG's inputs: the partition settings (parsed, bounded, applied, read by the
admin cache) and the ``mig`` command's payload (typed and bounded both ways)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gpusched.adminconfig import load_admin_config, parse_admin_config
from gpusched.db.admin import apply_config
from gpusched.db.admincache import load_admin_tables
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.models import Partition
from gpusched.errors import ConfigError, UsageError
from gpusched.messages.mig import MigCommand, MigLayout

ETC = Path(__file__).resolve().parents[2] / "etc"


def _config(**gpu: object) -> object:
    return parse_admin_config([("p.toml", {"partition": [
        {"name": "gpu", "default": True, **gpu}, {"name": "other", "nodes": "n9"}]})])


@pytest.mark.parametrize(("values", "needle"), [
    ({"dynamic_mig": "yes"}, "partition[0].dynamic_mig: expected true or false"),
    ({"dynamic_mig": 1}, "partition[0].dynamic_mig: expected true or false"),
    ({"mig_min_interval": 600}, "partition[0].mig_min_interval: expected a time from '1:00'"),
    ({"mig_min_interval": "0:59"}, "partition[0].mig_min_interval: expected a time from"),
    ({"mig_min_interval": "7-00:00:01"}, "partition[0].mig_min_interval: expected a time"),
    ({"mig_min_interval": "UNLIMITED"}, "partition[0].mig_min_interval: expected a time"),
    ({"mig_min_interval": "ten"}, "partition[0].mig_min_interval: expected a time"),
    ({"mig_interval": "10:00"}, "partition[0].mig_interval: unknown key"),
])
def test_bad_settings_are_refused_with_the_field(values: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as refused:
        _config(**values)
    assert needle in str(refused.value)


def test_settings_default_and_bounds() -> None:
    parts = {p.name: p for p in _config(dynamic_mig=True).partitions}  # type: ignore[attr-defined]
    assert (parts["gpu"].dynamic_mig, parts["gpu"].mig_min_interval) == (True, 600)
    assert (parts["other"].dynamic_mig, parts["other"].mig_min_interval) == (False, 600)
    for text, seconds in (("1:00", 60), ("10:00", 600), ("2:00:00", 7200),
                          ("7-00:00:00", 7 * 86400)):
        (gpu, _) = _config(mig_min_interval=text).partitions  # type: ignore[attr-defined]
        assert gpu.mig_min_interval == seconds
    shipped = {p.name: p for p in load_admin_config([ETC / "partitions.toml"]).partitions or ()}
    assert (shipped["gpu"].dynamic_mig, shipped["gpu"].mig_min_interval) == (False, 600)


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url, pool_size=2)
    yield make_sessionmaker(engine)
    engine.dispose()


def _apply(sessions: sessionmaker[Session], config: object) -> list[str]:
    with sessions() as s, s.begin():
        return apply_config(s, config)  # type: ignore[arg-type]


def test_applied_changed_and_read_by_the_admin_cache(sessions: sessionmaker[Session]) -> None:
    first = _apply(sessions, _config())
    assert not any("dynamic_mig" in line or "mig_min_interval" in line for line in first)
    assert _apply(sessions, _config(dynamic_mig=True, mig_min_interval="30:00")) == [
        "~ partition gpu: dynamic_mig False -> True; mig_min_interval 10:00 -> 30:00"]
    assert _apply(sessions, _config(dynamic_mig=True, mig_min_interval="30:00")) == []
    with sessions() as s:
        stored = {p.name: (p.dynamic_mig, p.mig_min_interval)
                  for p in s.scalars(select(Partition))}
        assert stored == {"gpu": (True, 1800), "other": (False, 600)}
        assert dict(load_admin_tables(s).dynamic_mig) == {"gpu": 1800}
    assert _apply(sessions, _config()) == [
        "~ partition gpu: dynamic_mig True -> False; mig_min_interval 30:00 -> 10:00"]
    with sessions() as s:
        assert dict(load_admin_tables(s).dynamic_mig) == {}
    # The database keeps the bound too.
    with pytest.raises(IntegrityError, match="ck_partitions_mig_min_interval"):
        with sessions() as s, s.begin():
            s.add(Partition(name="bad", mig_min_interval=59))


def test_the_payload_is_typed_and_bounded() -> None:
    layout = MigLayout("GPU-5a0b7c1d-0000-4000-8000-00000000a100", ("3g.40gb", "1g.10gb"))
    assert MigLayout.parse(layout.to_json()) == layout
    command = MigCommand("n1", 7, layout)
    assert MigCommand.parse(command.to_json()) == command
    assert MigCommand.parse({**command.to_json(), "job_id": 0}) == command
    bad = [
        ({"gpu_uuid": "MIG-1", "layout": ["1g.10gb"]}, "gpu_uuid: expected a GPU UUID"),
        ({"gpu_uuid": "GPU-" + "a" * 125, "layout": ["1g.10gb"]}, "gpu_uuid"),
        ({"gpu_uuid": "GPU-1", "layout": []}, "layout: expected 1 to 7 MIG profile names"),
        ({"gpu_uuid": "GPU-1", "layout": ["1g.10gb"] * 8}, "layout: expected 1 to 7"),
        ({"gpu_uuid": "GPU-1", "layout": "1g.10gb"}, "layout: expected a list"),
        ({"gpu_uuid": "GPU-1", "layout": ["a100"]}, "layout: expected MIG profile names"),
        ({"gpu_uuid": "GPU-1", "layout": [7]}, "layout: expected MIG profile names"),
        ({"gpu_uuid": "GPU-1"}, "layout: expected a list of MIG profile names, got nothing"),
        ({"layout": ["1g.10gb"]}, "gpu_uuid: expected a GPU UUID (GPU-...), got nothing"),
        ({"gpu_uuid": "GPU-1", "layout": ["1g.10gb"], "force": True}, "unknown field 'force'"),
    ]
    for payload, needle in bad:
        with pytest.raises(UsageError) as refused:
            MigLayout.parse(payload)
        assert needle in refused.value.message, payload
    for envelope, needle in [
            ({**command.to_json(), "job_id": 3}, "job_id: a MIG command is for no job"),
            ({**command.to_json(), "run": True}, "run: a MIG command is for no job"),
            ({**command.to_json(), "kind": "launch"}, "kind: expected 'mig'"),
            ({**command.to_json(), "seq": 0}, "seq"),
            ({**command.to_json(), "extra": 1}, "unknown field 'extra'")]:
        with pytest.raises(UsageError) as refused:
            MigCommand.parse(envelope)
        assert needle in refused.value.message, envelope
