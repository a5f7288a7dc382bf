"""Hostile submissions from a real unprivileged user: each is refused with one clear
line and stores nothing; QOS access and submit limits hold; jobs get the submitter's
umask."""

from __future__ import annotations

import os
import stat
import time
from typing import Any

import pytest

from tests.e2e.cluster import BIN, Cluster, wait_for
from tests.security.conftest import LocalUser, run_as

SCRIPT = "#!/bin/sh\necho hi\n"


def _body(work: str, **extra: Any) -> dict[str, Any]:
    return {"script": SCRIPT, "work_dir": work, **extra}


def _gsubmit(cluster: Cluster, user: LocalUser, *args: str) -> Any:
    """gsubmit ARGS run by ``user``."""
    return run_as(user, [str(BIN / "gsubmit"), *args], env=cluster.env, cwd=cluster.work)


def _one_line_refusal(result: Any, code: int, needle: str) -> None:
    assert result.returncode == code, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(("args", "needle"), [
    (["-J", "build\x1b]0;owned\x07", "--wrap", "true"], "name: the character U+001B"),
    (["-J", "report\u202etxt.sh", "--wrap", "true"], "name: the character U+202E"),
    (["-o", "/tmp/%99999999999999999999j.out", "--wrap", "true"], "more than 10 digits"),
    (["-o", "/tmp/" + "a" * 5000, "--wrap", "true"], "shorter than 4096 bytes"),
    (["-d", "afterok:" + "9" * 4300, "--wrap", "true"], "job ids from 1 to"),
])
def test_hostile_flags_are_refused_and_store_nothing(
        cluster: Cluster, attackers: tuple[LocalUser, LocalUser], args: list[str],
        needle: str) -> None:
    mallory, _ = attackers
    _one_line_refusal(_gsubmit(cluster, mallory, *args), 2, needle)
    assert cluster.jobs() == []


def test_hostile_api_requests_are_refused_and_store_nothing(
        cluster: Cluster, attackers: tuple[LocalUser, LocalUser]) -> None:
    """The API is reachable without gsubmit: the same bounds hold there."""
    mallory, _ = attackers
    work = str(cluster.work)
    first = cluster.api_as(mallory.uid, mallory.gid, "POST", "/v1/jobs", _body(work))
    assert "job_id" in first, first
    cases = [
        (_body(work, dependency="afterok:" + ":".join([str(first["job_id"])] * 2_000_000)),
         "characters, more than"),
        (_body(work, environment={"X": "y" * (3 * 1024 * 1024)}), "environment"),
        (_body(work, args=["a"] * 100_000), "args"),
        (_body(work, name="n\x9b1m"), "U+009B"),
        (_body(work, gpus=2**63), "gpus"),
        (_body(work, time_limit=2**40), "time_limit"),
        (_body(work, umask=0o7777), "umask"),
        (_body(work, work_dir="/tmp/\x00"), "work_dir"),
        (_body(work, uid=0), "unknown field"),
    ]
    for body, needle in cases:
        started = time.monotonic()
        answer = cluster.api_as(mallory.uid, mallory.gid, "POST", "/v1/jobs", body)
        assert needle in answer.get("error", ""), (needle, answer)
        assert time.monotonic() - started < 10
    assert [j["job_id"] for j in cluster.jobs()] == [first["job_id"]]
    assert cluster.job(first["job_id"])["uid"] == mallory.uid


@pytest.mark.parametrize("job_id", [str(2**63), "1" * 4300, "-1", "0x10", "1%202"])
def test_impossible_job_ids_are_not_found_not_errors(
        cluster: Cluster, attackers: tuple[LocalUser, LocalUser], job_id: str) -> None:
    mallory, _ = attackers
    for method, path in (("GET", f"/v1/jobs/{job_id}"), ("POST", f"/v1/jobs/{job_id}/cancel"),
                         ("GET", f"/v1/jobs?ids={job_id}"), ("GET", f"/v1/priority?ids={job_id}")):
        answer = cluster.api_as(mallory.uid, mallory.gid, method, path, {} if method == "POST"
                                else None)
        error = answer.get("error", "")
        assert error and "internal" not in error, (path, answer)
    assert "Traceback" not in (cluster.root / "controller.log").read_text()


