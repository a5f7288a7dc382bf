"""The chaos invariants checker: each rule named on a history that breaks it, and
silence on clean histories made by the real code paths (db functions, and a real
controller and agent running jobs)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import CursorResult, text
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.core.model import Plan, Preemption, Start
from gpusched.db import agents, health, jobs, node_failure, submit
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.partitions import sync_partitions
from gpusched.db.schedule import apply_plan, load_snapshot
from tests.chaos.invariants import Evidence, check
from tests.e2e.cluster import Cluster, wait_for

ALICE = jobs.Identity(1000, 1000, "alice")
ROOT = jobs.Identity(0, 0, "root")
GPUS = [{"index": 0, "uuid": "GPU-0"}, {"index": 1, "uuid": "GPU-1"},
        {"index": 2, "uuid": "GPU-2"},
        {"index": 3, "uuid": "MIG-2a", "parent": 2, "mig_profile": "1g.10gb"},
        {"index": 4, "uuid": "MIG-2b", "parent": 2, "mig_profile": "1g.10gb"}]


@dataclass
class Db:
    """A database with node ``n1`` (three GPUs, two MIG slices of the third), the
    records directory of its jobs' scripts, and the real operations of a cluster."""

    url: str
    sessions: sessionmaker[Session]
    records: Path
    deaths: list[tuple[str, float]] = field(default_factory=list)

    def submit(self, who: jobs.Identity = ALICE, **body: Any) -> int:
        with self.sessions() as s, s.begin():
            return submit.submit_job(s, {"script": "#!/bin/sh\n", "work_dir": "/tmp",
                                         "gpus": 1, **body}, who).id

    def start(self, job_id: int, *uuids: str, shares: tuple[tuple[str, int, int], ...] = (),
              script: bool = True) -> None:
        """Start ``job_id`` on ``uuids`` of n1 as a pass would, and (``script``) its
        script's run."""
        self.apply(Plan(starts=(Start(job_id, "n1", uuids, shares=shares),)))
        if script:
            self.write(job_id, self.run_of(job_id), f"start n1 {time.time()}")

    def apply(self, plan: Plan) -> None:
        with self.sessions() as s, s.begin():
            snapshot, node_ids = load_snapshot(s)
            apply_plan(s, snapshot, plan, node_ids)

    def end(self, job_id: int, outcome: str, code: int | None = None,
            wrote: bool = True) -> None:
        """The current run ends ``outcome`` with ``code``, which its script wrote (if
        ``wrote``), and the agent reports it."""
        run = self.run_of(job_id)
        if wrote and code is not None:
            self.write(job_id, run, f"end {code} {time.time()}")
        with self.sessions() as s, s.begin():
            assert agents.record_end(s, job_id, {"node": "n1", "outcome": outcome,
                                                 "exit_code": code, "run": run})

    def run_of(self, job_id: int) -> int:
        return int(self.sql("SELECT restarts FROM jobs WHERE id = :id", id=job_id)[0][0])

    def write(self, job_id: int, run: int, line: str) -> None:
        with open(self.records / f"{job_id}.{run}", "a") as record:
            record.write(line + "\n")

    def sql(self, statement: str, **params: Any) -> list[Any]:
        with self.sessions() as s, s.begin():
            result = cast(CursorResult[Any], s.execute(text(statement), params))
            return list(result) if result.returns_rows else []

    def gpu(self, uuid: str) -> int:
        return int(self.sql("SELECT id FROM gpus WHERE uuid = :u", u=uuid)[0][0])

    def check(self, finished: bool = True) -> list[str]:
        return check(Evidence(self.url, self.records, tuple(self.deaths), finished))


@pytest.fixture
def db(db_url: str, tmp_path: Path) -> Iterator[Db]:
    engine = make_engine(db_url, pool_size=2)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),))
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": GPUS})
    records = tmp_path / "records"
    records.mkdir()
    yield Db(db_url, factory, records)
    engine.dispose()


@dataclass(frozen=True)
class Jobs:
    """The jobs of the clean history."""

    done: int  # completed, exit 0
    requeued: int  # requeued by an admin, then failed with exit 3 on its second run
    held: int  # pending, held since its submission
    node_fail: int  # its node died after its script wrote its end: NODE_FAIL
    no_gpus: int  # completed without GPUs
    slice: int  # completed on a MIG slice


