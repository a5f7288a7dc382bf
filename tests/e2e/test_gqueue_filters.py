"""gqueue's filters, --format and --iterate on a live cluster."""

from __future__ import annotations

import subprocess

import pytest

from gpusched.errors import UsageError
from tests.e2e.cluster import BIN, Cluster, wait_for


def ids(output: str) -> list[int]:
    return [int(line.split()[0]) for line in output.splitlines()[1:]]


def test_filters_format_and_iterate(cluster: Cluster) -> None:
    a = cluster.submit("-J", "alpha", "--hold", "--wrap", "true")
    b = cluster.submit("-J", "beta", "-p", "debug", "--hold", "--wrap", "true")
    c = cluster.submit("-J", "beta", "--hold", "--wrap", "true")
    assert ids(cluster.run("gqueue", "-p", "debug").stdout) == [b]
    assert ids(cluster.run("gqueue", "-n", "beta").stdout) == [b, c]
    assert ids(cluster.run("gqueue", "-j", f"{a},{c}").stdout) == [a, c]
    assert ids(cluster.run("gqueue", "--me", "-n", "alpha,beta", "-p", "gpu").stdout) == [a, c]
    assert ids(cluster.run("gqueue", "-A", "nobody").stdout) == []
    shown = cluster.run("gqueue", "-j", str(b), "-o", "%.6i %9P %j %r").stdout.splitlines()
    assert shown == [" JOBID PARTITION NAME REASON", f"{b:>6} debug     beta JobHeldUser"]
    bad = cluster.run("gqueue", "-o", "%i %g")
    assert bad.returncode == 2 and "%g is not supported" in bad.stderr
    looping = subprocess.Popen([str(BIN / "gqueue"), "-i", "1", "-j", str(a)], env=cluster.env,
                               stdout=subprocess.PIPE, text=True)
    try:
        out, _ = looping.communicate(timeout=2.6)
    except subprocess.TimeoutExpired:
        looping.kill()
        out, _ = looping.communicate()
    assert out.count("JOBID") >= 2  # printed again after a second
    cluster.run("gcancel", str(a), str(b), str(c))


