"""A node's part of a job step: the real step supervisor, started by the agent's
StepRunner through the supervisor spawner, against a stand-in for gsrun made of a
real listening socket that reads and writes stepio frames."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpusched.agent.cgroups import detect
from gpusched.agent.confine import Confinement
from gpusched.agent.steps import StepRunner, node_address
from gpusched.agent.stepspec import step_cgroup_spec, step_spec, task_environment
from gpusched.client.endpoints import Endpoint
from gpusched.messages import stepio
from gpusched.messages.steps import StepIO, StepLaunch, StepTask


class FakeGsrun:
    """gsrun's I/O socket: accepts the step's nodes and keeps every frame they send."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.token = secrets.token_hex(32)
        self.frames: list[stepio.Frame] = []
        self.connections: list[socket.socket] = []
        self.closed = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        decoder = stepio.Decoder(stepio.FROM_NODE)
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                data = b""
            if not data:
                self.closed.set()
                return
            frames = decoder.feed(data)
            with self._lock:
                self.frames.extend(frames)

    def send(self, kind: int, task: int, payload: bytes) -> None:
        with self._lock:
            conn = self.connections[0]
        conn.sendall(stepio.encode(kind, task, payload))

    def of(self, kind: int, task: int | None = None) -> list[stepio.Frame]:
        with self._lock:
            return [f for f in self.frames if f.kind == kind and (task is None or f.task == task)]

    def text(self, kind: int, task: int) -> str:
        return b"".join(f.payload for f in self.of(kind, task)).decode()

    def exits(self) -> dict[int, tuple[int | None, int | None]]:
        return {f.task: stepio.check_exit(f) for f in self.of(stepio.EXIT)}

    def io(self) -> StepIO:
        return StepIO("127.0.0.1", self.port, self.token)

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            for conn in self.connections:
                try:
                    conn.shutdown(socket.SHUT_RDWR)  # a reader blocked in recv wakes up
                except OSError:
                    pass
                conn.close()


@pytest.fixture
def gsrun() -> Iterator[FakeGsrun]:
    fake = FakeGsrun()
    yield fake
    fake.close()


@pytest.fixture
def runner() -> Iterator[StepRunner]:
    path = Path(tempfile.mkdtemp(prefix="gpusched-steps-", dir="/tmp"))
    runner = StepRunner(path / "steps", "node-b")
    yield runner
    for job_id, step_id in runner.running():
        runner.cancel(job_id, step_id)
    runner.close()
    shutil.rmtree(path, ignore_errors=True)


GPU_A, GPU_B = "GPU-00000000-0000-0000-0000-00000000000a", "GPU-00000000-0000-0000-0000-00000000000b"


def launch_for(io: StepIO, argv: list[str], work_dir: str, **fields: Any) -> StepLaunch:
    """Node b's part (index 1) of a 4-task step over nodes a and b: tasks 2 and 3."""
    base = StepLaunch(
        job_id=41, run=0, step_id=3, node="node-b", node_index=1, name="sh",
        job_name="train", user="root", uid=0, gid=0, argv=tuple(argv), work_dir=work_dir,
        tasks=(StepTask(2, 0, (GPU_A,)), StepTask(3, 1, (GPU_B,))), ntasks=4,
        node_names=("node-a", "node-b"), tasks_per_node=(2, 2), master_addr="10.1.2.3",
        master_port=29793, io=io, environment={"PATH": "/usr/bin:/bin", "KEEP": "yes"},
        gpu_uuids=(GPU_A, GPU_B))
    return replace(base, **fields)


def start(runner: StepRunner, launch: StepLaunch, **spec_fields: Any) -> Path:
    spec = {**step_spec(launch, kill_grace=0.5, min_uid=0), **spec_fields}
    assert runner.start(launch, spec)
    return runner.stepdir(launch.job_id, launch.step_id)