def clean_history(db: Db) -> Jobs:
    """A history the real code paths make: ends, an admin requeue, a node failure."""
    done = db.submit()
    db.start(done, "GPU-0")
    db.end(done, "completed", 0)
    requeued = db.submit()
    db.start(requeued, "GPU-0")
    with db.sessions() as s, s.begin():
        jobs.requeue_job(s, requeued, ROOT)
    db.end(requeued, "cancelled", wrote=False)  # its script was stopped: no end line
    db.start(requeued, "GPU-1")
    db.end(requeued, "failed", 3)
    held = db.submit(hold=True)
    node_fail = db.submit(requeue=False)
    db.start(node_fail, "GPU-0")
    db.write(node_fail, 0, f"end 0 {time.time()}")
    db.deaths.append(("n1", time.time()))
    db.sql("UPDATE nodes SET last_seen = now() - interval '1 hour'")
    with db.sessions() as s, s.begin():
        assert node_failure.fail_silent_nodes(s, 60.0).node_failed == [node_fail]
        agents.register_node(s, {"node": "n1", "uid": 0, "gpus": GPUS})
    no_gpus = db.submit(gpus=0)
    db.start(no_gpus)
    db.end(no_gpus, "completed", 0)
    on_slice = db.submit()
    db.start(on_slice, "MIG-2a")
    db.end(on_slice, "completed", 0)
    return Jobs(done, requeued, held, node_fail, no_gpus, on_slice)


def lines(problems: list[str], rule: str) -> list[str]:
    return [p for p in problems if p.startswith(f"[{rule}]")]


def test_a_clean_history_of_the_code_paths_breaks_no_rule(db: Db) -> None:
    made = clean_history(db)
    assert db.check() == []
    states = dict(db.sql("SELECT id, state FROM jobs"))
    assert (states[made.requeued], states[made.node_fail], states[made.held]) == \
        ("FAILED", "NODE_FAIL", "PENDING")
    assert db.run_of(made.requeued) == 1


def test_arrays_preemption_a_gpu_failure_and_shares_break_no_rule(db: Db) -> None:
    clean_history(db)
    db.sql("UPDATE partitions SET sharing = 'mps', shares = 4 WHERE name = 'gpu'")
    record = db.submit(array="0-1")
    db.apply(Plan(starts=(Start(record, "n1", ("GPU-0",), array_task_id=0),
                          Start(record, "n1", ("GPU-1",), array_task_id=1))))
    tasks = [row[0] for row in db.sql(
        "SELECT id FROM jobs WHERE array_job_id = :r ORDER BY array_task_id", r=record)]
    assert len(tasks) == 2 and tasks[1] == record  # the last task is the record itself
    for task in tasks:
        db.write(task, 0, f"start n1 {time.time()}")
        db.end(task, "completed", 0)
    victim, preemptor, failing, lost = db.submit(), db.submit(), db.submit(), db.submit()
    db.start(victim, "GPU-0")
    db.apply(Plan(preemptions=(Preemption(victim, preemptor, "requeue"),)))
    db.end(victim, "cancelled", wrote=False)
    db.start(preemptor, "GPU-0")
    db.end(preemptor, "completed", 0)
    db.start(failing, "GPU-1")
    with db.sessions() as s, s.begin():
        health.report_faults(s, "n1", {"faults": [{"uuid": "GPU-1", "reason": "Xid 79"}]})
    db.end(failing, "cancelled", wrote=False)
    with db.sessions() as s, s.begin():
        health.resume_gpu(s, "n1", 1)
    db.start(lost, "GPU-0", script=False)  # the agent lost its launch: nothing ran
    db.end(lost, "not_started", wrote=False)
    for job_id in (victim, failing, lost):
        db.start(job_id, "GPU-0")
        db.end(job_id, "completed", 0)
    shares = [db.submit(share_mode="mps", share=2) for _ in range(2)]
    for job_id in shares:
        db.start(job_id, "GPU-1", shares=(("GPU-1", 2, 0),))
    for job_id in shares:
        db.end(job_id, "completed", 0)
    assert db.check() == []
    assert [db.run_of(j) for j in (victim, failing, lost)] == [1, 1, 1]


