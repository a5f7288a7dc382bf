"""Jobs confined in cgroups by their real supervisor, launched through a real Launcher,
on cgroup v1 (the hierarchies under /sys/fs/cgroup) and v2 (a cgroup2 mount)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from gpusched.agent.cgroups import CgroupTree, detect
from gpusched.agent.cgroups.job import format_cpus
from gpusched.agent.confine import Confinement, device_rules, job_cgroup_spec
from gpusched.agent.launcher import JobEnd, Launcher, build_spec
from gpusched.config import parse_config
from gpusched.messages import LaunchOrder

WaitFor = Callable[..., Any]
UUIDS = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"]
# GPU 0 is /dev/nvidia3 and GPU 1 /dev/nvidia5 on this made-up node
GPUS = {g.uuid: asdict(g) for g in parse_config({"agent": {"gpus": {"source": "static", "static": [
    {"index": 0, "uuid": UUIDS[0], "minor": 3}, {"index": 1, "uuid": UUIDS[1], "minor": 5}]}}},
    "test.toml").agent.static_gpus}


def _remove_tree(tree: CgroupTree) -> None:
    for path in [tree.root] if tree.version == 2 else list(tree.roots.values()):
        assert path is not None
        for child in path.iterdir():
            if child.is_dir():
                child.rmdir()  # fails, and so the test, if a job's cgroup was left behind
        path.rmdir()


@pytest.fixture
def v1_tree() -> Iterator[CgroupTree]:
    tree = detect(name=f"gpusched-jobs-test-{os.getpid()}")
    yield tree
    _remove_tree(tree)


@pytest.fixture
def v2_tree(cgroup2: Path) -> Iterator[CgroupTree]:
    tree = detect(cgroup2 / f"gpusched-jobs-test-{os.getpid()}")
    yield tree
    _remove_tree(tree)


@pytest.fixture(params=["v1", "v2"])
def tree(request: pytest.FixtureRequest) -> CgroupTree:
    return request.getfixturevalue(f"{request.param}_tree")  # type: ignore[no-any-return]


def run_job(launcher: Launcher, tree: CgroupTree | None, work_dir: Path, script: str,
            job_id: int = 1, site: dict[str, Any] | None = None, **order: Any) -> dict[str, Any]:
    """Launch a confined job (through confine.job_cgroup_spec, as the agent does)."""
    body = {"job_id": job_id, "name": "t", "user": "root", "uid": 0, "gid": 0,
            "script": "#!/bin/sh\n" + script + "\n", "args": [], "work_dir": str(work_dir),
            "environment": {"PATH": "/usr/bin:/bin"}, "output": None, "error": None,
            "time_limit": None, "gpu_uuids": [], "node": "node01", **order}
    launch = LaunchOrder.parse(body)
    cgroup = None if tree is None else job_cgroup_spec(
        Confinement(tree, tree.describe()), launch, GPUS, launcher.held_cpus())
    spec = build_spec(launch, kill_grace=0.3, node_name="node01", min_uid=0, cgroup=cgroup,
                      site=site)
    assert launcher.launch(job_id, spec, body["script"])
    return spec


def wait_end(launcher: Launcher, job_id: int, wait_for: WaitFor, timeout: float = 20) -> JobEnd:
    seen: list[JobEnd] = []

    def ended() -> JobEnd | None:
        seen[:] = launcher.wait_ended(timeout=0.3)
        return next((e for e in seen if e.job_id == job_id), None)

    return wait_for(ended, f"job {job_id} to end", timeout=timeout,  # type: ignore[no-any-return]
                    seen=lambda: seen)


def output(work_dir: Path, job_id: int = 1) -> str:
    return (work_dir / f"gpusched-{job_id}.out").read_text()


def test_a_job_opens_only_its_own_gpus(tree: CgroupTree, launcher: Launcher, work_dir: Path,
                                       wait_for: WaitFor, tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for minor in (3, 5):
        os.mknod(dev / f"nvidia{minor}", 0o666 | stat.S_IFCHR, os.makedev(195, minor))
    probe = "; ".join(f"(exec 3<>{dev}/nvidia{m}) 2>&1 | sed 's/^/nvidia{m}: /'"
                      for m in (3, 5))
    run_job(launcher, tree, work_dir, probe + "; echo done", gpu_uuids=[UUIDS[0]])
    end = wait_end(launcher, 1, wait_for)
    assert end.outcome == "completed", end
    text = output(work_dir)
    lines = {line.split(":", 1)[0]: line for line in text.splitlines()}
    assert "Operation not permitted" in lines["nvidia5"], text
    # its own GPU is not refused by the cgroup (no driver behind it: ENXIO)
    assert "nvidia3" not in lines or "Operation not permitted" not in lines["nvidia3"], text


def test_memory_past_the_limit_is_out_of_memory(v1_tree: CgroupTree, launcher: Launcher,
                                               work_dir: Path, wait_for: WaitFor) -> None:
    grow = "python3 -c 'b = bytearray(256 << 20); print(len(b))'"
    run_job(launcher, v1_tree, work_dir, grow, job_id=1, mem_mb=64)
    run_job(launcher, v1_tree, work_dir, "python3 -c 'b = bytearray(16 << 20)'; echo fits",
            job_id=2, mem_mb=256)
    oom, fits = wait_end(launcher, 1, wait_for), wait_end(launcher, 2, wait_for)
    assert oom.outcome == "out_of_memory", oom
    assert oom.max_rss_bytes is not None and oom.max_rss_bytes <= 64 << 20
    assert fits.outcome == "completed" and "fits" in output(work_dir, 2), fits
    assert fits.max_rss_bytes is not None and fits.max_rss_bytes >= 16 << 20
    assert fits.cpu_usec is not None and fits.cpu_usec > 0


def test_v2_without_a_memory_controller_runs_unlimited_and_says_so(
        v2_tree: CgroupTree, launcher: Launcher, jobs_dir: Path, work_dir: Path,
        wait_for: WaitFor) -> None:
    assert "memory" not in v2_tree.controllers()  # this machine's cgroup2 has none
    spec = run_job(launcher, v2_tree, work_dir, "python3 -c 'b = bytearray(128 << 20)'; echo ran",
                   mem_mb=64)
    assert spec["cgroup"]["memory_bytes"] is None
    end = wait_end(launcher, 1, wait_for)
    assert end.outcome == "completed" and "ran" in output(work_dir), end
    assert end.cpu_usec is not None and end.cpu_usec > 0
    log = (jobs_dir / "1" / "supervisor.log").read_text()
    assert "job 1: memory not limited: no memory controller" in log


def _with_marker(marker: str) -> list[int]:
    """Pids of live processes whose environment holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_cancel_leaves_nothing_behind(tree: CgroupTree, launcher: Launcher, work_dir: Path,
                                      wait_for: WaitFor) -> None:
    marker = f"GPUSCHED_TEST_MARK=escape-{os.getpid()}-{tree.version}"
    # a double-forked sleep in a session of its own, then the job waits
    run_job(launcher, tree, work_dir, f"(export {marker}; setsid sleep 1000 &); sleep 1000")
    wait_for(lambda: len(_with_marker(marker)) == 1, "the escaped sleep to start",
             seen=lambda: _with_marker(marker))
    (escaped,) = _with_marker(marker)
    assert os.getsid(escaped) != os.getsid(0)
    assert launcher.cancel(1)
    end = wait_end(launcher, 1, wait_for)
    assert end.outcome == "cancelled", end
    assert _with_marker(marker) == []


