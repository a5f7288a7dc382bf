"""gpusched admin apply through a running controller."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.e2e.cluster import Cluster, wait_for

BIN = Path(sys.executable).parent


def admin(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "gpusched"), "admin", "apply", *args], capture_output=True,
                          text=True, env=cluster.env, cwd=cluster.root, timeout=60)


def partitions_file(cluster: Cluster, state: str, name: str = "parts.toml") -> Path:
    path = cluster.root / name
    path.write_text(f'[[partition]]\nname = "gpu"\nnodes = "node[01-02]"\ndefault = true\n'
                    f'max_gpus_per_job = 2\nstate = "{state}"\n')
    return path


def test_apply_with_an_error_changes_nothing(cluster: Cluster) -> None:
    good = partitions_file(cluster, "down")
    bad = cluster.root / "accounts.toml"
    bad.write_text('[[account]]\nname = "a"\nparent = "nowhere"\n')
    result = admin(cluster, str(good), str(bad))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"gpusched: error: {good}, {bad}: account 'a': parent 'nowhere' is not declared"]
    # Nothing changed: the gpu partition still takes 4-GPU jobs and runs them.
    job = cluster.submit("--gpus", "4", "--wrap", "true")
    cluster.wait_state(job, "COMPLETED")


def test_valid_apply_takes_effect_on_the_next_pass(cluster: Cluster) -> None:
    down = partitions_file(cluster, "down")
    preview = admin(cluster, "--dry-run", str(down))
    assert preview.returncode == 0, preview.stderr
    assert "~ partition gpu: " in preview.stdout and "state UP -> DOWN" in preview.stdout
    assert "~ partition debug: state -> INACTIVE" in preview.stdout
    assert "dry run" in preview.stdout
    job = cluster.submit("--gpus", "1", "--wrap", "true")
    cluster.wait_state(job, "COMPLETED")  # the dry run changed nothing

    applied = admin(cluster, str(down))
    assert applied.returncode == 0 and "applied" in applied.stdout, applied
    waiting = cluster.submit("--gpus", "1", "--wrap", "true")
    wait_for(lambda: cluster.job(waiting)["reason"] == "PartitionDown", what="PartitionDown",
             seen=lambda: cluster.job(waiting))
    too_many = cluster.run("gsubmit", "--gpus", "3", "--wrap", "true")
    assert too_many.returncode == 2 and "per job partition gpu allows" in too_many.stderr
    gone = cluster.run("gsubmit", "-p", "debug", "--wrap", "true")
    assert gone.returncode == 2 and "invalid partition specified: debug" in gone.stderr

    assert admin(cluster, str(partitions_file(cluster, "up", "up.toml"))).returncode == 0
    cluster.wait_state(waiting, "COMPLETED")
    assert "no changes" in admin(cluster, str(cluster.root / "up.toml")).stdout


def test_only_an_administrator_may_apply(cluster: Cluster, job_user: tuple[int, int, str]) -> None:
    uid, gid, _ = job_user
    refused = cluster.api_as(uid, gid, "POST", "/v1/admin/apply",
                             {"files": [{"source": "x", "data": {}}], "dry_run": True})
    assert "only an administrator" in refused["error"]


def test_prio_and_share_show_the_pass_inputs(cluster: Cluster) -> None:
    accounts = cluster.root / "accounts.toml"
    accounts.write_text('[[account]]\nname = "ops"\nshares = 3\n[[account]]\nname = "lab"\n'
                        '[[user]]\nname = "root"\naccounts = ["ops"]\n'
                        '[[qos]]\nname = "normal"\npriority = 10\n[[qos]]\nname = "high"\npriority = 50\n')
    assert admin(cluster, str(accounts)).returncode == 0
    blocker = cluster.submit("--gpus", "4", "--wrap", "sleep 30")
    cluster.wait_state(blocker, "RUNNING")
    normal = cluster.submit("--gpus", "1", "--wrap", "true")
    high = cluster.submit("--gpus", "1", "-q", "high", "--wrap", "true")

    def gpusched(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "gpusched"), *args], capture_output=True, text=True,
                              env=cluster.env, timeout=60)

    import json
    prio = json.loads(gpusched("prio", "--json").stdout)
    assert [j["job_id"] for j in prio["jobs"]] == [high, normal]  # QOS high outranks age
    assert prio["jobs"][0]["qos"] == 1.0 and prio["jobs"][1]["qos"] == 0.2
    assert all(j["account"] == "ops" and j["fairshare"] == 1.0 for j in prio["jobs"])
    table = gpusched("prio", str(normal)).stdout.splitlines()
    assert table[0].split()[:4] == ["JOBID", "USER", "ACCOUNT", "PRIORITY"]
    assert len(table) == 2 and table[1].split()[:3] == [str(normal), "root", "ops"]
    share = json.loads(gpusched("share", "--json").stdout)
    rows = [(r["account"], r["user"], r["shares"]) for r in share["rows"]]
    assert rows == [("root", None, 1), ("lab", None, 1), ("ops", None, 3), ("ops", "root", 1)]
    assert share["method"] == "fair_tree"
    assert cluster.run("gcancel", str(blocker)).returncode == 0


def test_qos_limit_holds_a_job_with_its_reason(cluster: Cluster) -> None:
    accounts = cluster.root / "limits.toml"
    accounts.write_text('[[account]]\nname = "ops"\n[[user]]\nname = "root"\naccounts = ["ops"]\n'
                        '[[qos]]\nname = "normal"\nmax_jobs_per_user = 1\n')
    assert admin(cluster, str(accounts)).returncode == 0
    hold = 'while [ ! -e go ]; do sleep 0.05; done'
    first = cluster.submit("--gpus", "1", "--wrap", hold)
    second = cluster.submit("--gpus", "1", "--wrap", "true")
    cluster.wait_state(first, "RUNNING")
    wait_for(lambda: cluster.job(second)["reason"] == "QOSMaxJobsPerUserLimit",
             what="the QOS reason", seen=lambda: cluster.job(second))
    (cluster.work / "go").touch()
    cluster.wait_state(second, "COMPLETED")