def test_state_nothing_runs_or_waits_after_a_drain(db: Db) -> None:
    made = clean_history(db)
    running, waiting = db.submit(), db.submit()
    db.start(running, "GPU-0")
    problems = lines(db.check(), "state")
    assert f"[state] job {running} is RUNNING after the run was drained" in problems
    assert any(p.startswith(f"[state] job {waiting} is PENDING (reason None)")
               for p in problems), problems
    assert len(problems) == 2
    assert lines(db.check(finished=False), "state") == []  # mid-run: both legitimate
    db.sql("UPDATE jobs SET reason = 'Resources' WHERE id = :id", id=made.held)
    assert f"[state] job {made.held} is PENDING with reason Resources, expected " \
        "JobHeldUser" in db.check()


def test_state_a_dependency_that_can_never_be_met(db: Db) -> None:
    made = clean_history(db)
    never = db.submit(dependency=f"afterok:{made.requeued}")  # that job FAILED
    on_held = db.submit(dependency=f"afterany:{made.held}")
    db.sql("UPDATE jobs SET reason = 'Dependency' WHERE id IN (:a, :b)", a=never, b=on_held)
    assert lines(db.check(), "state") == [
        f"[state] job {never} is PENDING with reason Dependency, expected "
        "DependencyNeverSatisfied"]
    db.sql("UPDATE jobs SET reason = 'DependencyNeverSatisfied' WHERE id = :id", id=never)
    assert db.check() == []
    met = db.submit(dependency=f"afterok:{made.done}")  # met: it should have run
    db.sql("UPDATE jobs SET reason = 'Dependency' WHERE id = :id", id=met)
    assert lines(db.check(), "state")[0].startswith(f"[state] job {met} is PENDING")


def test_fields_agree_with_the_state(db: Db) -> None:
    made = clean_history(db)
    running = db.submit()
    db.start(running, "GPU-1")
    db.sql("UPDATE allocations SET released_at = NULL WHERE job_id = :id", id=made.done)
    db.sql("UPDATE jobs SET start_time = now() WHERE id = :id", id=made.held)
    db.sql("UPDATE allocations SET released_at = now() WHERE job_id = :id", id=running)
    db.sql("UPDATE jobs SET end_time = NULL WHERE id = :id", id=made.no_gpus)
    problems = lines(db.check(finished=False), "fields")
    gpu0 = db.gpu("GPU-0")
    assert sorted(problems) == sorted([
        f"[fields] job {made.done} (COMPLETED) has ended but still holds GPUs [{gpu0}]",
        f"[fields] job {made.held} (PENDING) has a start time",
        f"[fields] job {running} (RUNNING) holds 0 GPU(s) open, not its 1",
        f"[fields] job {made.no_gpus} (COMPLETED) has ended but has no end time"])
    db.sql("UPDATE allocations SET released_at = allocated_at - interval '1 s' "
           "WHERE job_id = :id", id=made.slice)
    assert f"[fields] job {made.slice} run 0: GPU {db.gpu('MIG-2a')} released before it " \
        "was allocated" in db.check()


def test_runs_are_requeues_plus_one(db: Db) -> None:
    made = clean_history(db)
    db.sql("UPDATE jobs SET restarts = 2 WHERE id = :id", id=made.requeued)
    db.write(made.done, 1, f"start n1 {time.time()}")
    where = f"[runs] job {made.requeued} (restarts 2, FAILED)"
    assert lines(db.check(), "runs") == [
        f"{where}: 2 run(s) in its allocations, expected 3",
        f"{where}: launch commands for runs [0, 1], expected [0, 1, 2]",
        f"[runs] job {made.done} run 1 ran (records file {made.done}.1) but the database "
        "never started that run"]
    db.sql("UPDATE jobs SET restarts = 1 WHERE id = :id", id=made.requeued)
    db.sql("DELETE FROM node_commands WHERE job_id = :id AND kind = 'launch'", id=made.no_gpus)
    assert lines(db.check(), "runs")[0] == (
        f"[runs] job {made.no_gpus} (restarts 0, COMPLETED): launch commands for runs [], "
        "expected [0]")