def test_the_job_sees_the_cpuset_it_was_given(v1_tree: CgroupTree, launcher: Launcher,
                                              jobs_dir: Path, work_dir: Path,
                                              wait_for: WaitFor) -> None:
    available = sorted(os.sched_getaffinity(0))
    want = min(2, len(available))
    spec = run_job(launcher, v1_tree, work_dir, "grep Cpus_allowed_list /proc/self/status",
                   cpus=want)
    cpus = spec["cgroup"]["cpus"]
    assert len(cpus) == want and set(cpus) <= set(available)
    end = wait_end(launcher, 1, wait_for)
    assert end.outcome == "completed", end
    assert output(work_dir).split(":", 1)[1].strip() == format_cpus(set(cpus))
    # a second job while the first runs gets other CPUs
    run_job(launcher, v1_tree, work_dir, "sleep 1000", job_id=2, cpus=1)
    first = json.loads((jobs_dir / "2" / "spec.json").read_text())["cgroup"]["cpus"]
    run_job(launcher, v1_tree, work_dir, "true", job_id=3, cpus=1)
    second = json.loads((jobs_dir / "3" / "spec.json").read_text())["cgroup"]["cpus"]
    assert len(available) < 2 or set(first).isdisjoint(second)
    assert launcher.cancel(2)
    wait_end(launcher, 2, wait_for)


def test_too_many_cpus_means_no_cpuset_unless_binding_is_enforced(
        v1_tree: CgroupTree, launcher: Launcher, jobs_dir: Path, work_dir: Path,
        wait_for: WaitFor) -> None:
    many = len(os.sched_getaffinity(0)) + 1
    spec = run_job(launcher, v1_tree, work_dir, "true", cpus=many)
    assert spec["cgroup"]["cpus"] is None
    assert wait_end(launcher, 1, wait_for).outcome == "completed"
    assert f"{many} CPUs asked but" in (jobs_dir / "1" / "supervisor.log").read_text()