def ended(runner: StepRunner, wait_for: Callable[..., Any], job_id: int = 41,
          step_id: int = 3, timeout: float = 15.0, gsrun: FakeGsrun | None = None) -> Any:
    """The step's end, once reported; with ``gsrun``, once gsrun has also read all
    the node sent (the node closes its connection after its last frame)."""
    def find() -> Any:
        return next((d.end for d in runner.wait_ended(0.05)
                     if (d.job_id, d.step_id) == (job_id, step_id)), None)
    end = wait_for(find, f"step {job_id}.{step_id} to end", timeout=timeout)
    if gsrun is not None:
        wait_for(gsrun.closed.is_set, "the node to close its connection to gsrun")
    return end


SHOW = ("echo rank=$RANK local=$LOCAL_RANK procid=$SLURM_PROCID "
        "g=$GPUSCHED_PROCID cuda=$CUDA_VISIBLE_DEVICES master=$MASTER_ADDR:$MASTER_PORT "
        "world=$WORLD_SIZE nodeid=$SLURM_NODEID tpn=$SLURM_STEP_TASKS_PER_NODE "
        "keep=$KEEP; echo to-stderr >&2; exit $SLURM_LOCALID")


def test_tasks_run_with_their_ranks_and_stream_output(
        runner: StepRunner, gsrun: FakeGsrun, work_dir: Path,
        wait_for: Callable[..., Any]) -> None:
    start(runner, launch_for(gsrun.io(), ["/bin/sh", "-c", SHOW], str(work_dir)))
    end = ended(runner, wait_for, gsrun=gsrun)

    hello = stepio.check_hello(gsrun.of(stepio.HELLO)[0], gsrun.token, 41, 3)
    assert (hello.node_index, hello.tasks) == (1, (2, 3))
    assert gsrun.text(stepio.STDOUT, 2) == (
        f"rank=2 local=0 procid=2 g=2 cuda={GPU_A} master=10.1.2.3:29793 world=4 nodeid=1 "
        "tpn=2(x2) keep=yes\n")
    assert gsrun.text(stepio.STDOUT, 3).startswith(f"rank=3 local=1 procid=3 g=3 cuda={GPU_B}")
    assert gsrun.text(stepio.STDERR, 3) == "to-stderr\n"
    assert gsrun.exits() == {2: (0, None), 3: (1, None)}
    # Each task's output comes before its EXIT.
    kinds = [(f.kind, f.task) for f in gsrun.frames]
    assert kinds.index((stepio.STDOUT, 3)) < kinds.index((stepio.EXIT, 3))
    assert (end.node, end.outcome, end.exit_code, end.signal) == ("node-b", "failed", 1, None)
    assert end.tasks == ((2, 0, None), (3, 1, None))
    assert end.cpu_usec is not None and end.max_rss_bytes and end.max_rss_bytes > 0
    wait_for(gsrun.closed.is_set, "the node to close its connection")


def test_a_step_that_succeeds_everywhere_is_completed(
        runner: StepRunner, gsrun: FakeGsrun, work_dir: Path,
        wait_for: Callable[..., Any]) -> None:
    start(runner, launch_for(gsrun.io(), ["true"], str(work_dir)))
    end = ended(runner, wait_for, gsrun=gsrun)
    assert (end.outcome, end.exit_code) == ("completed", 0)
    runner.mark_reported(41, 3)
    assert not runner.stepdir(41, 3).exists() and runner.unreported() == []


def test_tasks_run_as_the_jobs_user_writing_their_own_files(
        runner: StepRunner, gsrun: FakeGsrun, user_dir: Path,
        test_user: pwd.struct_passwd, wait_for: Callable[..., Any]) -> None:
    launch = launch_for(gsrun.io(), ["/bin/sh", "-c", "id -u; echo oops >&2"], str(user_dir),
                        user=test_user.pw_name, uid=test_user.pw_uid, gid=test_user.pw_gid,
                        output="out-%j.%s-%t-%n.txt", umask=0o077)
    start(runner, launch)
    assert ended(runner, wait_for, gsrun=gsrun).outcome == "completed"

    for task in (2, 3):
        path = user_dir / f"out-41.3-{task}-1.txt"
        assert path.read_text() == f"{test_user.pw_uid}\noops\n"
        assert path.stat().st_uid == test_user.pw_uid
        assert path.stat().st_mode & 0o777 == 0o600
    assert gsrun.of(stepio.STDOUT) == [] and gsrun.of(stepio.STDERR) == []
    assert set(gsrun.exits()) == {2, 3}


