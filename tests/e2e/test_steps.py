"""Job steps end to end on ``gpusched up --nodes 2``: a two-node job whose script runs
``gsrun`` gets a task on each node with its own rank, its node's GPUs and a reachable
MASTER_ADDR; a rendezvous over stdlib sockets (as torch.distributed's TCP store does
before NCCL) completes across the nodes; ``--kill-on-bad-exit`` stops a step when one
task fails; cancelling the job ends its steps; gacct shows the steps."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import wait_for

BIN = Path(sys.executable).parent
PY = sys.executable
RENDEZVOUS = r"""
import os, socket, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if rank == 0:
    server = socket.create_server((addr, port))
    server.settimeout(60)
    peers, ranks = [], [0]
    for _ in range(world - 1):
        conn, _ = server.accept()
        ranks.append(int(conn.recv(64)))
        peers.append(conn)
    everyone = ",".join(map(str, sorted(ranks)))
    for conn in peers:
        conn.sendall(everyone.encode())
        conn.close()
else:
    deadline = time.time() + 60
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)
    conn.sendall(str(rank).encode())
    everyone = conn.recv(64).decode()
print(f"rank {rank} of {world} on {os.environ['SLURMD_NODENAME']} "
      f"gpus {os.environ['CUDA_VISIBLE_DEVICES']} sees {everyone}", flush=True)
"""
SHOW = (f"{PY} -c \"import os; e = os.environ; print(' '.join(e.get(k, '-') for k in "
        "('SLURM_PROCID', 'RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'SLURM_NODEID', "
        "'SLURM_STEP_ID', 'SLURMD_NODENAME', 'CUDA_VISIBLE_DEVICES', 'MASTER_ADDR', "
        "'MASTER_PORT')))\"")


class LocalCluster:
    """``gpusched up --nodes 2 --gpus 2`` in a state directory of its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {**os.environ, "XDG_STATE_HOME": str(root)}
        for name in ("GPUSCHED_SOCKET", "GPUSCHED_CONTROLLERS", "GPUSCHED_CONFIG",
                     "SLURM_JOB_ID", "GPUSCHED_JOB_ID"):
            self.env.pop(name, None)
        self.socket = root / "gpusched" / "controller.sock"

    def run(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / args[0]), *args[1:]], env=self.env,
                              capture_output=True, text=True, cwd=self.root, timeout=timeout)

    def api(self, method: str, path: str) -> dict[str, Any]:
        from gpusched.client import ApiClient

        with ApiClient(self.socket, timeout=10) as client:
            return client.request(method, path)

    def submit_script(self, name: str, body: str, *args: str) -> int:
        script = self.root / f"{name}.sh"
        script.write_text("#!/bin/bash\n" + body)
        result = self.run("gsubmit", "--parsable", "-N", "2", "--gpus", "4", "-t", "10",
                          *args, str(script))
        assert result.returncode == 0, result.stderr
        return int(result.stdout.strip())

    def job(self, job_id: int) -> dict[str, Any]:
        return self.api("GET", f"/v1/jobs/{job_id}")

    def wait_ended(self, job_id: int, timeout: float = 90) -> dict[str, Any]:
        return wait_for(lambda: (job := self.job(job_id))["state"] not in
                        ("PENDING", "RUNNING") and job, timeout=timeout,
                        what=f"job {job_id} to end", seen=lambda: (self.job(job_id),
                                                                   self.output(job_id)))

    def output(self, job_id: int) -> str:
        """The job's output, less gsrun's notes that a step waited for the one before
        it to be recorded as ended (srun's "step creation temporarily disabled"): how
        soon the nodes report a step's end is a race these tests do not look at."""
        path = self.root / f"gpusched-{job_id}.out"
        text = path.read_text() if path.exists() else ""
        return "".join(line for line in text.splitlines(keepends=True)
                       if not line.startswith(WAITED))

    def node_gpus(self) -> dict[str, list[str]]:
        return {n["name"]: [g["uuid"] for g in n["gpus"]]
                for n in self.api("GET", "/v1/nodes")["nodes"]}


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="gpusched-steps-"))
    os.chmod(root, 0o755)  # the PostgreSQL user must reach the data directory
    cluster = LocalCluster(root)
    try:
        started = cluster.run("gpusched", "up", "--nodes", "2", "--gpus", "2")
        assert started.returncode == 0, started.stdout + started.stderr
        wait_for(lambda: sum(n["state"] == "UP" for n in cluster.api("GET", "/v1/nodes")
                             ["nodes"]) == 2, timeout=120, what="both nodes UP")
        yield cluster
    finally:
        cluster.run("gpusched", "down")
        shutil.rmtree(root, ignore_errors=True)