def test_no_run_starts_twice(db: Db) -> None:
    made = clean_history(db)
    db.write(made.done, 0, f"start n1 {time.time()}")
    db.sql("INSERT INTO node_commands (job_id, run, node_id, kind) "
           "SELECT id, 1, node_id, 'launch' FROM jobs WHERE id = :id", id=made.requeued)
    assert lines(db.check(), "double-start") == [
        f"[double-start] job {made.done} run 0 started 2 times (n1, n1)",
        f"[double-start] job {made.requeued} run 1 has 2 launch commands"]


def test_no_gpu_held_by_two_runs(db: Db) -> None:
    clean_history(db)
    first, second = db.submit(), db.submit()
    db.start(first, "GPU-0")
    db.start(second, "GPU-1")
    db.end(first, "completed", 0)
    # The second job's GPU was the first one's, taken while the first still held it.
    db.sql("UPDATE allocations SET gpu_id = :gpu WHERE job_id = :job",
           gpu=db.gpu("GPU-0"), job=second)
    problems = lines(db.check(finished=False), "gpu-overlap")
    assert len(problems) == 1 and problems[0].startswith(
        f"[gpu-overlap] GPU {db.gpu('GPU-0')} on n1 held by job {first} run 0 and "
        f"job {second} run 0 at once"), problems


def test_no_gpu_used_by_two_scripts(db: Db) -> None:
    clean_history(db)
    first, second = db.submit(), db.submit()
    db.start(first, "GPU-0")
    db.end(first, "completed", 0)
    db.start(second, "GPU-0")
    db.end(second, "completed", 0)
    assert db.check() == []
    # The first run went on (its node cut off, not fenced) past the second's start.
    db.write(first, 0, f"end 0 {time.time() + 1}")
    problems = lines(db.check(), "gpu-overlap")
    assert len(problems) == 1 and problems[0].startswith(
        f"[gpu-overlap] GPU {db.gpu('GPU-0')} on n1 in use by the scripts (start to end line) "
        f"of job {first} run 0 and job {second} run 0 at once"), problems


def test_no_mig_slice_held_with_its_parent(db: Db) -> None:
    clean_history(db)
    whole, on_slice, other_slice = db.submit(), db.submit(), db.submit()
    db.start(whole, "GPU-2")  # a plan that got it wrong: the database takes it
    db.start(on_slice, "MIG-2b")
    db.start(other_slice, "MIG-2a")
    problems = lines(db.check(finished=False), "mig-overlap")
    assert sorted(problems) == sorted([
        f"[mig-overlap] MIG slice {db.gpu(uuid)} and its parent GPU {db.gpu('GPU-2')} held "
        f"by job {whole} run 0 and job {job} run 0 at once"
        for uuid, job in (("MIG-2b", on_slice), ("MIG-2a", other_slice))])


def test_no_share_overcommitted(db: Db) -> None:
    clean_history(db)
    db.sql("UPDATE partitions SET sharing = 'mps', shares = 4 WHERE name = 'gpu'")
    first, second, third = (db.submit(share_mode="mps", share=2) for _ in range(3))
    db.start(first, "GPU-1", shares=(("GPU-1", 2, 0),))
    db.start(second, "GPU-1", shares=(("GPU-1", 2, 0),))
    assert db.check(finished=False) == []  # 4 of 4 units
    db.start(third, "GPU-1", shares=(("GPU-1", 2, 0),))
    problems = lines(db.check(finished=False), "share-overcommit")
    assert len(problems) == 1 and problems[0].startswith(
        f"[share-overcommit] GPU {db.gpu('GPU-1')} on n1: 6 units held at "), problems
    assert problems[0].endswith(f"(when job {third} run 0 took 2), it offers 4")
    whole = db.submit()
    db.start(whole, "GPU-1")  # whole, over the shares: the index allows it
    assert any(p.startswith(f"[gpu-overlap] GPU {db.gpu('GPU-1')}") and f"job {whole}" in p
               for p in db.check(finished=False))


