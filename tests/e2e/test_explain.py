"""gqueue --explain against a live cluster: the ranked blockers, in words."""

from __future__ import annotations

from tests.e2e.cluster import Cluster, wait_for


def test_explain_ranks_blockers_and_says_what_would_unblock(cluster: Cluster) -> None:
    big = cluster.submit("-G", "3", "--wrap", "sleep 30")
    cluster.wait_state(big, "RUNNING")
    wide = cluster.submit("-G", "2", "--wrap", "true")
    held = cluster.submit("-G", "1", "--hold", "--wrap", "true")
    wait_for(lambda: cluster.job(held)["reason"] == "JobHeldUser", what="the hold noticed")
    result = cluster.run("gqueue", "--explain", str(wide))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"Job {wide} (wrap, user root, partition gpu) is pending, reason Resources."
    assert lines[1].startswith("Priority ") and lines[1].endswith(" of 2 pending jobs.")
    assert lines[-1] == ("  1. Resources: it needs 2 GPUs on one node; the most free now is 1 "
                         "(on node01): would start now with <= 1 GPUs")
    result = cluster.run("gqueue", "--explain", str(held))
    assert result.returncode == 0, result.stderr
    steps = [line.split(":")[0].strip() for line in result.stdout.splitlines()
             if line.startswith("  ")]
    assert steps == ["1. JobHeldUser", "2. Priority"]
    assert f"behind job {wide} (priority " in result.stdout
    running = cluster.run("gqueue", "--explain", str(big))
    assert running.stdout.strip().endswith("is RUNNING on node01: nothing holds it back.")
    missing = cluster.run("gqueue", "--explain", "99999")
    assert missing.returncode == 1 and "invalid job id specified: 99999" in missing.stderr
    assert cluster.run("gqueue", "--explain", "x").returncode == 2
    assert cluster.run("gcancel", str(big)).returncode == 0
    cluster.wait_state(wide, "COMPLETED")