WAITED = ("gsrun: step creation temporarily disabled", "gsrun: step created for job ")
FIELDS = ("label", "procid", "rank", "local_rank", "world", "nodeid", "step", "node", "cuda",
          "master", "port")


def task_rows(lines: list[str]) -> dict[int, dict[str, str]]:
    """Each task's line of SHOW (labelled), by rank."""
    rows = [dict(zip(FIELDS, line.split())) for line in lines]
    return {int(row["rank"]): row for row in rows}


def test_tasks_get_their_ranks_their_nodes_gpus_and_a_master(two_nodes: LocalCluster) -> None:
    job = two_nodes.submit_script("ranks", f"""
{BIN}/gsrun -l {SHOW}
echo "gsrun exit $?"
{BIN}/gsrun -N2 -n4 --gpus-per-task 1 -l {SHOW}
echo "gsrun exit $?"
""")
    ended = two_nodes.wait_ended(job)
    out = two_nodes.output(job)
    assert ended["state"] == "COMPLETED", out
    lines = out.splitlines()
    assert lines.count("gsrun exit 0") == 2, out
    split = lines.index("gsrun exit 0")
    gpus = two_nodes.node_gpus()
    # Step 0: one task per node, ranks 0 and 1, each with all its own node's GPUs.
    first = task_rows(lines[:split])
    assert sorted(first) == [0, 1], out
    assert {first[r]["node"] for r in (0, 1)} == {"node1", "node2"}, out
    for rank, row in first.items():
        assert row["label"] == f"{rank}:" and row["procid"] == str(rank)
        assert (row["local_rank"], row["world"], row["step"]) == ("0", "2", "0")
        assert row["nodeid"] == str(rank)
        assert sorted(row["cuda"].split(",")) == sorted(gpus[row["node"]]), (row, gpus)
        assert row["master"] == "127.0.0.1" and 29500 <= int(row["port"]) < 31500
    assert first[0]["port"] == first[1]["port"]
    # Step 1: two tasks on each node (block layout), one GPU each, none shared.
    second = task_rows(lines[split + 1:-1])
    assert sorted(second) == [0, 1, 2, 3], out
    assert [second[r]["node"] for r in range(4)] == [first[0]["node"]] * 2 + [
        first[1]["node"]] * 2
    assert [second[r]["local_rank"] for r in range(4)] == ["0", "1", "0", "1"]
    assert [second[r]["nodeid"] for r in range(4)] == ["0", "0", "1", "1"]
    assert {second[r]["step"] for r in range(4)} == {"1"} and {
        second[r]["world"] for r in range(4)} == {"4"}
    cudas = [second[r]["cuda"] for r in range(4)]
    assert len(set(cudas)) == 4 and all(c in gpus[second[r]["node"]]
                                        for r, c in enumerate(cudas)), (cudas, gpus)


def test_a_rendezvous_completes_across_the_two_nodes(two_nodes: LocalCluster) -> None:
    (two_nodes.root / "rendezvous.py").write_text(RENDEZVOUS)
    job = two_nodes.submit_script("rendezvous", f"""
{BIN}/gsrun -N2 --ntasks-per-node 2 {PY} {two_nodes.root}/rendezvous.py
echo "gsrun exit $?"
""")
    ended = two_nodes.wait_ended(job)
    out = two_nodes.output(job)
    assert ended["state"] == "COMPLETED", out
    seen = sorted(line for line in out.splitlines() if line.startswith("rank "))
    assert len(seen) == 4, out
    assert all(line.endswith("sees 0,1,2,3") and " of 4 on " in line for line in seen), out
    assert {line.split()[5] for line in seen} == {"node1", "node2"}
    assert out.splitlines()[-1] == "gsrun exit 0"


