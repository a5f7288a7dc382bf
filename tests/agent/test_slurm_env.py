"""sbatch's output environment as a job's batch script sees it: build_spec from a launch
order as the agent parses it (pure: nothing is launched)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.agent.jobspec import build_spec
from gpusched.agent.slurmenv import owned_names, repeated, submit_dir, tasks_per_node
from gpusched.errors import UsageError
from gpusched.messages import LaunchOrder
from gpusched.messages.jobfacts import JobFacts

U0 = "GPU-00000000-0000-0000-0000-000000000000"
U1 = "GPU-11111111-1111-1111-1111-111111111111"
U3 = "GPU-33333333-3333-3333-3333-333333333333"
OTHER = "GPU-99999999-9999-9999-9999-999999999999"  # a GPU of another node
# This node's GPUs by UUID, as the agent registered them: indexes not in UUID order.
INVENTORY = {U3: {"index": 3, "uuid": U3}, U0: {"index": 0, "uuid": U0},
             U1: {"index": 1, "uuid": U1}}
FACTS = {"partition": "gpu", "account": "physics", "qos": "high",
         "dependency": "afterok:12:13", "gpus": 4, "start_time": 1_700_000_000}


def order(work_dir: Path, **overrides: Any) -> LaunchOrder:
    """A launch order as /agent/v1/work carries it, parsed as the agent parses it."""
    raw = {"job_id": 42, "name": "train run", "user": "alice", "uid": 1234, "gid": 99,
           "script": "#!/bin/sh\n", "work_dir": str(work_dir), "node": "gpu01",
           "environment": {"HOME": "/home/alice"}, "job": FACTS}
    raw.update(overrides)
    return LaunchOrder.parse(raw)


def env_of(launch: LaunchOrder, node: str = "gpu01",
           inventory: dict[str, Any] | None = None) -> dict[str, str]:
    return dict(build_spec(launch, kill_grace=1.0, node_name=node,
                           inventory=INVENTORY if inventory is None else inventory)["env"])


def test_every_variable_of_a_two_node_job(tmp_path: Path) -> None:
    launch = order(tmp_path, gpu_uuids=[U3, U1, OTHER], node_names=["gpu01", "gpu02"],
                   cpus=8, mem_mb=16384, time_limit=3600,
                   environment={"SLURM_SUBMIT_DIR": "/home/alice/exp 1",
                                "SLURM_SUBMIT_HOST": "login1", "SLURM_NTASKS": "3",
                                "SLURM_PRIO_PROCESS": "5", "SLURM_EXPORT_ENV": "NONE"})
    env = env_of(launch)
    expected = {
        "SLURM_JOB_ID": "42", "SLURM_JOBID": "42", "SLURM_JOB_NAME": "train run",
        "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_NODELIST": "gpu[01-02]",
        "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2",
        "SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_GPUS": "1,3",
        "SLURM_CPUS_ON_NODE": "8", "SLURM_JOB_CPUS_PER_NODE": "8(x2)",
        "SLURM_MEM_PER_NODE": "16384", "SLURM_TASKS_PER_NODE": "2,1",
        "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_ACCOUNT": "physics", "SLURM_JOB_QOS": "high",
        "SLURM_JOB_DEPENDENCY": "afterok:12:13", "SLURM_GPUS": "4", "SLURM_GPUS_PER_NODE": "2",
        "SLURM_JOB_START_TIME": "1700000000", "SLURM_JOB_END_TIME": "1700003600",
        "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1234", "SLURM_JOB_GID": "99",
        "SLURM_SUBMIT_DIR": "/home/alice/exp 1", "SLURM_SUBMIT_HOST": "login1",
        "SLURM_NTASKS": "3", "SLURM_NPROCS": "3", "SLURM_PRIO_PROCESS": "5", "SLURM_EXPORT_ENV": "NONE",
        "SLURM_RESTART_COUNT": "0", "SLURMD_NODENAME": "gpu01", "SLURM_NODEID": "0",
        "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
    }
    assert {name: env.get(name) for name in expected} == expected
    # Each scheduler variable again under GPUSCHED_, but for the UUIDs and the one
    # name that is gsubmit's input variable.
    for name in ("JOB_PARTITION", "NNODES", "GPUS_ON_NODE", "SUBMIT_DIR", "JOB_END_TIME"):
        assert env[f"GPUSCHED_{name}"] == env[f"SLURM_{name}"]
    assert env["GPUSCHED_NODENAME"] == "gpu01"
    assert env["GPUSCHED_JOB_GPUS"] == f"{U3},{U1},{OTHER}"
    assert "GPUSCHED_GPUS" not in env


def test_submit_dir_is_where_gsubmit_ran_else_the_working_directory(tmp_path: Path) -> None:
    sent = "/home/alice/" + "d" * 100
    assert env_of(order(tmp_path, environment={"SLURM_SUBMIT_DIR": sent}))[
        "SLURM_SUBMIT_DIR"] == sent
    for bad in ("relative/dir", "", "/" + "x" * 4096):
        env = env_of(order(tmp_path, environment={"SLURM_SUBMIT_DIR": bad}))
        assert env["SLURM_SUBMIT_DIR"] == env["GPUSCHED_SUBMIT_DIR"] == str(tmp_path)
    assert submit_dir("/" + "é" * 2047, "/w") == "/" + "é" * 2047  # 4095 bytes
    assert submit_dir("/" + "é" * 2048, "/w") == "/w"  # 4097 bytes


def test_nothing_submitted_stands_in_for_a_scheduler_variable(tmp_path: Path) -> None:
    """A job submitted from inside another carries that job's variables: each of the
    names the scheduler sets is its own value or absent, never the submitted one."""
    stale = {name: "stale" for name in owned_names()}
    stale.update(CUDA_VISIBLE_DEVICES="stale", MY_VAR="kept")
    launch = order(tmp_path, environment=stale, job={"partition": "gpu"}, gpu_uuids=[U0])
    env = env_of(launch)
    assert env["MY_VAR"] == "kept"
    assert env["CUDA_VISIBLE_DEVICES"] == U0
    assert [name for name in owned_names() if env.get(name) == "stale"] == []
    # Not set for this job: absent rather than the submitted value.
    for name in ("SLURM_JOB_ACCOUNT", "SLURM_JOB_QOS", "SLURM_JOB_DEPENDENCY",
                 "SLURM_MEM_PER_NODE", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_END_TIME",
                 "SLURM_JOB_START_TIME", "SLURM_TASKS_PER_NODE", "GPUSCHED_ARRAY_JOB_ID"):
        assert name not in env, name


def test_user_values_reach_the_job_unchanged(tmp_path: Path) -> None:
    name = "ünïcode 'quoted' $HOME `x` ;" + "n" * 150
    facts = {"partition": "p" * 256, "account": "acct-é", "qos": "q" * 256, "gpus": 0}
    env = env_of(order(tmp_path, name=name, job=facts))
    assert env["SLURM_JOB_NAME"] == name
    assert "GPUSCHED_JOB_NAME" not in env  # gsubmit's input: a job's gsubmit would take it
    assert (env["SLURM_JOB_PARTITION"], env["SLURM_JOB_ACCOUNT"], env["SLURM_JOB_QOS"]) == (
        "p" * 256, "acct-é", "q" * 256)
    assert "SLURM_GPUS" not in env and "SLURM_GPUS_PER_NODE" not in env


@pytest.mark.parametrize("field, value", [
    ("partition", "p" * 257), ("account", "a" * 257), ("qos", "bad\nqos"),
    ("dependency", "d" * (64 * 1024 + 1)), ("gpus", -1), ("gpus", True),
    ("start_time", 253_402_300_800), ("colour", "red"),
])
def test_an_order_with_bad_job_facts_is_refused(tmp_path: Path, field: str,
                                                value: Any) -> None:
    with pytest.raises(UsageError, match=f"job: .*{field}"):
        order(tmp_path, job={**FACTS, field: value})
    with pytest.raises(UsageError, match="job: .*partition"):
        order(tmp_path, job={"gpus": 1})


def test_job_facts_travel_unchanged() -> None:
    facts = JobFacts(**FACTS)  # type: ignore[arg-type]
    assert JobFacts.parse(facts.to_json()) == facts


def test_an_order_without_facts_gives_the_rest(tmp_path: Path) -> None:
    """An older controller's order: no partition etc., everything else as before."""
    env = env_of(order(tmp_path, job=None, gpu_uuids=[U0, U1]))
    assert env["SLURM_JOB_GPUS"] == "0,1" and env["SLURM_GPUS_ON_NODE"] == "2"
    assert "SLURM_JOB_PARTITION" not in env and "SLURM_GPUS" not in env