def test_stdin_goes_to_global_task_zero_alone(
        runner: StepRunner, gsrun: FakeGsrun, work_dir: Path,
        wait_for: Callable[..., Any]) -> None:
    launch = launch_for(gsrun.io(), ["/bin/cat"], str(work_dir), node_index=0, node="node-a",
                        tasks=(StepTask(0, 0, ()), StepTask(1, 1, ())))
    start(runner, launch)
    wait_for(lambda: gsrun.of(stepio.EXIT, 1), "task 1 to end (its stdin is /dev/null)")
    gsrun.send(stepio.STDIN, 0, b"hello ")
    gsrun.send(stepio.STDIN, 0, b"world\n")
    gsrun.send(stepio.STDIN, 0, b"")
    end = ended(runner, wait_for, gsrun=gsrun)
    assert gsrun.text(stepio.STDOUT, 0) == "hello world\n"
    assert gsrun.text(stepio.STDOUT, 1) == ""
    assert end.outcome == "completed"


def test_a_signal_frame_reaches_every_task(
        runner: StepRunner, gsrun: FakeGsrun, work_dir: Path,
        wait_for: Callable[..., Any]) -> None:
    script = 'trap "exit 7" USR1; echo ready; while :; do sleep 0.05; done'
    start(runner, launch_for(gsrun.io(), ["/bin/sh", "-c", script], str(work_dir)))
    wait_for(lambda: "ready" in gsrun.text(stepio.STDOUT, 2)
             and "ready" in gsrun.text(stepio.STDOUT, 3), "both tasks to start")
    gsrun.send(stepio.SIGNAL, 0, str(int(signal.SIGUSR1)).encode())
    end = ended(runner, wait_for, gsrun=gsrun)
    assert gsrun.exits() == {2: (7, None), 3: (7, None)}
    assert (end.outcome, end.exit_code) == ("failed", 7)


def test_cancel_and_a_delivered_signal(
        runner: StepRunner, gsrun: FakeGsrun, work_dir: Path,
        wait_for: Callable[..., Any]) -> None:
    script = 'trap "echo got-hup" HUP; echo ready; while :; do sleep 0.05; done'
    stepdir = start(runner, launch_for(gsrun.io(), ["/bin/sh", "-c", script], str(work_dir)))
    wait_for(lambda: "ready" in gsrun.text(stepio.STDOUT, 3)
             and (stepdir / "supervisor.json").exists(), "the tasks to start")
    assert runner.cancel(41, 3, int(signal.SIGHUP))
    wait_for(lambda: "got-hup" in gsrun.text(stepio.STDOUT, 2), "the HUP to be delivered")
    assert runner.running() == [(41, 3)]
    assert runner.cancel(41, 3)
    end = ended(runner, wait_for, gsrun=gsrun)
    assert (end.outcome, end.signal) == ("cancelled", signal.SIGTERM)
    assert gsrun.exits() == {2: (None, 15), 3: (None, 15)}
    assert not runner.cancel(41, 3)


def test_the_jobs_end_ends_its_steps_only(
        runner: StepRunner, gsrun: FakeGsrun, work_dir: Path,
        wait_for: Callable[..., Any]) -> None:
    forever = ["/bin/sh", "-c", "exec sleep 600"]
    for step in (3, 4):
        start(runner, launch_for(gsrun.io(), forever, str(work_dir), step_id=step))
    start(runner, launch_for(gsrun.io(), forever, str(work_dir), job_id=42, step_id=0))
    wait_for(lambda: len(runner.running()) == 3, "three steps to run")
    assert runner.end_job(41, run=0) == [3, 4]
    assert ended(runner, wait_for, 41, 3).outcome == "cancelled"
    assert ended(runner, wait_for, 41, 4).outcome == "cancelled"
    # Their supervisors exit just after writing their status; job 42's step runs on.
    wait_for(lambda: runner.running() == [(42, 0)], "job 41's step supervisors to exit",
             seen=runner.running)


