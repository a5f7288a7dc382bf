"""What users see of confinement, through the real CLIs against a real controller: gsubmit
--gres-flags (good, bad, as a directive), a job ended OUT_OF_MEMORY in gqueue and gacct
with its MaxRSS and TotalCPU, a node that does not confine jobs in ginfo, and a health
check's drain in ginfo -R. Node ``n9`` has no agent process: the test speaks for it
through the agent API, as root on the local socket (what its agent would do)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command

from gpusched.cli import ginfo, gsubmit
from gpusched.cli.common import use_light_coercion
from gpusched.errors import UsageError
from tests.e2e.cluster import Cluster, wait_for


@pytest.fixture(scope="module")
def cluster(postgres: Any) -> Iterator[Cluster]:
    c = Cluster(postgres.fresh_database())
    try:
        yield c.up()
    finally:
        c.close()


def parse_submit(args: list[str]) -> gsubmit.Submission:
    command = get_command(gsubmit.app)
    use_light_coercion(command)
    with command.make_context("gsubmit", args) as ctx:
        return gsubmit.resolve_submission(ctx)  # type: ignore[arg-type]


def test_gres_flags_from_the_command_line_and_directives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/sh\n#SBATCH --gres-flags=disable-binding\ntrue\n")
    assert parse_submit(["job.sh"]).gres_flags == "disable-binding"
    assert parse_submit(["--gres-flags", "enforce-binding", "job.sh"]).gres_flags \
        == "enforce-binding"  # the command line wins
    assert parse_submit(["--wrap", "true"]).gres_flags is None
    body = gsubmit.submission_body(parse_submit(["job.sh"]), work_dir="/tmp", environment={})
    assert body["gres_flags"] == "disable-binding"
    (tmp_path / "bad.sh").write_text("#!/bin/sh\n#SBATCH --gres-flags=bind-all\ntrue\n")
    with pytest.raises(UsageError) as caught:
        parse_submit(["bad.sh"])
    assert caught.value.message == ("line 2: #SBATCH: invalid --gres-flags 'bind-all': "
                                    "expected enforce-binding or disable-binding")


def test_gsubmit_stores_gres_flags_and_refuses_others(cluster: Cluster) -> None:
    before = len(cluster.jobs())
    job_id = cluster.submit("--hold", "--gres-flags=enforce-binding", "--wrap", "true")
    shown = cluster.run("gcontrol", "show", "job", str(job_id))
    assert shown.returncode == 0 and "GresFlags=enforce-binding" in shown.stdout, shown
    listed = cluster.run("gqueue", "--json", "-j", str(job_id))
    assert [j["gres_flags"] for j in json.loads(listed.stdout)["jobs"]] == ["enforce-binding"]
    for bad in (["--gres-flags", "enforce"], ["--gres-flags="]):
        refused = cluster.run("gsubmit", *bad, "--wrap", "true")
        assert refused.returncode == 2, refused
        lines = refused.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("gsubmit: error: invalid --gres-flags")
    assert len(cluster.jobs()) == before + 1  # nothing more stored
    cluster.run("gcancel", str(job_id))


def _fake_node(cluster: Cluster, name: str, **body: Any) -> None:
    cluster.api("POST", "/agent/v1/register", {"node": name, "uid": 0, "gpus": [], "cpus": 8,
                                                "memory_mb": 65536, **body})


def test_an_oom_end_in_gqueue_and_gacct(cluster: Cluster) -> None:
    _fake_node(cluster, "n9", enforced=True, enforcement="cgroup v2")
    job_id = cluster.submit("--nodelist", "n9", "--mem", "2G", "--wrap", "true")
    cluster.wait_state(job_id, "RUNNING")
    answer = cluster.api("POST", f"/agent/v1/jobs/{job_id}/ended", {
        "node": "n9", "run": 0, "outcome": "out_of_memory", "exit_code": 0, "signal": 9,
        "max_rss_bytes": 5 * 2**30 // 2, "cpu_usec": 83_250_000})
    assert answer["changed"] is True
    queue = cluster.run("gqueue", "-t", "OOM", "-o", "%i %t %T")
    assert queue.stdout.split("\n")[1].split() == [str(job_id), "OOM", "OUT_OF_MEMORY"], queue
    table = cluster.run("gacct", "-j", str(job_id))
    assert table.returncode == 0, table
    header, row = table.stdout.splitlines()[0].split(), table.stdout.splitlines()[1].split()
    assert header[-2:] == ["MAXRSS", "TOTALCPU"] and row[-2:] == ["2.50G", "01:23.250"]
    assert "OUT_OF_MEMORY" in row and "0:9" in row
    records = json.loads(cluster.run("gacct", "--json", "--state", "OOM", "-j",
                                     str(job_id)).stdout)["jobs"]
    assert [(r["state"], r["max_rss_bytes"], r["cpu_usec"], r["gpu_mem_peak_mb"])
            for r in records] == [("OUT_OF_MEMORY", 5 * 2**30 // 2, 83_250_000, None)]
    bad = cluster.run("gacct", "--state", "XX")
    assert bad.returncode == 2 and "unknown job state 'XX'" in bad.stderr, bad.stderr


def test_ginfo_shows_unenforced_nodes_and_health_drains(cluster: Cluster) -> None:
    _fake_node(cluster, "n8", enforced=False, enforcement="no writable cgroup hierarchy")
    _fake_node(cluster, "n9", enforced=True, enforcement="cgroup v2")
    per_node = cluster.run("ginfo", "-N")
    row = next(line for line in per_node.stdout.splitlines() if line.startswith("n8"))
    assert "unenforced: no writab" in row, per_node.stdout  # cut to 80 columns
    assert "unenforced" not in next(line for line in per_node.stdout.splitlines()
                                    if line.startswith("n9"))
    warning, = per_node.stderr.splitlines()
    assert warning.startswith("ginfo: warning: jobs are not confined on ") and "n8" in warning
    assert "n9" not in warning and warning.endswith(" (unenforced: see ginfo -N)")
    listed = cluster.run("ginfo", "--json")
    assert listed.stderr == ""  # JSON says it in its fields
    nodes = {n["name"]: n for n in json.loads(listed.stdout)["nodes"]}
    assert (nodes["n8"]["enforced"], nodes["n8"]["enforcement"]) == (
        False, "no writable cgroup hierarchy")
    assert (nodes["n9"]["enforced"], nodes["n9"]["enforcement"]) == (True, "cgroup v2")
    cluster.api("POST", "/agent/v1/nodes/n8/health",
                {"node": "n8", "ok": False, "reason": "GPU 3 missing from nvidia-smi"})
    reasons = cluster.run("ginfo", "-R")
    assert reasons.stdout.splitlines()[0].split() == ["REASON", "STATE", "NODELIST"]
    line = next(line for line in reasons.stdout.splitlines() if line.endswith("n8"))
    assert line.startswith("health check: GPU 3 missing from nvidia-smi")
    assert "drained (health check)" in line
    cluster.api("POST", "/agent/v1/nodes/n8/health", {"node": "n8", "ok": True})
    wait_for(lambda: "n8" not in cluster.run("ginfo", "-R").stdout, what="n8 back in service")


def test_reason_rows_and_the_reason_cell() -> None:
    def node(name: str, state: str, reason: str | None = None, drained_by: str | None = None,
             enforced: bool | None = True) -> ginfo.NodeSummary:
        return ginfo.summarize_node({"name": name, "state": state, "reason": reason,
                                     "drained_by": drained_by, "enforced": enforced,
                                     "enforcement": None, "gpus": []})
    nodes = [node("a1", "DRAIN", "bad fan"), node("a2", "DRAIN", "bad fan"),
             node("b1", "DRAIN", "health check: hot", "health"), node("c1", "UP"),
             node("d1", "DOWN", "NotResponding")]
    assert ginfo.reason_rows(nodes) == [
        ["NotResponding", "down", "d1"], ["bad fan", "drained", "a[1-2]"],
        ["health check: hot", "drained (health check)", "b1"]]
    assert ginfo.node_reason_cell(node("e1", "UP", enforced=False)) \
        == "unenforced: jobs are not confined"
    assert ginfo.node_reason_cell(node("e2", "UP", enforced=None)) == "-"  # said nothing