def test_gpus_without_an_inventory_and_cpus_not_counted(tmp_path: Path) -> None:
    env = dict(build_spec(order(tmp_path, gpu_uuids=[U0, U1]), kill_grace=1.0,
                          node_name="gpu01")["env"])
    assert env["SLURM_GPUS_ON_NODE"] == "2" and env["SLURM_JOB_GPUS"] == ""
    import os
    assert env["SLURM_CPUS_ON_NODE"] == str(os.cpu_count())
    assert "SLURM_JOB_CPUS_PER_NODE" not in env


def test_a_share_of_a_gpu(tmp_path: Path) -> None:
    share = {"mode": "shard", "gpu_uuid": U1, "units": 2, "of": 8}
    env = env_of(order(tmp_path, gpu_uuids=[U1], share=share, job={**FACTS, "gpus": 1}))
    assert env["SLURM_JOB_GPUS"] == "1" and env["SLURM_GPUS_ON_NODE"] == "1"
    assert env["SLURM_SHARDS_ON_NODE"] == "2"
    assert "SLURM_GPUS" not in env  # it asked for shards, not GPUs


def test_array_variables_stay(tmp_path: Path) -> None:
    env = env_of(order(tmp_path, array_job_id=40, array_task_id=20, array_spec="0-30:10"))
    assert (env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"], env["SLURM_ARRAY_TASK_COUNT"],
            env["SLURM_ARRAY_TASK_STEP"]) == ("40", "20", "4", "10")


