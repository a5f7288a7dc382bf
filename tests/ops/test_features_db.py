"""Node features against a real PostgreSQL: ``gpusched admin apply`` stores the
[[node]] tables (the complete set, host lists expanded); a node registers its GPUs'
features; the snapshot carries every node's features (both kinds) and each pending
job's constraint (array tasks and the accounting records keep it); a submission whose constraint no node of its
partition could satisfy is refused and stores nothing; the node listing shows them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gpusched.adminconfig import parse_admin_config
from gpusched.core.model import Policy
from gpusched.core.plan import plan
from gpusched.db import agents, jobs, submit
from gpusched.db.accounting import job_records
from gpusched.db.admin import apply_config, plan_changes
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.features import node_features
from gpusched.db.models import Job, NodeFeatures, Partition
from gpusched.db.nodes import node_listing
from gpusched.db.schedule import apply_plan, load_snapshot
from gpusched.errors import ConfigError, UsageError

ALICE = jobs.Identity(1000, 1000)
BODY = {"script": "#!/bin/sh\n", "work_dir": "/tmp", "gpus": 1}
L4 = {"index": 0, "uuid": "GPU-l4-0", "type": "l4", "memory_mb": 23034}


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    e = make_engine(db_url, pool_size=2)
    yield e
    e.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    made = make_sessionmaker(engine)
    with made() as s, s.begin():
        s.add(Partition(name="gpu", nodes=["*"], is_default=True))
        s.add(Partition(name="small", nodes=["n1"]))
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": [L4],
                                 "features": ["l4", "gpumem24g"]})
        agents.register_node(s, {"node": "n2", "uid": 0, "gpus": [
            {**L4, "uuid": "GPU-h100-0", "type": "h100-80gb", "memory_mb": 81559}],
            "features": ["h100", "h100-80gb", "gpumem80g", "sm_90"]})
    return made


def nodes(*tables: dict[str, Any]) -> Any:
    return parse_admin_config([("nodes.toml", {"node": list(tables)})])


def test_apply_stores_the_complete_set_and_shows_the_changes(
        sessions: sessionmaker[Session]) -> None:
    config = nodes({"name": "n[1-2]", "features": ["rack1", "ib"]}, {"name": "n9", "features": []})
    with sessions() as s, s.begin():
        assert plan_changes(s, config) == ["+ node n1 (features [ib,rack1])",
                                           "+ node n2 (features [ib,rack1])", "+ node n9"]
        apply_config(s, config)
    with sessions() as s, s.begin():
        assert plan_changes(s, nodes({"name": "n1", "features": ["rack2"]})) == [
            "~ node n1: features [ib,rack1] -> [rack2]", "- node n2", "- node n9"]
        apply_config(s, nodes({"name": "n1", "features": ["rack2"]}))
        assert {f.node: f.features for f in s.scalars(select(NodeFeatures))} == {"n1": ["rack2"]}
        assert node_features(s)["n1"] == (["gpumem24g", "l4"], ["rack2"])  # sorted
        listed = {n["name"]: n["features"] for n in node_listing(s)}
    assert listed == {"n1": ["gpumem24g", "l4", "rack2"],
                      "n2": ["gpumem80g", "h100", "h100-80gb", "sm_90"]}


@pytest.mark.parametrize(("table", "says"), [
    ({"name": "n1", "features": ["a b"]}, "not a feature name"),
    ({"name": "n1", "features": "a"}, "expected a list"),
    ({"name": "n[1-", "features": []}, "host list"),
    ({"features": ["a"]}, "node name"),
    ({"name": "n1", "features": ["a"], "weight": 1}, "weight"),
])
def test_bad_node_tables_are_refused(table: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        nodes(table)
    with pytest.raises(ConfigError, match="declared twice"):
        nodes({"name": "n[1-2]", "features": []}, {"name": "n2", "features": ["x"]})


def test_registration_checks_the_features() -> None:
    with pytest.raises(UsageError, match="not a feature name"):
        agents.register_node(None, {"node": "n1", "uid": 0, "gpus": [],  # type: ignore[arg-type]
                                    "features": ["bad name"]})


def test_the_snapshot_carries_features_and_constraints(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        apply_config(s, nodes({"name": "n2", "features": ["nvlink"]}))
    with sessions() as s, s.begin():
        wanted = submit.submit_job(s, {**BODY, "constraint": "h100 & (nvlink|ib)"}, ALICE).id
        plain = submit.submit_job(s, {**BODY, "gpus": 0}, ALICE).id
        array = submit.submit_job(s, {**BODY, "constraint": "l4", "array": "0-1"}, ALICE).id
    with sessions() as s, s.begin():
        assert s.get(Job, wanted).constraints == "h100&(nvlink|ib)"  # type: ignore[union-attr]
        snapshot, _ = load_snapshot(s)
    features = {n.name: n.features for n in snapshot.nodes}
    assert features == {"n1": {"l4", "gpumem24g"},
                        "n2": {"h100", "h100-80gb", "gpumem80g", "sm_90", "nvlink"}}
    asked = {job.job_id: job.constraint for job in snapshot.pending}
    assert asked == {wanted: "h100&(nvlink|ib)", plain: None, array: "l4"}
    # The pass starts the constrained jobs on their nodes; array tasks keep the text.
    decided = plan(snapshot, time.time(), Policy())
    started = {start.job_id: start.node for start in decided.starts}
    assert started[wanted] == "n2" and started[array] == "n1"
    with sessions() as s, s.begin():
        again, node_ids = load_snapshot(s)
        apply_plan(s, again, decided, node_ids)
    with sessions() as s:
        tasks = s.execute(select(Job.array_task_id, Job.constraints)
                          .where(Job.array_job_id == array)).all()
        records = {r["job_id"]: r for r in job_records(s)}
    assert {c for _, c in tasks} == {"l4"}
    assert records[wanted]["constraint"] == "h100&(nvlink|ib)"  # gacct -o Constraints


@pytest.mark.parametrize(("body", "says"), [
    ({"constraint": "v100"}, "no a node of partition gpu satisfy it (features there: "
                             "gpumem24g, gpumem80g, h100, h100-80gb, l4, sm_90)"),
    ({"constraint": "h100", "partition": "small"}, "partition small"),
    ({"constraint": "[l4*2]", "nodes": 2, "gpus": 2}, "no 2 nodes of partition gpu"),
    ({"constraint": "h100", "nodelist": ["n1"]}, "satisfy it"),
    ({"constraint": "a,b"}, "not ','"),
    ({"constraint": "l4*2"}, "its counts name 2 nodes, the job has 1"),
    ({"constraint": "[l4*1&h100*1]", "nodes": 2, "gpus": 2, "exclusive": True},
     "not taken with --exclusive"),
])
def test_a_refused_submission_stores_nothing(sessions: sessionmaker[Session],
                                             body: dict[str, Any], says: str) -> None:
    with sessions() as s, s.begin():
        with pytest.raises(UsageError) as err:
            submit.submit_job(s, {**BODY, **body}, ALICE)
    assert says in err.value.message.replace("no 1 node", "no a node")
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 0


def test_a_node_configured_but_not_registered_counts(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        apply_config(s, nodes({"name": "n7", "features": ["a100"]}))
    with sessions() as s, s.begin():
        job = submit.submit_job(s, {**BODY, "constraint": "a100"}, ALICE).id
        snapshot, _ = load_snapshot(s)
    assert next(j for j in snapshot.pending if j.job_id == job).constraint == "a100"


def test_the_database_holds_the_bounds(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        submit.submit_job(s, BODY, ALICE)
    with pytest.raises(IntegrityError):
        with sessions() as s, s.begin():
            s.execute(text("UPDATE jobs SET constraints = repeat('a', 1025)"))
