"""squeue's, scancel's, sinfo's and sacct's options on gqueue, gcancel, ginfo and gacct,
on one live cluster shared by the module's tests (docs/cli.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.cluster import Cluster, wait_for
from tests.pg import ScratchPostgres


@pytest.fixture(scope="module")
def cluster(postgres: ScratchPostgres) -> Iterator[Cluster]:
    c = Cluster(postgres.fresh_database(), schedule_interval=0.5)
    try:
        yield c.up()
    finally:
        c.close()


def lines(cluster: Cluster, *args: str, env: dict[str, str] | None = None) -> list[str]:
    done = cluster.run(*args) if env is None else _run_env(cluster, args, env)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _run_env(cluster: Cluster, args: tuple[str, ...], env: dict[str, str]):  # type: ignore[no-untyped-def]
    import subprocess

    from tests.e2e.cluster import BIN

    return subprocess.run([str(BIN / args[0]), *args[1:]], env={**cluster.env, **env},
                          capture_output=True, text=True, timeout=30)


def test_gqueue_sort_format_array_and_filters(cluster: Cluster) -> None:
    a = cluster.submit("-J", "zeta", "--hold", "-t", "5:00", "--wrap", "true")
    b = cluster.submit("-J", "alpha", "--hold", "-t", "1:00", "--wrap", "true")
    arr = cluster.submit("-J", "arr", "--hold", "-a", "1-3", "--wrap", "true")
    dep = cluster.submit("-J", "dep", "-d", f"afterok:{a}", "--wrap", "true")
    mine = ["-j", f"{a},{b},{arr},{dep}"]
    # -S: by name; by time limit descending (numbers sort as numbers)
    assert lines(cluster, "gqueue", *mine, "-h", "-S", "j", "-o", "%j") == [
        "alpha", "arr", "dep", "zeta"]
    assert lines(cluster, "gqueue", "-j", f"{a},{b}", "-h", "-S", "-l", "-o", "%A")[0] == str(a)
    # -r: one pending task a line; without it, one folded line
    assert lines(cluster, "gqueue", "-j", str(arr), "-h", "-o", "%i") == [f"{arr}_[1-3]"]
    assert lines(cluster, "gqueue", "-j", str(arr), "-h", "-r", "-o", "%i %K") == [
        f"{arr}_1 1", f"{arr}_2 2", f"{arr}_3 3"]
    # %E: the dependency left, with its state
    assert lines(cluster, "gqueue", "-j", str(dep), "-h", "-o", "%E") == [
        f"afterok:{a}(unfulfilled)"]
    # -O names; -l's columns
    assert lines(cluster, "gqueue", "-j", str(b), "-O", "JobID:8,Name:6,TimeLimit")[1].split() \
        == [str(b), "alpha", "1:00"]
    assert lines(cluster, "gqueue", "-j", str(b), "-l")[0].split() == [
        "JOBID", "PARTITION", "NAME", "USER", "STATE", "TIME", "TIME_LIMI", "NODES",
        "NODELIST(REASON)"]
    # -q and -w filter on this side; -M names this cluster only
    assert lines(cluster, "gqueue", *mine, "-h", "-q", "nosuchqos") == []
    assert lines(cluster, "gqueue", *mine, "-h", "-w", "node01") == []  # none running
    assert lines(cluster, "gqueue", *mine, "-h", "-M", "gpusched", "-o", "%A") == [
        str(a), str(b), str(arr), str(dep)]
    assert lines(cluster, "gqueue", *mine, "-h", "-R", "maint") == []  # in no reservation
    assert lines(cluster, "gqueue", *mine, "-h", "-u", "0", "-o", "%A") == [  # root's uid
        str(a), str(b), str(arr), str(dep)]
    # squeue's states no job here is ever in select nothing
    assert lines(cluster, "gqueue", "-j", str(b), "-h", "-t", "CG,PD", "-o", "%A") == [str(b)]
    assert lines(cluster, "gqueue", "-j", str(b), "-h", "-t", "COMPLETING") == []
    other = cluster.run("gqueue", "-M", "elsewhere")
    assert other.returncode == 2 and "no cluster 'elsewhere'" in other.stderr
    # the input variables, Slurm's and ours (ours wins; the command line over both)
    env = {"SQUEUE_FORMAT": "%j", "SQUEUE_SORT": "-j", "GQUEUE_SORT": "j"}
    assert lines(cluster, "gqueue", *mine, "-h", env=env) == ["alpha", "arr", "dep", "zeta"]
    assert lines(cluster, "gqueue", *mine, "-h", "-o", "%A", "-S", "A", env=env) == [
        str(a), str(b), str(arr), str(dep)]
    refused = cluster.run("gqueue", "--federation")
    assert refused.returncode == 2 and "--federation: not supported" in refused.stderr
    cluster.run("gcancel", str(a), str(b), str(arr), str(dep))


def test_gqueue_steps(cluster: Cluster) -> None:
    from tests.e2e.cluster import BIN

    job = cluster.submit("-J", "stepper", "--wrap", f"{BIN}/gsrun -J inner sleep 30")
    wait_for(lambda: any(".0" in line for line in lines(cluster, "gqueue", "-s", "-h")),
             what="the step listed")
    row = [line for line in lines(cluster, "gqueue", "-s", "-h") if line.startswith(f"{job}.0")]
    assert row and row[0].split()[1] == "inner"
    cluster.run("gcancel", str(job))


def test_gcancel_filters_quiet_interactive(cluster: Cluster) -> None:
    import subprocess

    from tests.e2e.cluster import BIN

    a = cluster.submit("-J", "c1", "--hold", "--wrap", "true")
    b = cluster.submit("-J", "c2", "--hold", "--wrap", "true")
    c = cluster.submit("-J", "c3", "--hold", "--wrap", "true")
    # -q with a QOS no job has: nothing cancelled
    assert cluster.run("gcancel", "-q", "nosuchqos", "-n", "c1").returncode == 0
    assert cluster.job(a)["state"] == "PENDING"
    # -i: only the job answered y
    asked = subprocess.run([str(BIN / "gcancel"), "-i", str(a), str(b)], env=cluster.env,
                           input="n\ny\n", capture_output=True, text=True, timeout=30)
    assert asked.returncode == 0, asked.stderr
    assert f"Cancel job_id={a} name=c1 partition=gpu [y/n]?" in asked.stderr
    assert cluster.job(a)["state"] == "PENDING" and cluster.job(b)["state"] == "CANCELLED"
    # -Q: a job already ended says nothing and is no failure; without it, it is
    assert cluster.run("gcancel", str(b)).returncode == 1
    quiet = cluster.run("gcancel", "-Q", "-v", str(b), str(c))
    assert quiet.returncode == 0 and "error" not in quiet.stderr
    assert f"gcancel: cancel job {c}" in quiet.stderr
    assert cluster.job(c)["state"] == "CANCELLED"
    # -A chooses by account (no job here charges one); -b is refused naming it
    assert cluster.run("gcancel", "-A", "nobody", "-n", "c1").returncode == 0
    assert cluster.job(a)["state"] == "PENDING"
    assert cluster.run("gcancel", "-R", "maint", "-n", "c1").returncode == 0  # not in it
    assert cluster.job(a)["state"] == "PENDING"
    odd = cluster.run("gcancel", "-u", "x&all=1&user=root", "-n", "c1")  # one user's name
    assert odd.returncode == 0, odd.stderr
    assert cluster.job(a)["state"] == "PENDING"
    assert cluster.run("gcancel", "-w", "node01", "-t", "PD").returncode == 0  # runs nowhere
    assert cluster.job(a)["state"] == "PENDING"
    refused = cluster.run("gcancel", "-b", "-s", "USR1", str(a))
    assert refused.returncode == 2 and "-b: not supported" in refused.stderr
    cluster.run("gcancel", str(a))


def test_ginfo_formats_and_filters(cluster: Cluster) -> None:
    assert lines(cluster, "ginfo", "-h", "-o", "%R|%D|%t|%G|%N", "-S", "R") == [
        "debug|1|idle|gpu:4|node01", "gpu|1|idle|gpu:4|node01"]
    assert lines(cluster, "ginfo", "-s", "-p", "gpu")[1].split() == [
        "gpu*", "up", "1-00:00:00", "0/1/0/1", "node01"]
    assert lines(cluster, "ginfo", "-N", "-h", "-O", "NodeList:8,Partition:6,StateLong") == [
        "node01   debug  idle", "node01   gpu*   idle"]
    assert lines(cluster, "ginfo", "-h", "-t", "down", "-o", "%N") == []
    assert lines(cluster, "ginfo", "-h", "-d", "-o", "%N") == []
    assert lines(cluster, "ginfo", "-h", "-r", "-n", "node01", "-p", "debug", "-o", "%N") == [
        "node01"]
    assert lines(cluster, "ginfo", "-h", "-p", "nosuch") == []
    assert lines(cluster, "ginfo", env={"SINFO_FORMAT": "%P"}) == ["PARTITION", "debug", "gpu*"]
    assert lines(cluster, "ginfo", "-h", "-e", "-p", "gpu", "-o", "%P %D %G") == ["gpu* 1 gpu:4"]
    cpus, memory = lines(cluster, "ginfo", "-h", "-N", "-p", "gpu", "-o", "%c %m")[0].split()
    assert cpus.isdigit() and memory.isdigit()  # as the agent reports them
    for bad, says in ((["-o", "%C"], "%C is not supported"),
                      (["-t", "weird"], "invalid --states 'weird'"),
                      (["-M", "far"], "no cluster 'far'")):
        done = cluster.run("ginfo", *bad)
        assert done.returncode == 2 and says in done.stderr, (bad, done.stderr)


def test_gacct_formats_filters_and_runs(cluster: Cluster) -> None:
    done = cluster.submit("-J", "acct1", "-G", "1", "-t", "10:00", "--wrap", "true")
    twice = cluster.submit("-J", "acct2", "-G", "1", "--wrap", "sleep 3")
    cluster.wait_state(done, "COMPLETED")
    cluster.wait_state(twice, "RUNNING")
    assert cluster.run("gcontrol", "requeue", str(twice)).returncode == 0
    cluster.wait_state(twice, "COMPLETED", timeout=30)
    ids = f"{done},{twice}"
    assert lines(cluster, "gacct", "-j", ids, "-X", "-n", "-P", "-o", "JobID,JobName,State,Timelimit",
                 "--delimiter", ";") == [f"{done};acct1;COMPLETED;10:00", f"{twice};acct2;COMPLETED;1-00:00:00"]
    # -D: the first run of the requeued job on a row of its own, REQUEUED
    runs = lines(cluster, "gacct", "-j", str(twice), "-X", "-D", "-n", "-P", "-b")
    assert runs == [f"{twice}|REQUEUED|0:0", f"{twice}|COMPLETED|0:0"]
    assert lines(cluster, "gacct", "-j", str(twice), "-X", "-n", "-P", "-b") == [
        f"{twice}|COMPLETED|0:0"]
    # client-side filters
    assert lines(cluster, "gacct", "-j", ids, "-X", "-n", "-P", "-o", "jobid", "--name", "acct2"
                 ) == [str(twice)]
    assert lines(cluster, "gacct", "-j", ids, "-X", "-n", "-P", "-o", "jobid", "-K", "30:00"
                 ) == [str(done)]
    assert lines(cluster, "gacct", "-j", ids, "-X", "-n", "-P", "-o", "NodeList", "-N", "node01"
                 ) == ["node01", "node01"]
    assert lines(cluster, "gacct", "-j", ids, "-X", "-n", "-P", "-o", "jobid", "-q", "nosuch") == []
    assert lines(cluster, "gacct", "-j", str(done), "-X", "-n", "-o", "JobID%4,State%6") == [
        f"{done:>4} COMPL+"]  # fixed widths, cut with a +
    assert lines(cluster, "gacct", "-j", str(done), "-X", "-n", "-P",
                 env={"SACCT_FORMAT": "JobName,ExitCode"}) == ["acct1|0:0"]
    waiting = cluster.submit("-J", "acct3", "--hold", "--wrap", "true")
    assert lines(cluster, "gacct", "-j", str(waiting), "-X", "-n", "-P", "-b") == []
    assert lines(cluster, "gacct", "-j", str(waiting), "-s", "PD", "-X", "-n", "-P", "-b") == [
        f"{waiting}|PENDING|0:0"]  # pending ones only when asked for, as sacct -s PD
    cluster.run("gcancel", str(waiting))
    script = lines(cluster, "gacct", "-B", "-j", str(done))
    assert script[0] == f"Batch Script for {done}" and "true" in script
    assert "JobID" in lines(cluster, "gacct", "-e")[0]
    import grp

    root_group = grp.getgrgid(0).gr_name
    assert lines(cluster, "gacct", "-j", ids, "-X", "-n", "-P", "-o", "JobID,GID,Group",
                 "-g", root_group) == [f"{done}|0|{root_group}", f"{twice}|0|{root_group}"]
    assert lines(cluster, "gacct", "-j", ids, "-X", "-n", "-P", "-g", "65533") == []
    for bad, says in ((["-o", "Bogus"], "no field 'Bogus'"),
                      (["-g", "nosuchgroup"], "invalid --gid 'nosuchgroup'"),
                      (["-M", "far"], "no cluster 'far'"), (["-i", "x"], "invalid --nnodes"),
                      (["--units", "X"], "invalid --units 'X'")):
        failed = cluster.run("gacct", *bad)
        assert failed.returncode == 2 and says in failed.stderr, (bad, failed.stderr)


def test_requeue_of_a_finished_job_and_requeuehold(cluster: Cluster) -> None:
    job = cluster.submit("-J", "again", "-G", "1", "--wrap", "true")
    cluster.wait_state(job, "COMPLETED")
    done = cluster.run("gcontrol", "requeue", str(job))
    assert done.returncode == 0, done.stderr
    wait_for(lambda: (lambda j: j["restarts"] == 1 and j["state"] == "COMPLETED")(
        cluster.job(job)), what="the finished job requeued and run again")
    again = cluster.job(job)
    assert again["exit_code"] == 0 and again["end_time"] is not None
    assert lines(cluster, "gacct", "-j", str(job), "-X", "-D", "-n", "-P", "-o", "State") == [
        "REQUEUED", "COMPLETED"]
    # requeuehold: back in the queue, held (root's hold is an administrator's)
    assert cluster.run("gcontrol", "requeuehold", str(job)).returncode == 0
    held = cluster.job(job)
    assert (held["state"], held["hold"], held["restarts"], held["exit_code"]) == (
        "PENDING", "admin", 2, None)
    wait_for(lambda: cluster.job(job)["reason"] == "JobHeldAdmin", what="the hold seen")
    assert cluster.run("gcontrol", "release", str(job)).returncode == 0
    wait_for(lambda: (lambda j: j["restarts"] == 2 and j["state"] == "COMPLETED")(
        cluster.job(job)), what="the released job run a third time")
    running = cluster.submit("--wrap", "sleep 30")
    cluster.wait_state(running, "RUNNING")
    assert cluster.run("gcontrol", "requeuehold", str(running)).returncode == 0
    wait_for(lambda: (lambda j: j["state"] == "PENDING" and j["hold"] == "admin")(
        cluster.job(running)), what="the running job back in the queue, held")
    pending = cluster.submit("--hold", "--wrap", "true")
    refused = cluster.run("gcontrol", "requeue", str(pending))
    assert refused.returncode == 1 and "only running and ended batch jobs" in refused.stderr
    special = cluster.run("gcontrol", "requeuehold", "State=SpecialExit", str(pending))
    assert special.returncode == 2 and "State=SpecialExit: not supported" in special.stderr
    cluster.run("gcancel", str(pending), str(running))


def test_gcontrol_update_node_as_scontrol(cluster: Cluster) -> None:
    drained = cluster.run("gcontrol", "update", "NodeName=node01", "State=DRAIN",
                          "Reason=fan check")
    assert drained.returncode == 0, drained.stderr
    assert drained.stdout.strip() == "node node01 drained: fan check"
    assert lines(cluster, "ginfo", "-h", "-N", "-o", "%N %T %E", "-p", "gpu") == [
        "node01 drained fan check"]
    back = cluster.run("gcontrol", "update", "node", "node01", "State=RESUME")
    assert back.returncode == 0 and back.stdout.strip() == "node node01 is UP", back.stderr
    missing = cluster.run("gcontrol", "update", "node", "nope", "State=RESUME")
    assert missing.returncode == 1 and "nope" in missing.stderr
    for bad, says in ((["listpids", "1"], "listpids: not supported"),
                      (["-o", "show", "job", "1"], "-o: not supported"),
                      (["update", "node", "node01", "State=DOWN"], "State=DOWN: not supported")):
        done = cluster.run("gcontrol", *bad)
        assert done.returncode == 2 and says in done.stderr, (bad, done.stderr)


def test_gqueue_priorities(cluster: Cluster) -> None:
    held = cluster.submit("-J", "p1", "--hold", "--wrap", "true")
    big = cluster.submit("-J", "p2", "-b", "now+1hour", "--wrap", "true")  # waits an hour
    rows = lines(cluster, "gqueue", "-j", f"{held},{big}", "-h", "-o", "%A %Q %p", "-S", "-Q")
    got = {int(r.split()[0]): r.split()[1:] for r in rows}
    assert got[held] == ["0", "0.00000000"]  # held: 0, as Slurm shows it
    assert int(got[big][0]) > 0 and 0.0 < float(got[big][1]) <= 1.0
    assert [int(r.split()[0]) for r in rows] == [big, held]  # -S -Q: highest first
    cluster.run("gcancel", str(held), str(big))