def test_cluster_name_from_the_agents_configuration(tmp_path: Path) -> None:
    named = build_spec(order(tmp_path), kill_grace=1.0, node_name="gpu01",
                       site={"cluster_name": "alpha"})
    assert named["env"]["SLURM_CLUSTER_NAME"] == named["env"]["GPUSCHED_CLUSTER_NAME"] == "alpha"
    stale = order(tmp_path, environment={"SLURM_CLUSTER_NAME": "beta"})
    assert "SLURM_CLUSTER_NAME" not in env_of(stale)


def test_the_prolog_gets_the_job_variables_without_the_submit_environment(
        tmp_path: Path) -> None:
    spec = build_spec(order(tmp_path, environment={"SECRET": "x"}), kill_grace=1.0,
                      node_name="gpu01", inventory=INVENTORY)
    assert spec["job_vars"]["SLURM_JOB_USER"] == "alice"
    assert spec["job_vars"]["SLURM_JOB_PARTITION"] == "gpu"
    assert "SECRET" not in spec["job_vars"]


@pytest.mark.parametrize("ntasks, per_node, nodes, expected", [
    (3, None, 2, "2,1"), (4, None, 2, "2(x2)"), (7, None, 3, "3,2(x2)"), (1, None, 1, "1"),
    (None, 4, 3, "4(x3)"), (5, 2, 2, "2(x2)"), (None, None, 2, ""), (1, None, 2, ""),
])
def test_tasks_per_node(ntasks: int | None, per_node: int | None, nodes: int,
                        expected: str) -> None:
    counts = tasks_per_node(ntasks, per_node, nodes)
    assert repeated(counts) == expected
    if counts and per_node is None:
        assert sum(counts) == ntasks and max(counts) - min(counts) <= 1


def test_tasks_from_a_bad_count_are_not_told(tmp_path: Path) -> None:
    for bad in ("0", "-1", "x", "1e3", "99999999999", "٣"):
        env = env_of(order(tmp_path, environment={"SLURM_NTASKS": bad}))
        assert "SLURM_TASKS_PER_NODE" not in env and "SLURM_NPROCS" not in env, bad


def expand(text: str) -> list[int]:
    """Slurm's compressed counts read back: ``2(x3),1`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in filter(None, text.split(",")):
        value, _, times = part.partition("(x")
        counts += [int(value)] * (int(times.rstrip(")")) if times else 1)
    return counts


@given(st.lists(st.integers(1, 5), max_size=30))
def test_repeated_reads_back_and_never_repeats_a_run(counts: list[int]) -> None:
    text = repeated(counts)
    assert expand(text) == counts
    values = [int(part.partition("(")[0]) for part in text.split(",") if part]
    assert all(a != b for a, b in zip(values, values[1:], strict=False))


@given(st.integers(1, 10_000), st.integers(1, 64))
def test_tasks_spread_in_blocks(ntasks: int, nodes: int) -> None:
    counts = tasks_per_node(ntasks, None, nodes)
    if ntasks < nodes:
        assert counts == []
    else:
        assert len(counts) == nodes and sum(counts) == ntasks
        assert counts == sorted(counts, reverse=True) and counts[0] - counts[-1] <= 1


def test_the_longest_dependency_submission_takes_travels(tmp_path: Path) -> None:
    """An order must never refuse what submission stored: a thousand 19-digit job ids,
    each in two clauses, reach SLURM_JOB_DEPENDENCY whole."""
    from gpusched.core.dependency import parse_dependency

    text = ",".join(f"afterok:{10**18 + i},afterany:{10**18 + i}" for i in range(1000))
    stored = ",".join(c.kind + "".join(f":{j}" for j in c.job_ids)
                      for c in parse_dependency(text))
    assert len(stored) > 50_000
    env = env_of(order(tmp_path, job={**FACTS, "dependency": stored}))
    assert env["SLURM_JOB_DEPENDENCY"] == stored
