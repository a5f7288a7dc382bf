"""Node failure on a live cluster of two nodes: a node that dies has its jobs requeued
(or ended NODE_FAIL) and run elsewhere exactly once; a node that was only frozen comes
back, kills the runs the controller ended meanwhile, and its late reports change
nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.dbview import open_commands, query
from tests.e2e.nodes import Node, ran, set_controller

# Each run appends "start|stop|done JOB RUN NODE" to runs.log; TERM (a cancel, a kill)
# writes "stop".
JOB = """#!/bin/sh
line="$SLURM_JOB_ID $SLURM_RESTART_COUNT $SLURM_JOB_NODELIST"
echo "start $line" >> runs.log
trap 'echo "stop $line" >> runs.log; exit 143' TERM
while [ ! -e release ]; do sleep 0.05; done
echo "done $line" >> runs.log
"""
NODE_TIMEOUT = 8  # many polls (1 s): a busy test machine must not lose a node by itself


@pytest.fixture
def two_nodes(db_url: str) -> Iterator[tuple[Cluster, Node, Node]]:
    """A controller with node_timeout 8 s, node01 up with two GPUs, node02 ready to
    start (two GPUs); agents poll every second."""
    cluster = Cluster(db_url, gpus=2, poll_wait=1.0)
    set_controller(cluster, node_timeout=NODE_TIMEOUT)
    node01, node02 = Node(cluster, "node01"), Node(cluster, "node02", gpus=2)
    try:
        cluster.up()
        yield cluster, node01, node02
    finally:
        for node in (node01, node02):
            if node.key in cluster.procs:
                node.thaw()
            node.stop_jobs()
        cluster.close()


def _script(cluster: Cluster) -> str:
    path = cluster.work / "job.sh"
    path.write_text(JOB)
    return str(path)


def test_a_dead_node_s_jobs_are_requeued_and_run_elsewhere_once(
        two_nodes: tuple[Cluster, Node, Node], db_url: str) -> None:
    cluster, node01, node02 = two_nodes
    log = cluster.work / "runs.log"
    again = cluster.submit("--gpus", "1", _script(cluster))
    never = cluster.submit("--gpus", "1", "--no-requeue", _script(cluster))
    for job in (again, never):
        assert cluster.wait_state(job, "RUNNING")["node"] == "node01"
    wait_for(lambda: len(ran(log)) == 2, what="both started", seen=lambda: ran(log))
    node02.start()

    node01.die()  # agent, supervisors and jobs: the whole node
    wait_for(lambda: node01.state_of() == ("DOWN", "NotResponding"), timeout=NODE_TIMEOUT + 10,
             what="node01 DOWN", seen=node01.state_of)
    failed = cluster.wait_state(never, "NODE_FAIL")
    assert failed["error_message"] == "node node01 failed (NotResponding)"
    moved = cluster.wait_state(again, "RUNNING")
    assert (moved["node"], moved["restarts"]) == ("node02", 1)
    wait_for(lambda: len(ran(log)) == 3, what="the second run", seen=lambda: ran(log))
    (cluster.work / "release").touch()
    assert cluster.wait_state(again, "COMPLETED")["restarts"] == 1
    starts = [words[1:] for words in ran(log) if words[0] == "start"]
    assert sorted(starts) == sorted([[str(again), "0", "node01"], [str(never), "0", "node01"],
                                     [str(again), "1", "node02"]])  # each run once
    # What users see: ginfo and gcontrol name the node DOWN and why; gqueue says NF.
    ginfo = cluster.run("ginfo", "-N")
    row = next(line for line in ginfo.stdout.splitlines() if line.startswith("node01"))
    assert "down" in row and "NotResponding" in row, ginfo.stdout
    shown = cluster.run("gcontrol", "show", "node", "node01").stdout
    assert "State=DOWN" in shown and "Reason=NotResponding" in shown, shown
    listed = cluster.run("gqueue", "-t", "NF", "-h", "-o", "%i %t").stdout.split()
    assert listed == [str(never), "NF"]
    accounted = json.loads(cluster.run("gacct", "-s", "NF", "--json").stdout)["jobs"]
    assert [(j["job_id"], j["state"]) for j in accounted] == [(never, "NODE_FAIL")]
    # No launch of either job was handed out twice for one run.
    assert query(db_url, "SELECT job_id, run, count(*) FROM node_commands WHERE kind = "
                 "'launch' GROUP BY job_id, run HAVING count(*) > 1") == []


def test_a_frozen_node_comes_back_and_kills_the_runs_it_lost(
        two_nodes: tuple[Cluster, Node, Node], db_url: str) -> None:
    cluster, node01, node02 = two_nodes
    log = cluster.work / "runs.log"
    job = cluster.submit("--gpus", "1", _script(cluster))
    assert cluster.wait_state(job, "RUNNING")["node"] == "node01"
    wait_for(lambda: ran(log) == [["start", str(job), "0", "node01"]], what="run 0",
             seen=lambda: ran(log))
    node02.start()

    node01.freeze()  # the agent stops; run 0's supervisor and script go on
    wait_for(lambda: cluster.job(job)["restarts"] == 1 and cluster.job(job)["state"] == "RUNNING",
             timeout=NODE_TIMEOUT + 15, what="run 1 started", seen=lambda: cluster.job(job))
    moved = cluster.job(job)
    assert moved["node"] == "node02"
    wait_for(lambda: ["start", str(job), "1", "node02"] in ran(log), what="run 1 running",
             seen=lambda: ran(log))
    assert ["stop", str(job), "0", "node01"] not in ran(log)  # both run, for now

    node01.thaw()  # it comes back: registers again, and is told to kill run 0
    wait_for(lambda: ["stop", str(job), "0", "node01"] in ran(log), what="run 0 killed",
             seen=lambda: (ran(log), cluster.logs()))
    wait_for(lambda: node01.state_of() == ("UP", None), what="node01 back UP")
    # Run 0's end reached the controller and was ignored: the job runs on as run 1.
    wait_for(lambda: not list((node01.state / "jobs").glob(f"{job}")), what="run 0 reported",
             seen=lambda: list((node01.state / "jobs").iterdir()))
    now = cluster.job(job)
    assert (now["state"], now["restarts"], now["node"]) == ("RUNNING", 1, "node02")
    assert ["stop", str(job), "1", "node02"] not in ran(log)
    assert query(db_url, "SELECT kind, run FROM node_commands c JOIN nodes n ON n.id = c.node_id "
                 "WHERE n.name = 'node01' AND c.kind = 'kill'") == [("kill", 0)]
    (cluster.work / "release").touch()
    done = cluster.wait_state(job, "COMPLETED")
    assert (done["restarts"], done["node"]) == (1, "node02")
    assert [w for w in ran(log) if w[0] != "start"] == [
        ["stop", str(job), "0", "node01"], ["done", str(job), "1", "node02"]]
    assert open_commands(db_url) == []


def test_a_replaced_agent_s_waiting_poll_claims_nothing(cluster: Cluster) -> None:
    """A long poll left behind by a killed agent must not take the work meant for the
    agent started in its place (it would be lost with it). The agents here are played
    through the API, so that the old poll is the only one waiting."""
    cluster.kill("agent", signal.SIGKILL)
    inventory = subprocess.run(
        [sys.executable, "-P", "-m", "gpusched.cli.gpusched", "agent", "inventory", "--json",
         "--config", str(cluster.config)], capture_output=True, text=True, check=True)
    stale: dict[str, object] = {}

    def poll() -> None:  # the dead agent's poll, still waiting at the controller
        stale.update(cluster.api("GET", "/agent/v1/work?node=node01&wait=20"))

    def last_seen() -> str:
        return str(cluster.api("GET", "/v1/nodes")["nodes"][0]["last_seen"])

    before = last_seen()
    waiting = threading.Thread(target=poll)
    waiting.start()
    try:
        wait_for(lambda: last_seen() != before, what="the old poll to wait")
        cluster.api("POST", "/agent/v1/register", json.loads(inventory.stdout))  # its successor
        job = cluster.submit("--wrap", "true")
        cluster.wait_state(job, "RUNNING")  # its launch is made: the old poll is woken
    finally:
        waiting.join(timeout=30)
    assert stale == {"commands": []}
    fresh = cluster.api("GET", "/agent/v1/work?node=node01&wait=0")["commands"]
    assert [(c["kind"], c["job_id"]) for c in fresh] == [("launch", job)]


def test_work_that_reaches_a_node_too_late_is_not_done(db_url: str) -> None:
    """A launch claimed by a node's poll just before its agent froze reaches the agent
    only when it thaws, after the controller gave the node up and started that job
    elsewhere: the agent registers again instead of launching it."""
    cluster = Cluster(db_url, gpus=2, poll_wait=3.0)
    set_controller(cluster, node_timeout=10)  # answers are trusted for 8 s
    node01, node02 = Node(cluster, "node01"), Node(cluster, "node02", gpus=2)
    log = cluster.work / "runs.log"
    try:
        cluster.up()
        running = cluster.submit("--gpus", "1", _script(cluster))
        held = cluster.submit("--gpus", "1", "--hold", _script(cluster))
        wait_for(lambda: ran(log) == [["start", str(running), "0", "node01"]], what="run 0")

        def last_seen() -> object:
            return cluster.api("GET", "/v1/nodes")["nodes"][0]["last_seen"]

        before = last_seen()
        wait_for(lambda: last_seen() != before, what="a poll to begin")
        # A poll answers within milliseconds of its end, and the next begins at once:
        # a moment later the agent is inside a poll with nearly 3 s of it left.
        time.sleep(0.3)
        node01.freeze()
        assert cluster.run("gcontrol", "release", str(held)).returncode == 0
        wait_for(lambda: query(db_url, "SELECT 1 FROM node_commands WHERE job_id = :j AND "
                               "kind = 'launch' AND claimed_at IS NOT NULL", j=held),
                 what="the launch claimed by the frozen agent's poll")
        node02.start()
        for job in (running, held):
            wait_for(lambda: (cluster.job(job)["restarts"], cluster.job(job)["node"]) == (
                1, "node02") and cluster.job(job)["state"] == "RUNNING",
                timeout=30, what=f"job {job} running on node02",
                seen=lambda: (cluster.job(job), cluster.logs()))
        node01.thaw()
        wait_for(lambda: ["stop", str(running), "0", "node01"] in ran(log),
                 what="the stale run killed", seen=lambda: (ran(log), cluster.logs()))
        wait_for(lambda: node01.state_of() == ("UP", None), what="node01 back")
        (cluster.work / "release").touch()
        for job in (running, held):
            assert cluster.wait_state(job, "COMPLETED")["restarts"] == 1
        starts = sorted(w[1:] for w in ran(log) if w[0] == "start")
        assert starts == sorted([[str(running), "0", "node01"], [str(running), "1", "node02"],
                                 [str(held), "1", "node02"]])  # never run 0 of `held`
        assert "registering again before acting on it" in (
            cluster.root / "agent.log").read_text()
    finally:
        for node in (node01, node02):
            if node.key in cluster.procs:
                node.thaw()
            node.stop_jobs()
        cluster.close()