def test_kill_on_bad_exit_stops_the_step_and_gacct_shows_the_steps(
        two_nodes: LocalCluster) -> None:
    job = two_nodes.submit_script("badexit", f"""
{BIN}/gsrun -J fine true
start=$(date +%s)
{BIN}/gsrun -K -J bad bash -c 'if [ "$SLURM_PROCID" = 1 ]; then sleep 0.5; exit 3; fi; exec sleep 300'
echo "gsrun exit $? after $(( $(date +%s) - start )) s"
""")
    ended = two_nodes.wait_ended(job, timeout=120)
    out = two_nodes.output(job)
    assert ended["state"] == "COMPLETED", out
    last = out.splitlines()[-1].split()
    assert last[:3] == ["gsrun", "exit", "3"], out
    assert int(last[4]) < 60, out  # the sleeping task was killed, not waited for
    assert ": task 1: Exited with exit code 3" in out and "gsrun: error: node" in out
    answer = json.loads(two_nodes.run("gacct", "-j", str(job), "--json").stdout)
    record = next(r for r in answer["jobs"] if r["job_id"] == job)
    steps = {str(s["step"]): s for s in record["steps"]}
    assert steps["0"]["state"] == "COMPLETED" and steps["0"]["exit_code"] == 0
    assert steps["1"]["state"] == "FAILED" and steps["1"]["exit_code"] == 3
    table = two_nodes.run("gacct", "-j", str(job))
    assert table.returncode == 0, table.stderr
    ids = [line.split()[0] for line in table.stdout.splitlines()[1:]]
    assert ids[:1] == [str(job)] and {f"{job}.batch", f"{job}.0", f"{job}.1"} <= set(ids)
    one = two_nodes.run("gacct", "-j", f"{job}.1")
    assert one.returncode == 0 and [line.split()[0] for line in
                                    one.stdout.splitlines()[1:]] == [f"{job}.1"], one.stdout
    allocations = two_nodes.run("gacct", "-X", "-j", str(job))
    assert [line.split()[0] for line in allocations.stdout.splitlines()[1:]] == [str(job)]


def test_cancelling_the_job_ends_its_steps_on_every_node(two_nodes: LocalCluster) -> None:
    marker = two_nodes.root / "cancel-marker"
    job = two_nodes.submit_script("cancel", f"""
{BIN}/gsrun -N2 bash -c 'echo $$ > {marker}.$SLURM_PROCID; exec sleep 300'
""")
    pids = wait_for(lambda: all((two_nodes.root / f"cancel-marker.{r}").exists()
                                and (two_nodes.root / f"cancel-marker.{r}").read_text().strip()
                                for r in (0, 1)) and
                    [int((two_nodes.root / f"cancel-marker.{r}").read_text()) for r in (0, 1)],
                    timeout=60, what="both tasks running",
                    seen=lambda: two_nodes.output(job))
    assert two_nodes.run("gcancel", str(job)).returncode == 0
    ended = two_nodes.wait_ended(job)
    assert ended["state"] == "CANCELLED"

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    wait_for(lambda: all(gone(p) for p in pids), timeout=30, what="the step's tasks to end")
    steps = wait_for(lambda: [s for s in two_nodes.api("GET", f"/v1/jobs/{job}/steps")["steps"]
                              if s["state"] != "RUNNING"], timeout=30, what="the step to end")
    assert [s["state"] for s in steps] == ["CANCELLED"]


