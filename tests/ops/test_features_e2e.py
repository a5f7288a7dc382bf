"""Node features and -C/--constraint end to end on a real local cluster (controller, two
agents, PostgreSQL): node01 has two demo GPUs, node02 one L4; the admin configuration
gives them rack features. ginfo and gcontrol show node list each node's features; a
constrained job (command line or directive) lands on a matching node; a constraint no
node can satisfy is refused at submit with one line and nothing stored; a pending job
whose features leave its nodes waits with reason BadConstraints until they return."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.nodes import Node
from tests.pg import ScratchPostgres

L4 = """[[agent.gpus.static]]
index = 0
uuid = "GPU-4c4c4c4c-0000-4000-8000-000000000002"
name = "NVIDIA L4"
memory_mb = 23034
type = "l4"

[[partitions]]"""


def apply_nodes(cluster: Cluster, node02: str) -> None:
    path = cluster.root / "nodes.toml"
    path.write_text(f'[[node]]\nname = "node01"\nfeatures = ["rack1"]\n'
                    f'[[node]]\nname = "node02"\nfeatures = {node02}\n')
    result = cluster.run("gpusched", "admin", "apply", str(path))
    assert result.returncode == 0, result


@pytest.fixture(scope="module")
def cluster(postgres: ScratchPostgres) -> Iterator[Cluster]:
    c = Cluster(postgres.fresh_database(), gpus=2)
    node02 = Node(c, "node02")
    node02.config.write_text(node02.config.read_text().replace("count = 1\n", "")
                             .replace("[[partitions]]", L4, 1))
    try:
        c.up()
        node02.start()
        apply_nodes(c, '["rack2", "ib"]')
        yield c
    finally:
        node02.stop_jobs()
        c.close()


def test_nodes_show_their_features(cluster: Cluster) -> None:
    shown = cluster.run("gcontrol", "show", "node", "node02")
    assert shown.returncode == 0 and "Features=gpumem24g,ib,l4,rack2" in shown.stdout, shown
    listed = cluster.run("ginfo", "-N", "-h", "-o", "%N %f")
    assert listed.returncode == 0, listed
    assert {tuple(line.split()) for line in listed.stdout.splitlines()} >= {
        ("node01", "gpumem80g,rack1"), ("node02", "gpumem24g,ib,l4,rack2")}, listed.stdout


def test_a_constrained_job_lands_on_a_matching_node(cluster: Cluster) -> None:
    on_l4 = cluster.submit("-C", "l4&ib", "--gpus=1", "--wrap", "true")
    script = cluster.work / "rack1.sh"
    script.write_text("#!/bin/sh\n#SBATCH --constraint=[rack1|rack3]\n#SBATCH --gpus=2\ntrue\n")
    on_rack1 = cluster.submit(str(script))
    for job, node, constraint in ((on_l4, "node02", "l4&ib"), (on_rack1, "node01", "[rack1|rack3]")):
        done = cluster.wait_state(job, "COMPLETED", timeout=30)
        assert (done["node"], done["constraint"]) == (node, constraint)
    before = len(cluster.jobs())
    for args, words in ((("-C", "v100"), "invalid feature specification: no a node of "
                         "partition gpu satisfy it (features there: gpumem24g, gpumem80g, ib, "
                         "l4, rack1, rack2)"),
                        (("-C", "l4&rack1"), "invalid feature specification"),
                        (("-C", "l4,ib"), "--constraint: join features with '&'"),
                        (("-C", "rack1", "-w", "node02"), "invalid feature specification")):
        refused = cluster.run("gsubmit", *args, "--wrap", "true")
        assert refused.returncode == 2, refused
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0].replace("no 1 node", "no a node"), refused
    assert len(cluster.jobs()) == before


def test_a_job_whose_features_go_waits_with_bad_constraints(cluster: Cluster) -> None:
    holder = cluster.submit("-C", "ib", "--gpus=1", "--wrap", "sleep 60")
    cluster.wait_state(holder, "RUNNING")
    waiting = cluster.submit("-C", "ib", "--gpus=1", "--wrap", "true")
    wait_for(lambda: cluster.job(waiting)["reason"] == "Resources", what="reason Resources",
             seen=lambda: cluster.job(waiting))
    apply_nodes(cluster, '["rack2"]')
    wait_for(lambda: cluster.job(waiting)["reason"] == "BadConstraints",
             what="reason BadConstraints", seen=lambda: cluster.job(waiting))
    queue = cluster.run("gqueue")
    assert any(line.split()[0] == str(waiting) and "(BadConstraints)" in line
               for line in queue.stdout.splitlines()), queue.stdout
    why = cluster.run("gqueue", "--explain", str(waiting))
    assert why.returncode == 0 and "satisfy its constraint (ib)" in why.stdout, why
    apply_nodes(cluster, '["rack2", "ib"]')
    cluster.run("gcancel", str(holder))
    done = cluster.wait_state(waiting, "COMPLETED", timeout=30)
    assert done["node"] == "node02"


def test_gcontrol_update_changes_a_pending_jobs_features(cluster: Cluster) -> None:
    """scontrol update job Features=: checked against the partition's nodes as gsubmit -C
    is (a refusal changes nothing); an empty value drops the constraint."""
    job = cluster.submit("--hold", "-C", "rack1", "--gpus=1", "--wrap", "true")
    moved = cluster.run("gcontrol", "update", "job", str(job), "Features=l4&ib")
    assert moved.returncode == 0, moved.stderr
    assert cluster.job(job)["constraint"] == "l4&ib"
    bad = cluster.run("gcontrol", "update", f"JobId={job}", "Features=v100")
    assert bad.returncode == 2 and "invalid feature specification" in bad.stderr, bad
    syntax = cluster.run("gcontrol", "update", "job", str(job), "Features=l4,ib")
    assert syntax.returncode == 2 and "join features with '&'" in syntax.stderr, syntax
    assert cluster.job(job)["constraint"] == "l4&ib"  # neither refusal changed it
    cleared = cluster.run("gcontrol", "update", "job", str(job), "Features=")
    assert cleared.returncode == 0 and cluster.job(job)["constraint"] is None, cleared
    cluster.run("gcontrol", "update", "job", str(job), "Features=rack2")
    cluster.run("gcontrol", "release", str(job))
    assert cluster.wait_state(job, "COMPLETED", timeout=30)["node"] == "node02"