def _apply(cluster: Cluster, data: dict[str, Any]) -> None:
    cluster.api("POST", "/v1/admin/apply", {"files": [{"source": "test.toml", "data": data}]})


def test_qos_access_and_submit_limits_hold_against_a_user(
        cluster: Cluster, attackers: tuple[LocalUser, LocalUser]) -> None:
    mallory, alice = attackers
    _apply(cluster, {
        "account": [{"name": "lab", "qos": ["normal"]}],
        "user": [{"name": mallory.name, "accounts": ["lab"], "max_submit_jobs": 2},
                 {"name": alice.name, "accounts": ["lab"], "qos": ["normal", "high"]},
                 {"name": "root", "accounts": ["lab"]}],
        "qos": [{"name": "normal"}, {"name": "high", "priority": 1000, "preempt": ["normal"]}],
    })
    _one_line_refusal(_gsubmit(cluster, mallory, "--qos", "high", "-H", "--wrap", "true"), 2, "high is not one of the QOS you may use")
    assert cluster.jobs() == []
    for _ in range(2):
        assert _gsubmit(cluster, mallory, "-H", "--wrap", "true").returncode == 0
    _one_line_refusal(_gsubmit(cluster, mallory, "-H", "--wrap", "true"), 1,
                      "AssocMaxSubmitJobLimit")
    _one_line_refusal(_gsubmit(cluster, mallory, "-H", "--array", "0-9", "--wrap", "true"), 1,
                      "10 more jobs would exceed")
    assert len(cluster.jobs()) == 2
    # The bystander is not held to the attacker's limits and may use the QOS given to her.
    result = _gsubmit(cluster, alice, "--parsable", "-H", "--qos", "high", "--wrap", "true")
    assert result.returncode == 0, result
    assert cluster.job(int(result.stdout))["qos"] == "high"


@pytest.mark.parametrize(("umask", "mode"), [(0o077, 0o600), (0o022, 0o644)])
def test_jobs_create_their_files_with_the_submitters_umask(
        cluster: Cluster, attackers: tuple[LocalUser, LocalUser], umask: int, mode: int) -> None:
    mallory, _ = attackers
    result = run_as(mallory, ["sh", "-c", f"umask {umask:03o} && exec {BIN / 'gsubmit'} "
                                          "--parsable -o out-%j.txt --wrap 'echo hi'"],
                    env=cluster.env, cwd=cluster.work)
    assert result.returncode == 0, result
    job_id = int(result.stdout)
    cluster.wait_state(job_id, "COMPLETED", timeout=30)
    out = cluster.work / f"out-{job_id}.txt"
    wait_for(out.exists, what="the job's output")
    assert stat.S_IMODE(os.stat(out).st_mode) == mode
    assert os.stat(out).st_uid == mallory.uid


def test_nul_characters_in_a_query_are_refused(
        cluster: Cluster, attackers: tuple[LocalUser, LocalUser]) -> None:
    mallory, _ = attackers
    for path in ("/v1/jobs?name=a%00b", "/v1/accounting?user=a%00", "/v1/jobs?state=%00",
                 "/v1/jobs?%00=1"):
        answer = cluster.api_as(mallory.uid, mallory.gid, "GET", path)
        assert "NUL" in answer.get("error", ""), (path, answer)


def test_a_variable_that_is_not_utf8_is_left_out_not_fatal(
        cluster: Cluster, attackers: tuple[LocalUser, LocalUser]) -> None:
    """A shell may hold bytes that are no UTF-8; the job starts without that variable,
    and gsubmit says so, instead of the submission failing (or storing garbage)."""
    mallory, _ = attackers
    env = {**cluster.env, "GOODVAR": "caf\u00e9", "BADVAR": "x\udcff"}  # the byte 0xff
    result = run_as(mallory, [str(BIN / "gsubmit"), "--parsable", "-o", "env-%j.txt", "--wrap",
                              "echo ${GOODVAR}-${BADVAR:-unset}"], env=env, cwd=cluster.work)
    assert result.returncode == 0, result
    assert "BADVAR: not valid UTF-8" in result.stderr
    job_id = int(result.stdout)
    cluster.wait_state(job_id, "COMPLETED", timeout=30)
    out = cluster.work / f"env-{job_id}.txt"
    wait_for(out.exists, what="the job's output")
    assert out.read_text() == "caf\u00e9-unset\n"