def test_the_jobs_time_limit_ends_the_step(
        runner: StepRunner, gsrun: FakeGsrun, work_dir: Path,
        wait_for: Callable[..., Any]) -> None:
    launch = launch_for(gsrun.io(), ["/bin/sh", "-c", 'trap "" TERM; sleep 600'],
                        str(work_dir), deadline=time.time() + 1.0)
    start(runner, launch)
    end = ended(runner, wait_for, gsrun=gsrun)
    # SIGTERM ignored: killed after the kill grace.
    assert (end.outcome, end.signal) == ("timeout", signal.SIGKILL)


def test_a_new_deadline_moves_the_steps_time_limit_both_ways(
        runner: StepRunner, gsrun: FakeGsrun, work_dir: Path,
        wait_for: Callable[..., Any]) -> None:
    old_deadline = time.time() + 1.5
    launch = launch_for(gsrun.io(), ["/bin/sh", "-c", "echo ready; exec sleep 600"],
                        str(work_dir), deadline=old_deadline)
    stepdir = start(runner, launch)
    wait_for(lambda: "ready" in gsrun.text(stepio.STDOUT, 3)
             and (stepdir / "supervisor.json").exists(), "the tasks to start")
    # Another run's or another job's limit moves nothing here.
    assert runner.set_deadline(41, 1, time.time() + 600) == []
    assert runner.set_deadline(42, 0, time.time() + 600) == []
    assert runner.set_deadline(41, 0, time.time() + 600) == [3]  # raised
    while time.time() < old_deadline + 1.0:  # past the old deadline, and its kill grace
        assert runner.running() == [(41, 3)] and not (stepdir / "status.json").exists()
        time.sleep(0.1)
    assert gsrun.exits() == {}
    assert runner.set_deadline(41, 0, time.time() - 5) == [3]  # lowered below its age
    end = ended(runner, wait_for, gsrun=gsrun)
    assert (end.outcome, end.signal) == ("timeout", signal.SIGTERM)
    assert gsrun.exits() == {2: (None, 15), 3: (None, 15)}
    assert runner.set_deadline(41, 0, time.time() + 600) == []  # ended: nothing to tell


def test_a_deadline_written_before_the_supervisor_watches_is_kept(
        runner: StepRunner, gsrun: FakeGsrun, work_dir: Path,
        wait_for: Callable[..., Any]) -> None:
    launch = launch_for(gsrun.io(), ["/bin/sh", "-c", "exec sleep 600"], str(work_dir),
                        deadline=time.time() + 600)
    stepdir = start(runner, launch)
    # Told at once, before its tasks run (no supervisor.json yet): read, not signalled.
    assert runner.set_deadline(41, 0, time.time() + 0.5) == [3]
    assert json.loads((stepdir / "deadline.json").read_text())["deadline"] is not None
    end = ended(runner, wait_for, gsrun=gsrun)
    assert end.outcome == "timeout"


def test_an_unreachable_gsrun_fails_the_launch_and_runs_nothing(
        runner: StepRunner, work_dir: Path, wait_for: Callable[..., Any]) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    marker = work_dir / "ran"
    launch = launch_for(StepIO("127.0.0.1", port, "0" * 64),
                        ["/bin/sh", "-c", f"touch {marker}"], str(work_dir))
    start(runner, launch, connect_timeout=0.5)
    end = ended(runner, wait_for)
    assert end.outcome == "launch_failed"
    assert end.error is not None and f"cannot reach gsrun's I/O socket at 127.0.0.1:{port}" \
        in end.error
    assert not marker.exists()


def test_a_refused_step_tells_gsrun_why(
        runner: StepRunner, gsrun: FakeGsrun, work_dir: Path,
        wait_for: Callable[..., Any]) -> None:
    marker = work_dir / "ran"
    launch = launch_for(gsrun.io(), ["/bin/sh", "-c", f"touch {marker}"], str(work_dir))
    spec = step_spec(launch, kill_grace=0.5, min_uid=1)  # root's step on this node: no
    assert runner.start(launch, spec)
    end = ended(runner, wait_for, gsrun=gsrun)
    assert end.outcome == "launch_failed" and "min_job_uid" in (end.error or "")
    errors = gsrun.of(stepio.ERROR)
    assert len(errors) == 1 and b"min_job_uid" in errors[0].payload
    assert gsrun.of(stepio.EXIT) == [] and not marker.exists()
    wait_for(gsrun.closed.is_set, "the node to close its connection")