def test_every_exit_status_written_reaches_the_database(db: Db) -> None:
    made = clean_history(db)
    db.write(made.done, 0, f"end 2 {time.time()}")  # its last line says 2, the job has 0
    problems = lines(db.check(), "exit-status")
    assert problems == [f"[exit-status] job {made.done} run 0 exited 2 (on n1) but the "
                        "database has COMPLETED with exit code 0, signal None"]
    db.deaths.clear()  # its node did not die: NODE_FAIL lost the status its script wrote
    assert lines(db.check(), "exit-status")[1] == (
        f"[exit-status] job {made.node_fail} run 0 exited 0 (on n1) but the database has "
        "NODE_FAIL with exit code None, signal None (node n1 failed (NotResponding))")


def test_accounting_equals_the_sum_over_runs(db: Db) -> None:
    clean_history(db)
    assert lines(db.check(), "accounting") == []
    # A job requeued and held: gacct's report counts its first run on GPU-0 too.
    again = db.submit()
    db.start(again, "GPU-0")
    with db.sessions() as s, s.begin():
        jobs.requeue_job(s, again, ROOT)
    db.end(again, "cancelled", wrote=False)
    with db.sessions() as s, s.begin():
        jobs.set_hold(s, again, ALICE, True)
    db.sql("UPDATE jobs SET reason = 'JobHeldUser' WHERE id = :id", id=again)
    assert db.check() == []
    # A run from before the report's window: the report cuts it, the runs do not.
    db.sql("UPDATE allocations SET allocated_at = allocated_at - (released_at - "
           "'1970-01-01T12:00:00Z'::timestamptz) + interval '1 hour', released_at = "
           "'1970-01-01T12:00:00Z'::timestamptz + interval '1 hour' WHERE job_id = :id", id=again)
    problems = db.check()
    assert len(problems) == 1 and problems[0].startswith(
        "[accounting] account - user alice: gacct's usage report has "), problems


def _script(records: Path, code: int, body: str = "true") -> str:
    """A job script that records its run as the chaos workload's do."""
    record = f"{records}/$SLURM_JOB_ID.$SLURM_RESTART_COUNT"
    return (f"printf 'start node01 %s\\n' \"$(date +%s.%N)\" >> {record}; {body}; "
            f"printf 'end {code} %s\\n' \"$(date +%s.%N)\" >> {record}; exit {code}")


def test_a_real_cluster_leaves_a_clean_history(db_url: str, tmp_path: Path) -> None:
    records = tmp_path / "records"
    records.mkdir()
    records.chmod(0o777)
    cluster = Cluster(db_url)
    try:
        cluster.up()
        ok = cluster.submit("--gpus", "1", "--wrap", _script(records, 0))
        bad = cluster.submit("--gpus", "2", "--wrap", _script(records, 3))
        bare = cluster.submit("--gpus", "0", "--partition", "debug", "--wrap",
                              _script(records, 0))
        again = cluster.submit("--gpus", "1", "--wrap", _script(
            records, 0, 'if [ "$SLURM_RESTART_COUNT" = 0 ]; then sleep 60; fi'))
        held = cluster.submit("--hold", "--wrap", _script(records, 0))
        cluster.wait_state(again, "RUNNING")
        wait_for(lambda: (records / f"{again}.0").exists(), what="the first run's record")
        requeue = cluster.run("gcontrol", "requeue", str(again))
        assert requeue.returncode == 0, requeue.stderr
        never = cluster.submit("--dependency", f"afterok:{bad}", "--wrap", _script(records, 0))
        for job_id, state in ((ok, "COMPLETED"), (bad, "FAILED"), (bare, "COMPLETED"),
                              (again, "COMPLETED")):
            cluster.wait_state(job_id, state)
        wait_for(lambda: cluster.job(never)["reason"] == "DependencyNeverSatisfied",
                 what="the dependency judged never met")
        assert cluster.job(again)["restarts"] == 1 and cluster.job(held)["state"] == "PENDING"
        assert cluster.job(bad)["exit_code"] == 3
        assert check(Evidence(db_url, records)) == []
    finally:
        cluster.close()