def test_a_time_limit_changed_while_a_step_runs_moves_its_end_on_every_node(
        two_nodes: LocalCluster) -> None:
    marker = two_nodes.root / "limit-marker"
    script = two_nodes.root / "limit.sh"
    script.write_text(f"#!/bin/bash\n{BIN}/gsrun -N2 bash -c "
                      f"'echo $$ > {marker}.$SLURM_PROCID; exec sleep 300'\n")
    submitted = two_nodes.run("gsubmit", "--parsable", "-N", "2", "--gpus", "4",
                              "-t", "0:15", str(script))
    assert submitted.returncode == 0, submitted.stderr
    job = int(submitted.stdout.strip())
    files = [two_nodes.root / f"limit-marker.{r}" for r in (0, 1)]
    pids = wait_for(lambda: all(f.exists() and f.read_text().strip() for f in files)
                    and [int(f.read_text()) for f in files], timeout=60,
                    what="both tasks running", seen=lambda: two_nodes.output(job))
    raised = two_nodes.run("gcontrol", "update", "job", str(job), "TimeLimit=5:00")
    assert raised.returncode == 0, raised.stderr
    started = two_nodes.job(job)["start_time"]
    old_end = datetime.fromisoformat(started).timestamp() + 15
    # Past the old limit and its kill grace, both tasks (the second on the node that
    # does not run the batch script) and the step still run.
    while time.time() < old_end + 6:
        for pid in pids:
            os.kill(pid, 0)
        steps = two_nodes.api("GET", f"/v1/jobs/{job}/steps")["steps"]
        assert [s["state"] for s in steps] == ["RUNNING"], steps
        time.sleep(0.5)
    assert two_nodes.job(job)["state"] == "RUNNING"
    # Lowered below what it has run: it ends now, its step TIMEOUT.
    lowered = two_nodes.run("gcontrol", "update", "job", str(job), "TimeLimit=0:01")
    assert lowered.returncode == 0, lowered.stderr
    assert two_nodes.wait_ended(job)["state"] == "TIMEOUT"
    steps = wait_for(lambda: [s for s in two_nodes.api("GET", f"/v1/jobs/{job}/steps")["steps"]
                              if s["state"] != "RUNNING"], timeout=30, what="the step to end")
    assert [s["state"] for s in steps] == ["TIMEOUT"]


def test_gsrun_outside_a_job_and_in_a_job_that_ended(two_nodes: LocalCluster) -> None:
    # Outside a job gsrun gets an allocation first (tests/e2e/test_allocations.py): one
    # the controller refuses is one error line, and nothing runs.
    outside = two_nodes.run("gsrun", "-p", "nosuch", "true")
    assert (outside.returncode, outside.stderr) == (
        2, "gsrun: error: invalid partition specified: nosuch\n")
    job = two_nodes.submit_script("quick", "true\n")
    two_nodes.wait_ended(job)
    late = subprocess.run([str(BIN / "gsrun"), "true"], env={**two_nodes.env,
                          "SLURM_JOB_ID": str(job)}, capture_output=True, text=True,
                          timeout=60, cwd=two_nodes.root)
    assert late.returncode == 1 and late.stdout == "", late
    assert late.stderr.startswith("gsrun: error: ") and late.stderr.count("\n") == 1


def test_stdin_reaches_task_0_and_output_files_are_per_task(two_nodes: LocalCluster) -> None:
    job = two_nodes.submit_script("files", f"""
echo "to task zero" | {BIN}/gsrun -N2 -l bash -c 'cat; echo "done $SLURM_PROCID"'
{BIN}/gsrun -N2 -o {two_nodes.root}/out-%j-%t.txt bash -c 'echo "file of $SLURM_PROCID"'
echo "files $?"
""")
    ended = two_nodes.wait_ended(job)
    out = two_nodes.output(job)
    assert ended["state"] == "COMPLETED", out
    lines = out.splitlines()
    assert sorted(lines[:3]) == ["0: done 0", "0: to task zero", "1: done 1"], out
    assert lines.index("0: to task zero") < lines.index("0: done 0")
    assert lines[3:] == ["files 0"], out
    for task in (0, 1):
        assert (two_nodes.root / f"out-{job}-{task}.txt").read_text() == f"file of {task}\n"