def test_chdir_export_and_input_variables(cluster: Cluster) -> None:
    sub = cluster.work / "sub"
    sub.mkdir(mode=0o777)
    script = cluster.work / "env.sh"
    script.write_text("#!/bin/sh\necho \"MARK=${MARK:-unset} FOO=${FOO:-unset} $(pwd)\"\n")
    env = {**cluster.env, "MARK": "here", "GPUSCHED_PARTITION": "debug"}
    done = subprocess.run([str(BIN / "gsubmit"), "--parsable", "-D", "sub", "--export=NONE,FOO=bar",
                           str(script)], env=env, cwd=cluster.work, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    job = int(done.stdout)
    ended = cluster.wait_state(job, "COMPLETED")
    assert ended["partition"] == "debug"  # from GPUSCHED_PARTITION
    assert (sub / f"gpusched-{job}.out").read_text().split() == ["MARK=unset", "FOO=bar", str(sub)]
    default = subprocess.run([str(BIN / "gsubmit"), "--parsable", str(script)], env=env,
                             cwd=cluster.work, capture_output=True, text=True)
    job = int(default.stdout)
    cluster.wait_state(job, "COMPLETED")
    assert (cluster.work / f"gpusched-{job}.out").read_text().split()[0] == "MARK=here"


def test_ntasks_reach_the_job(cluster: Cluster) -> None:
    job = cluster.submit("-n", "2", "-c", "1", "--wrap", "echo $SLURM_NTASKS $SLURM_CPUS_PER_TASK")
    ended = cluster.wait_state(job, "COMPLETED")
    assert ended["cpus"] == 2
    assert (cluster.work / f"gpusched-{job}.out").read_text().split() == ["2", "1"]


def test_test_only_says_when_and_where_and_stores_nothing(cluster: Cluster) -> None:
    before = len(cluster.jobs())
    now = cluster.run("gsubmit", "--test-only", "-G", "2", "--wrap", "true")
    assert now.returncode == 0, now.stderr
    lines = now.stderr.splitlines()
    assert lines[0] == "gsubmit: warning: --test-only: nothing was submitted"
    assert " using 2 GPUs on nodes node01 in partition gpu" in lines[1]
    assert now.stdout == "" and len(cluster.jobs()) == before
    big = cluster.submit("-G", "4", "-t", "1:00", "--wrap", "sleep 30")
    running = cluster.wait_state(big, "RUNNING")
    later = cluster.run("gsubmit", "--test-only", "-G", "1", "-t", "0:30", "--wrap", "true")
    assert later.returncode == 0, later.stderr
    from datetime import datetime, timedelta

    expected = (datetime.fromisoformat(running["start_time"]) + timedelta(minutes=1)).astimezone()
    when = datetime.fromisoformat(later.stderr.split(" to start at ")[1].split(" using")[0])
    assert abs((when.astimezone() - expected).total_seconds()) <= 2
    assert len(cluster.jobs()) == before + 1
    bad = cluster.run("gsubmit", "--test-only", "-G", "9", "--wrap", "true")
    assert bad.returncode == 2 and "no node in partition gpu has that" in bad.stderr
    cluster.run("gcancel", str(big))


def test_output_patterns_name_user_and_node(cluster: Cluster) -> None:
    job = cluster.submit("-J", "named", "-o", "%x-%u-%N-%j.log", "--wrap", "echo hi")
    ended = cluster.wait_state(job, "COMPLETED")
    assert (cluster.work / f"named-{ended['user']}-node01-{job}.log").read_text() == "hi\n"


def test_a_bare_gqueue_prints_what_gqueue_with_options_does(cluster: Cluster) -> None:
    """A bare ``gqueue`` takes its own quick path (no typer): the same lines."""
    held = [cluster.submit("-J", name, "--hold", "--wrap", "true") for name in ("a", "bb")]
    for job in held:  # once a pass has given their reason, nothing changes between reads
        wait_for(lambda: cluster.job(job)["reason"] == "JobHeldUser", what="JobHeldUser")
    bare = cluster.run("gqueue")
    assert bare.returncode == 0, bare.stderr
    assert bare.stdout == cluster.run("gqueue", "-t", "PD,R").stdout
    assert [line.split()[0] for line in bare.stdout.splitlines()[1:]] == [str(j) for j in held]
    cluster.run("gcancel", *map(str, held))


def test_field_table_matches_job_objects(cluster: Cluster) -> None:
    """``?fields=`` answers a table whose cells equal the full JOB objects' fields, for a
    running job (node, GPUs) and a held one, and server-side filters select as gqueue's."""
    running = cluster.submit("-J", "run", "-G", "2", "--wrap", "sleep 30")
    held = cluster.submit("-J", "wait", "-p", "debug", "--hold", "--wrap", "true")
    cluster.wait_state(running, "RUNNING")
    # Once a pass has given the held job its reason, nothing changes between the reads.
    wait_for(lambda: cluster.job(held)["reason"] == "JobHeldUser", what="JobHeldUser")
    full = {job["job_id"]: job for job in cluster.api("GET", "/v1/jobs")["jobs"]}
    every = ",".join(full[running])
    table = cluster.api("GET", f"/v1/jobs?fields={every}")
    assert table["fields"] == list(full[running])
    assert {row[0]: dict(zip(table["fields"], row)) for row in table["rows"]} == full
    assert full[running]["node"] == "node01" and len(full[running]["gpu_uuids"]) == 2
    slim = cluster.api("GET", "/v1/jobs?fields=state,display_id&partition=debug")
    assert slim == {"fields": ["state", "display_id"], "rows": [["PENDING", str(held)]]}
    assert cluster.api("GET", "/v1/jobs?name=run,x&fields=job_id")["rows"] == [[running]]
    assert cluster.api("GET", "/v1/jobs?account=nobody&fields=job_id")["rows"] == []
    with pytest.raises(UsageError, match="unknown JOB field 'colour'"):
        cluster.api("GET", "/v1/jobs?fields=state,colour")
    cluster.run("gcancel", str(running), str(held))
