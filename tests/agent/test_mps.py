"""GPUs shared on the node (gpusched.agent.mps): MPS jobs get their GPU's control daemon,
started before the first of them and told to quit after the last, and their limits in
their environment; shard jobs get the GPU unlimited and say so. Real supervisors, real
jobs and a real (fake) nvidia-cuda-mps-control daemon process that records what it was
asked (tests/fakemps)."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.agent.launcher import Launcher, build_spec
from gpusched.agent.mps import MpsDaemons, MpsError, daemon_dir, thread_percentage
from gpusched.agent.settings import AgentConfig
from gpusched.messages import LaunchOrder
from tests.agent.conftest import _private_dir, kill_leftovers
from tests.agent.test_launcher import launch_object, wait_end
from tests.fakemps.fixture import FakeMps, fake_mps_in

WaitFor = Callable[..., Any]
GPU = "GPU-11111111-2222-3333-4444-555555555555"
GPU2 = "GPU-66666666-7777-8888-9999-000000000000"
MIG = "MIG-GPU-11111111-2222-3333-4444-555555555555/3/0"


@pytest.fixture
def state() -> Iterator[Path]:
    """An agent state directory (root's, 0755) with its jobs directory."""
    path = _private_dir(0o755)
    (path / "jobs").mkdir(mode=0o711)
    yield path
    kill_leftovers(path / "jobs")
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake_mps(tmp_path: Path) -> Iterator[FakeMps]:
    """A fake nvidia-cuda-mps-control of the test's own; its daemons die with the test."""
    with fake_mps_in(tmp_path) as fake:
        yield fake


@pytest.fixture
def launcher(state: Path) -> Iterator[Launcher]:
    launcher = Launcher(state / "jobs")
    yield launcher
    launcher.close()


def share(mode: str = "mps", units: int = 30, of: int = 100, mem_mb: int = 0,
          gpu: str = GPU) -> dict[str, Any]:
    return {"mode": mode, "gpu_uuid": gpu, "units": units, "of": of, "mem_mb": mem_mb}


def start(launcher: Launcher, state: Path, work: Path, job_id: int, grant: dict[str, Any],
          control: str) -> dict[str, Any]:
    """Launch a job holding ``grant`` that writes its environment to work/env-<id> and
    runs until work/go-<id> exists; return its spec."""
    script = (f"#!/bin/sh\nenv > {work}/env-{job_id}.tmp && mv {work}/env-{job_id}.tmp "
              f"{work}/env-{job_id}\nwhile [ ! -e {work}/go-{job_id} ]; do sleep 0.02; done\n")
    order = LaunchOrder.parse(launch_object(work, job_id, script=script,
                                            gpu_uuids=[grant["gpu_uuid"]], share=grant))
    config = AgentConfig(node_name="node01", state_dir=state, mps_control=control,
                         kill_grace=0.3, min_job_uid=0)
    spec = build_spec(order, config.kill_grace, "node01", 0, None, vars(config))
    assert launcher.launch(job_id, spec, script)
    return spec


def job_env(work: Path, job_id: int, wait_for: WaitFor) -> dict[str, str]:
    path = work / f"env-{job_id}"
    wait_for(path.exists, f"job {job_id} to write its environment")
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def seen_by(launcher: Launcher, check: Callable[[], Any]) -> Callable[[], Any]:
    """``check``, after the launcher has handled the supervisors that exited (the
    agent's report loop calls wait_ended all the time; a test calls it while it waits)."""
    def look() -> Any:
        launcher.wait_ended(timeout=0.05)
        return check()
    return look


def finish(launcher: Launcher, work: Path, job_id: int, wait_for: WaitFor) -> None:
    (work / f"go-{job_id}").touch()
    end = wait_end(launcher, job_id, wait_for)
    assert end.outcome == "completed", end
    # Its supervisor's exit handled too (that is when daemons no job needs are stopped).
    wait_for(seen_by(launcher, lambda: not launcher.is_running(job_id)), "its supervisor to exit")
    launcher.wait_ended(timeout=0.05)


def test_two_mps_jobs_on_one_gpu_share_one_daemon_that_quits_after_the_last(
        launcher: Launcher, state: Path, work_dir: Path, fake_mps: FakeMps,
        wait_for: WaitFor) -> None:
    start(launcher, state, work_dir, 1, share(units=30, mem_mb=20480), str(fake_mps.program))
    first = job_env(work_dir, 1, wait_for)
    start(launcher, state, work_dir, 2, share(units=1, of=3), str(fake_mps.program))
    second = job_env(work_dir, 2, wait_for)

    directory = state / "mps" / GPU
    for env in (first, second):
        assert env["CUDA_VISIBLE_DEVICES"] == GPU
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(directory / "pipe")
        assert env["CUDA_MPS_LOG_DIRECTORY"] == str(directory / "log")
    assert first["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert first["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert first["GPUSCHED_GPU_SHARE"] == "mps:30/100"
    assert second["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "34"  # 1/3 of 100, rounded up
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in second
    assert second["GPUSCHED_GPU_SHARE"] == "mps:1/3"
    assert "SLURM_SHARDS_ON_NODE" not in first

    # One daemon, started once, for that GPU alone, before the first job ran.
    (run,) = fake_mps.events("run")
    assert run["argv"] == ["-d"] and run["uid"] == 0
    assert run["env"] == {"CUDA_VISIBLE_DEVICES": GPU,
                          "CUDA_MPS_PIPE_DIRECTORY": str(directory / "pipe"),
                          "CUDA_MPS_LOG_DIRECTORY": str(directory / "log")}
    (daemon,) = fake_mps.events("daemon")
    assert daemon["time"] < (work_dir / "env-1").stat().st_mtime
    assert fake_mps.live_daemons() == [daemon["pid"]]
    for path in (state / "mps", directory, directory / "pipe", directory / "log"):
        info = path.lstat()
        assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o755, path
        assert (info.st_uid, info.st_gid) == (0, 0)

    finish(launcher, work_dir, 1, wait_for)
    assert fake_mps.events("command") == []  # the second job still runs on it
    assert fake_mps.live_daemons() == [daemon["pid"]]

    finish(launcher, work_dir, 2, wait_for)
    wait_for(seen_by(launcher, lambda: fake_mps.events("quit")), "the daemon to be told to quit",
             seen=fake_mps.events)
    (client,) = fake_mps.events("client")
    assert client["stdin"] == ["quit"]
    assert fake_mps.events("run")[-1]["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(directory / "pipe")
    assert [c["command"] for c in fake_mps.events("command")] == ["quit"]
    wait_for(lambda: not fake_mps.live_daemons(), "the daemon to exit",
             seen=fake_mps.live_daemons)
    assert MpsDaemons(state / "mps").running(directory) is None


def test_each_shared_gpu_has_its_own_daemon_and_directories(
        launcher: Launcher, state: Path, work_dir: Path, fake_mps: FakeMps,
        wait_for: WaitFor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{fake_mps.bin}:{os.environ['PATH']}")  # found on PATH
    start(launcher, state, work_dir, 1, share(gpu=GPU), "nvidia-cuda-mps-control")
    start(launcher, state, work_dir, 2, share(gpu=GPU2, units=100), "nvidia-cuda-mps-control")
    first, second = job_env(work_dir, 1, wait_for), job_env(work_dir, 2, wait_for)
    assert first["CUDA_MPS_PIPE_DIRECTORY"] == str(state / "mps" / GPU / "pipe")
    assert second["CUDA_MPS_PIPE_DIRECTORY"] == str(state / "mps" / GPU2 / "pipe")
    assert second["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert sorted(r["env"]["CUDA_VISIBLE_DEVICES"] for r in fake_mps.events("run")) == sorted(
        [GPU, GPU2])
    assert len(fake_mps.live_daemons()) == 2

    finish(launcher, work_dir, 1, wait_for)
    wait_for(seen_by(launcher, lambda: fake_mps.events("quit")), "GPU 1's daemon to quit")
    (client,) = [r for r in fake_mps.events("run") if r["argv"] == []]
    assert client["env"]["CUDA_VISIBLE_DEVICES"] == GPU
    assert len(fake_mps.live_daemons()) == 1
    finish(launcher, work_dir, 2, wait_for)
    wait_for(seen_by(launcher, lambda: not fake_mps.live_daemons()), "GPU 2's daemon to quit")


def test_a_users_mps_job_reaches_the_daemons_directories(
        launcher: Launcher, state: Path, user_dir: Path, test_user: pwd.struct_passwd,
        fake_mps: FakeMps, wait_for: WaitFor) -> None:
    script = ("#!/bin/sh\nls $CUDA_MPS_PIPE_DIRECTORY > listed\n"
              "cat $CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid > pid\nid -u > uid\n")
    body = launch_object(user_dir, 1, script=script, user=test_user.pw_name,
                         uid=test_user.pw_uid, gid=test_user.pw_gid, gpu_uuids=[GPU],
                         share=share())
    config = AgentConfig(state_dir=state, mps_control=str(fake_mps.program), min_job_uid=1)
    spec = build_spec(LaunchOrder.parse(body), 0.3, "node01", 1, None, vars(config))
    assert launcher.launch(1, spec, script)
    end = wait_end(launcher, 1, wait_for)
    assert end.outcome == "completed", end
    assert (user_dir / "uid").read_text().strip() == str(test_user.pw_uid)
    assert "nvidia-cuda-mps-control.pid" in (user_dir / "listed").read_text().split()
    (daemon,) = fake_mps.events("daemon")
    assert (user_dir / "pid").read_text().strip() == str(daemon["pid"])
    wait_for(seen_by(launcher, lambda: not fake_mps.live_daemons()), "the daemon to quit")


def test_a_shard_job_gets_the_gpu_unlimited_and_no_daemon(
        launcher: Launcher, state: Path, work_dir: Path, fake_mps: FakeMps,
        wait_for: WaitFor) -> None:
    spec = start(launcher, state, work_dir, 1, share(mode="shard", units=2, of=4, mem_mb=1024),
                 str(fake_mps.program))
    env = job_env(work_dir, 1, wait_for)
    assert env["CUDA_VISIBLE_DEVICES"] == GPU
    assert env["GPUSCHED_GPU_SHARE"] == "shard:2/4"
    assert env["SLURM_SHARDS_ON_NODE"] == "2"
    assert not [key for key in env if key.startswith("CUDA_MPS_")]
    assert spec["mps"] is None
    finish(launcher, work_dir, 1, wait_for)
    assert fake_mps.events() == []
    assert not (state / "mps").exists()


def test_a_daemon_that_cannot_start_fails_the_launch_cleanly(
        launcher: Launcher, state: Path, work_dir: Path, fake_mps: FakeMps,
        wait_for: WaitFor) -> None:
    fake_mps.fail_start()
    start(launcher, state, work_dir, 1, share(), str(fake_mps.program))
    end = wait_end(launcher, 1, wait_for)
    assert end.outcome == "launch_failed"
    assert end.error == (f"cannot start the MPS control daemon for GPU {GPU}: "
                         f"{fake_mps.program} -d exited with status 1: fake MPS control: "
                         f"cannot start the daemon (fail-start)")
    assert not (work_dir / "env-1").exists()  # nothing of the job ran
    assert [e["event"] for e in fake_mps.events()] == ["run", "start_failed"]

    start(launcher, state, work_dir, 2, share(), "/nonexistent/nvidia-cuda-mps-control")
    end = wait_end(launcher, 2, wait_for)
    assert (end.outcome, end.error) == ("launch_failed", (
        f"cannot start the MPS control daemon for GPU {GPU}: no program "
        f"'/nonexistent/nvidia-cuda-mps-control' (agent.mps_control) on the agent's PATH"))

    fake_mps.fail_start(False)  # the node recovers: the next MPS job starts it
    start(launcher, state, work_dir, 3, share(), str(fake_mps.program))
    assert job_env(work_dir, 3, wait_for)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert len(fake_mps.live_daemons()) == 1
    finish(launcher, work_dir, 3, wait_for)
    wait_for(seen_by(launcher, lambda: not fake_mps.live_daemons()), "the daemon to quit")


@pytest.mark.parametrize(("how", "said"), [
    ("start-hangs", "-d did not return within 0.5 s"),
    ("start-no-daemon", "did not start within 0.5 s: no live daemon in "),
])
def test_a_daemon_start_that_stalls_fails_within_its_timeout(
        state: Path, fake_mps: FakeMps, how: str, said: str) -> None:
    fake_mps.fail_start(how=how)
    daemons = MpsDaemons(state / "mps", start_timeout=0.5)
    began = time.monotonic()
    with pytest.raises(MpsError) as caught:
        daemons.ensure({"gpu": GPU, "control": str(fake_mps.program)})
    assert time.monotonic() - began < 5
    assert said in str(caught.value) and GPU in str(caught.value)
    assert daemons.running(daemon_dir(state / "mps", GPU)) is None
    assert [e["event"] for e in fake_mps.events()] == ["run", how.replace("-", "_")]
    fake_mps.fail_start(False, how=how)
    daemons.ensure({"gpu": GPU, "control": str(fake_mps.program)})  # works again
    assert daemons.running(daemon_dir(state / "mps", GPU)) == fake_mps.live_daemons()[0]
    assert daemons.release(state / "jobs") == [GPU]
    assert not fake_mps.live_daemons()


def test_a_restarted_agent_keeps_the_daemon_of_running_jobs_and_stops_others(
        state: Path, work_dir: Path, fake_mps: FakeMps, wait_for: WaitFor) -> None:
    before = Launcher(state / "jobs")
    start(before, state, work_dir, 1, share(gpu=GPU), str(fake_mps.program))
    job_env(work_dir, 1, wait_for)
    # A daemon the previous run left with no job (its job ended while no agent ran).
    MpsDaemons(state / "mps").ensure({"gpu": GPU2, "control": str(fake_mps.program)})
    (kept,) = [e["pid"] for e in fake_mps.events("daemon")][:1]
    assert len(fake_mps.live_daemons()) == 2
    before.close()  # the agent stops; the job and its daemon run on

    after = Launcher(state / "jobs")
    try:
        assert after.adopt() == [1]
        assert fake_mps.live_daemons() == [kept]
        (client,) = fake_mps.events("client")
        assert fake_mps.events("run")[-1]["env"]["CUDA_VISIBLE_DEVICES"] == GPU2
        assert client["stdin"] == ["quit"]
        finish(after, work_dir, 1, wait_for)
        wait_for(seen_by(after, lambda: not fake_mps.live_daemons()), "the kept daemon to quit")
    finally:
        after.close()


def test_the_environment_of_a_share_and_its_daemon_directory() -> None:
    assert [thread_percentage(u, of) for u, of in ((1, 10000), (50, 100), (1, 3), (2, 3),
                                                   (10000, 10000), (99, 100), (1, 1))] == [
        1, 50, 34, 67, 100, 99, 100]
    root = Path("/var/lib/gpusched/agent/mps")
    assert daemon_dir(root, MIG) == root / MIG.replace("/", "_")
    for bad in ("../x", GPU + "/..", "GPU-1", ""):
        with pytest.raises(Exception, match="is not a GPU UUID"):
            daemon_dir(root, bad)
    order = LaunchOrder.parse(launch_object(Path("/w"), 3, gpu_uuids=[MIG],
                                            share=share(gpu=MIG, units=7, of=10, mem_mb=512)))
    spec = build_spec(order, 1.0, "n", site={"state_dir": Path("/s"), "mps_control": "/x/m"})
    pipe = f"/s/mps/{MIG.replace('/', '_')}/pipe"
    assert spec["env"]["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    assert spec["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "70"
    assert spec["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=512M"
    assert spec["job_vars"]["CUDA_MPS_PIPE_DIRECTORY"] == pipe  # the prolog sees it too
    assert spec["mps"] == {"gpu": MIG, "control": "/x/m"}
    plain = build_spec(LaunchOrder.parse(launch_object(Path("/w"), 3, gpu_uuids=[GPU])),
                       1.0, "n")
    assert plain["mps"] is None
    assert not [k for k in plain["env"] if "MPS" in k or "SHARE" in k]