def test_a_command_that_cannot_run_fails_its_tasks_with_the_reason(
        runner: StepRunner, gsrun: FakeGsrun, work_dir: Path,
        wait_for: Callable[..., Any]) -> None:
    start(runner, launch_for(gsrun.io(), ["no-such-command-here"], str(work_dir)))
    end = ended(runner, wait_for, gsrun=gsrun)
    assert "cannot execute no-such-command-here" in gsrun.text(stepio.STDERR, 2)
    assert gsrun.exits() == {2: (2, None), 3: (2, None)}
    assert (end.outcome, end.exit_code) == ("failed", 2)


def test_losing_gsrun_ends_the_step(
        runner: StepRunner, gsrun: FakeGsrun, work_dir: Path,
        wait_for: Callable[..., Any]) -> None:
    start(runner, launch_for(gsrun.io(), ["/bin/sh", "-c", "echo up; sleep 600"],
                             str(work_dir)))
    wait_for(lambda: "up" in gsrun.text(stepio.STDOUT, 3), "the tasks to start")
    gsrun.close()
    end = ended(runner, wait_for, gsrun=gsrun)
    assert end.outcome == "cancelled" and "gsrun" in (end.error or "")


def test_a_restarted_agent_adopts_a_running_step(
        runner: StepRunner, gsrun: FakeGsrun, work_dir: Path,
        wait_for: Callable[..., Any]) -> None:
    stepdir = start(runner, launch_for(gsrun.io(), ["/bin/sh", "-c", "echo up; sleep 600"],
                                       str(work_dir)))
    wait_for(lambda: (stepdir / "supervisor.json").exists(), "the step to start")
    again = StepRunner(runner.steps_dir, "node-b", spawner=False)
    try:
        assert again.adopt() == [(41, 3)]
        assert again.cancel(41, 3)
        assert ended(again, wait_for).outcome == "cancelled"
    finally:
        again.close()


def test_a_lost_step_supervisor_is_recorded_and_its_tasks_killed(
        runner: StepRunner, gsrun: FakeGsrun, work_dir: Path,
        wait_for: Callable[..., Any], process_gone: Callable[[int], bool]) -> None:
    stepdir = start(runner, launch_for(gsrun.io(), ["/bin/sh", "-c", "sleep 600"],
                                       str(work_dir)))
    wait_for(lambda: (stepdir / "supervisor.json").exists(), "the step to start")
    info = json.loads((stepdir / "supervisor.json").read_text())
    os.kill(info["supervisor_pid"], signal.SIGKILL)
    end = ended(runner, wait_for, gsrun=gsrun)
    assert (end.outcome, end.error) == ("failed", "step supervisor lost")
    for pid in info["task_pids"]:
        wait_for(lambda pid=pid: process_gone(pid), f"task process {pid} to be killed")


# ------------------------------------------------------------------ pure parts