def _program(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_a_failing_prolog_stops_the_job_before_it_runs(
        launcher: Launcher, work_dir: Path, tmp_path: Path, wait_for: WaitFor) -> None:
    seen = tmp_path / "prolog.env"
    prolog = _program(tmp_path / "prolog", f"env > {seen}; echo 'scratch disk full'; exit 1")
    epilog = _program(tmp_path / "epilog", f"touch {tmp_path}/epilog.ran")
    run_job(launcher, None, work_dir, f"touch {work_dir}/job.ran", job_id=4,
            site={"prolog": prolog, "epilog": epilog}, name="p",
            environment={"PATH": "/usr/bin:/bin", "LD_PRELOAD": "/tmp/evil.so"})
    end = wait_end(launcher, 4, wait_for)
    assert (end.outcome, end.error) == ("prolog_failed", "prolog failed: scratch disk full")
    assert end.start_time is None
    assert not (work_dir / "job.ran").exists() and not (tmp_path / "epilog.ran").exists()
    env = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert (env["SLURM_JOB_ID"], env["SLURM_JOB_USER"], env["SLURM_JOB_UID"]) == ("4", "root", "0")
    assert env["SLURM_SCRIPT_CONTEXT"] == "prolog_slurmd" and env["SLURM_JOB_NAME"] == "p"
    assert "LD_PRELOAD" not in env  # never the submitter's environment


def test_a_failing_epilog_is_reported_and_leaves_the_outcome(
        tree: CgroupTree, launcher: Launcher, work_dir: Path, tmp_path: Path,
        wait_for: WaitFor) -> None:
    epilog = _program(tmp_path / "epilog", "echo node unhealthy; exit 3")
    run_job(launcher, tree, work_dir, "exit 0", site={"epilog": epilog})
    end = wait_end(launcher, 1, wait_for)
    assert (end.outcome, end.epilog_error) == ("completed", "epilog failed: node unhealthy")
    assert end.cpu_usec is not None


def test_prolog_and_epilog_time_out_as_configured(
        launcher: Launcher, work_dir: Path, tmp_path: Path, wait_for: WaitFor) -> None:
    slow = _program(tmp_path / "slow", "sleep 30")
    run_job(launcher, None, work_dir, "true", job_id=1,
            site={"prolog": slow, "prolog_timeout": 0.5})
    run_job(launcher, None, work_dir, "true", job_id=2,
            site={"epilog": slow, "epilog_timeout": 0.5})
    first, second = wait_end(launcher, 1, wait_for), wait_end(launcher, 2, wait_for)
    assert first.outcome == "prolog_failed"
    assert first.error == f"prolog failed: prolog {slow} timed out after 0.5 s"
    assert second.outcome == "completed"
    assert second.epilog_error == f"epilog failed: epilog {slow} timed out after 0.5 s"


def test_a_cancel_during_the_prolog_never_starts_the_job(
        launcher: Launcher, work_dir: Path, tmp_path: Path, wait_for: WaitFor) -> None:
    started = tmp_path / "prolog.started"
    prolog = _program(tmp_path / "prolog", f"touch {started}; sleep 2")
    run_job(launcher, None, work_dir, f"touch {work_dir}/job.ran", site={"prolog": prolog})
    wait_for(started.exists, "the prolog to start")
    assert launcher.cancel(1)
    end = wait_end(launcher, 1, wait_for)
    assert end.outcome == "cancelled" and not (work_dir / "job.ran").exists()


def test_device_rules_allow_this_nodes_gpus_of_the_job_only() -> None:
    other_node = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"  # a multi-node job's
    rules = device_rules([UUIDS[1], other_node], GPUS)
    gpus = sorted(minor for _, major, minor in rules if major == 195 and minor != 255)
    assert gpus == [5]


def test_a_lost_supervisors_job_is_killed_whole_and_its_cgroup_removed(
        tree: CgroupTree, launcher: Launcher, jobs_dir: Path, work_dir: Path,
        wait_for: WaitFor) -> None:
    marker = f"GPUSCHED_TEST_MARK=lost-{os.getpid()}-{tree.version}"
    spec = run_job(launcher, tree, work_dir, f"(export {marker}; setsid sleep 1000 &); sleep 1000")
    wait_for(lambda: len(_with_marker(marker)) == 1, "the escaped sleep to start")
    info = json.loads((jobs_dir / "1" / "supervisor.json").read_text())
    os.kill(info["supervisor_pid"], 9)
    end = wait_end(launcher, 1, wait_for)
    assert (end.outcome, end.error) == ("failed", "job supervisor lost")
    assert _with_marker(marker) == []
    bases = [tree.root] if tree.version == 2 else list(tree.roots.values())
    assert not any((base / spec["cgroup"]["name"]).exists() for base in bases if base)
