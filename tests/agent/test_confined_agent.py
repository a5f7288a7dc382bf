"""A real agent confines its jobs: detection at start ([agent.cgroups] enforce), the
job's cgroup as the job itself sees it, and its GPUs alone among /dev/nvidia*."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from gpusched.agent.confine import subtree_name
from gpusched.config import demo_gpus
from tests.e2e.cluster import BIN, Cluster, wait_for

PROBE = """python3 -c "
import errno, os
for m in range(4):
    try:
        os.close(os.open('{dev}/nvidia%d' % m, os.O_RDWR)); r = 'ok'
    except OSError as e:
        r = errno.errorcode[e.errno]
    print('nvidia%d=%s' % (m, r))
"; cat /proc/self/cgroup"""


def test_a_job_on_a_confined_agent_runs_in_its_cgroup_with_its_gpus_only(db_url: str) -> None:
    cluster = Cluster(db_url, gpus=4)
    subtree = subtree_name("node01", cluster.agent_state)
    try:
        cluster.up()
        dev = cluster.root / "dev"
        dev.mkdir()
        for minor in range(4):
            os.mknod(dev / f"nvidia{minor}", 0o666 | stat.S_IFCHR, os.makedev(195, minor))
        job_id = cluster.submit("--gpus", "1", "--wrap", PROBE.format(dev=dev))
        job = cluster.wait_state(job_id, "COMPLETED")
        text = (cluster.work / f"gpusched-{job_id}.out").read_text()
        assert f":/{subtree}/job-{job_id}-0\n" in text, text
        (uuid,) = job["gpu_uuids"]
        index = next(g.index for g in demo_gpus("node01", 4) if g.uuid == uuid)
        opened = dict(line.split("=") for line in text.splitlines() if line.startswith("nvidia"))
        assert opened.pop(f"nvidia{index}") != "EPERM", text
        assert set(opened.values()) == {"EPERM"}, text
        log = (cluster.root / "agent.log").read_text()
        assert "jobs are confined in cgroup v1 at /sys/fs/cgroup/" in log, log
    finally:
        cluster.close()
    # stopped with no job left, the agent removed its subtree
    assert not Path(f"/sys/fs/cgroup/devices/{subtree}").exists()


def _agent(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "gpusched"), "agent", "--config", str(config)],
                          capture_output=True, text=True, timeout=30)


def test_required_confinement_that_cannot_be_had_stops_the_agent(db_url: str,
                                                                 tmp_path: Path) -> None:
    not_a_cgroup = tmp_path / "plain"
    not_a_cgroup.mkdir()
    cluster = Cluster(db_url, agent_toml=f'[agent.cgroups]\nenforce = "required"\n'
                                         f'root = "{not_a_cgroup}"\n')
    try:
        result = _agent(cluster.config)
    finally:
        cluster.close()
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "enforce is required, but no cgroup can be made" in lines[0], \
        result.stderr
    assert f"no cgroup hierarchy found at {not_a_cgroup}" in lines[0]


def test_an_agent_that_cannot_confine_says_so_once_and_runs_jobs(db_url: str,
                                                                 tmp_path: Path) -> None:
    not_a_cgroup = tmp_path / "plain"
    not_a_cgroup.mkdir()
    cluster = Cluster(db_url, agent_toml=f'[agent.cgroups]\nroot = "{not_a_cgroup}"\n')
    try:
        cluster.up()
        job_id = cluster.submit("--wrap", "cat /proc/self/cgroup")
        cluster.wait_state(job_id, "COMPLETED")
        text = (cluster.work / f"gpusched-{job_id}.out").read_text()
        assert f"/job-{job_id}-0" not in text
        log = (cluster.root / "agent.log").read_text()
        assert log.count("jobs are NOT confined") == 1, log
        assert f"no cgroup hierarchy found at {not_a_cgroup}" in log
    finally:
        cluster.close()


def test_through_a_real_agent_oom_prolog_and_epilog_reach_the_controller(
        db_url: str, tmp_path: Path) -> None:
    flag = tmp_path / "prolog-fails"
    prolog = tmp_path / "prolog"
    prolog.write_text(f"#!/bin/sh\nif [ -e {flag} ]; then echo scratch full; exit 1; fi\n")
    epilog = tmp_path / "epilog"
    epilog.write_text("#!/bin/sh\nexit 0\n")
    for program in (prolog, epilog):
        program.chmod(0o755)
    cluster = Cluster(db_url, gpus=2, agent_toml=(
        f'[agent.prolog]\nprogram = "{prolog}"\ntimeout = 10\n'
        f'[agent.epilog]\nprogram = "{epilog}"\ntimeout = 10\n'))
    try:
        cluster.up()
        oom = cluster.submit("--mem", "64M", "--wrap",
                             "python3 -c 'b = bytearray(512 << 20)'")
        fits = cluster.submit("--mem", "256M", "--wrap", "python3 -c 'b = bytearray(16 << 20)'")
        cluster.wait_state(oom, "OUT_OF_MEMORY")
        done = cluster.wait_state(fits, "COMPLETED")
        accounted = cluster.api("GET", f"/v1/jobs/{fits}")
        assert done["exit_code"] == 0
        assert (accounted.get("max_rss_bytes") or 0) >= 16 << 20, accounted
        flag.touch()
        requeued = cluster.submit("--wrap", "true")
        nodes = None

        def drained() -> bool:
            nonlocal nodes
            nodes = cluster.api("GET", "/v1/nodes")["nodes"]
            return any("scratch full" in (n.get("reason") or "") for n in nodes)

        wait_for(drained, what="the node drained by its prolog", seen=lambda: nodes)
        job = cluster.job(requeued)
        assert job["state"] == "PENDING" and job["restarts"] == 1, job
    finally:
        cluster.close()