def test_task_environment_follows_slurm_and_torch() -> None:
    launch = launch_for(StepIO("127.0.0.1", 1, "0" * 64), ["x"], "/tmp",
                        node_names=("gpu01", "gpu02", "gpu03"), tasks_per_node=(2, 2, 1),
                        ntasks=5, environment={"MASTER_PORT": "1234", "SLURM_NTASKS": "9"})
    env = task_environment(launch, 3, 1, (GPU_B,))
    assert env["SLURM_NTASKS"] == env["GPUSCHED_NTASKS"] == env["WORLD_SIZE"] == "5"
    assert env["SLURM_STEP_TASKS_PER_NODE"] == "2(x2),1"
    assert env["SLURM_STEP_NODELIST"] == "gpu[01-03]"
    assert env["SLURM_STEP_GPUS"] == f"{GPU_A},{GPU_B}"
    assert (env["SLURMD_NODENAME"], env["GPUSCHED_NODENAME"]) == ("node-b", "node-b")
    assert (env["RANK"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == (
        "3", "1", "2", "1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.1.2.3", "1234")  # gsrun's kept
    assert env["CUDA_VISIBLE_DEVICES"] == GPU_B and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_input_and_error_files() -> None:
    io = StepIO("127.0.0.1", 1, "0" * 64)
    spec = step_spec(launch_for(io, ["x"], "/w", error="e-%t", input="in-%n"), 1.0, 1)
    assert [(t["stdout"], t["stderr"], t["stdin"], t["stdin_frames"]) for t in spec["tasks"]] \
        == [(None, "/w/e-2", "/w/in-1", False), (None, "/w/e-3", "/w/in-1", False)]
    spec = step_spec(launch_for(io, ["x"], "/w", output="o", input="none"), 1.0, 1)
    assert [(t["stdout"], t["stderr"], t["stdin"]) for t in spec["tasks"]] == [
        ("/w/o", "/w/o", None)] * 2
    first = launch_for(io, ["x"], "/w", tasks=(StepTask(0, 0, ()), StepTask(1, 1, ())))
    assert [t["stdin_frames"] for t in step_spec(first, 1.0, 1)["tasks"]] == [True, False]


def test_node_address() -> None:
    assert node_address("10.0.0.7", ()) == "10.0.0.7"
    assert node_address(None, ()) == "127.0.0.1"
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert node_address(None, (Endpoint("127.0.0.1", port),)) == "127.0.0.1"


def test_a_step_started_in_a_fresh_interpreter(
        runner: StepRunner, gsrun: FakeGsrun, work_dir: Path,
        wait_for: Callable[..., Any]) -> None:
    plain = StepRunner(runner.steps_dir, "node-b", spawner=False)
    try:
        start(plain, launch_for(gsrun.io(), ["/bin/sh", "-c", "echo $RANK"], str(work_dir)))
        assert ended(plain, wait_for, gsrun=gsrun).outcome == "completed"
        assert (gsrun.text(stepio.STDOUT, 2), gsrun.text(stepio.STDOUT, 3)) == ("2\n", "3\n")
    finally:
        plain.close()


def test_a_confined_step_runs_in_its_own_cgroup_with_the_jobs_memory(
        runner: StepRunner, gsrun: FakeGsrun, work_dir: Path, cgroup2: Path,
        wait_for: Callable[..., Any]) -> None:
    tree = detect(cgroup2 / f"gpusched-steps-test-{os.getpid()}")
    try:
        launch = launch_for(gsrun.io(), ["/bin/sh", "-c", 'sed -n "s/^0:://p" /proc/self/cgroup'],
                            str(work_dir), mem_mb=64, cpus=1)
        inventory = {GPU_A: {"index": 0, "uuid": GPU_A, "minor": 3},
                     GPU_B: {"index": 1, "uuid": GPU_B, "minor": 5}}
        cgroup = step_cgroup_spec(Confinement(tree, tree.describe()), launch, inventory,
                                  None, set())
        assert cgroup is not None and cgroup["name"] == "job_41_step_3_0"
        limited = "memory" in tree.controllers()  # not where memory is a v1 hierarchy
        assert cgroup["memory_bytes"] == (64 << 20 if limited else None)
        start(runner, launch, cgroup=cgroup)
        end = ended(runner, wait_for, gsrun=gsrun)
        assert end.outcome == "completed", gsrun.text(stepio.STDERR, 2)
        path = f"/gpusched-steps-test-{os.getpid()}/job_41_step_3_0"
        assert gsrun.text(stepio.STDOUT, 2) == gsrun.text(stepio.STDOUT, 3) == f"{path}\n"
        assert end.max_rss_bytes is not None and end.cpu_usec is not None
        assert tree.root is not None
        assert not (tree.root / "job_41_step_3_0").exists()  # removed at the end
    finally:
        if tree.root is not None:
            tree.root.rmdir()


def test_a_warmed_runner_starts_its_spawner_before_the_first_step(
        runner: StepRunner, gsrun: FakeGsrun, work_dir: Path,
        wait_for: Callable[..., Any]) -> None:
    runner.warm()
    spawner = runner._spawner
    assert spawner is not None and spawner._pid > 0
    first = spawner._pid
    start(runner, launch_for(gsrun.io(), ["true"], str(work_dir)))
    assert ended(runner, wait_for, gsrun=gsrun).outcome == "completed"
    assert spawner._pid == first  # the step was forked by the spawner started ahead
