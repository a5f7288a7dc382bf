"""An allocation's submission (``interactive``: galloc, gsrun outside a job) parses as a
job's does, its script optional (a placeholder that never runs is stored), its flag a
real boolean, never an array; ``[scheduler] allocation_grace`` is bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.config import load_config
from gpusched.errors import ConfigError, UsageError
from gpusched.messages.jobs import ALLOCATION_SCRIPT, JobRequest


def test_an_allocation_needs_no_script_and_round_trips() -> None:
    request = JobRequest.parse({"interactive": True, "work_dir": "/home/a", "gpus": 2,
                                "nodes": 2})
    assert (request.interactive, request.script, request.nodes) == (True, ALLOCATION_SCRIPT, 2)
    assert JobRequest.parse(request.to_json()) == request
    batch = JobRequest.parse({"script": "#!/bin/sh\n", "work_dir": "/home/a"})
    assert batch.interactive is False and batch.to_json()["interactive"] is False


@pytest.mark.parametrize(("body", "message"), [
    ({"interactive": "yes"}, "interactive: expected true or false"),
    ({"interactive": 1}, "interactive: expected true or false"),
    ({"interactive": True, "array": "0-3"},
     "array: an interactive allocation cannot be a job array"),
    ({"interactive": False}, "This does not look like a batch script"),
    ({"interactive": True, "script": "echo hi"}, "This does not look like a batch script"),
])
def test_a_bad_allocation_is_one_usage_error(body: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        JobRequest.parse({"work_dir": "/home/a", **body})
    assert caught.value.message.startswith(message), caught.value.message
    assert "\n" not in caught.value.message


def test_the_allocation_grace_defaults_to_a_minute_and_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "gpusched.toml"
    path.write_text("[scheduler]\nallocation_grace = 5\n")
    assert load_config(path).scheduler.allocation_grace == 5.0
    path.write_text("")
    assert load_config(path).scheduler.allocation_grace == 60.0
    for value in ("4.9", "86401", "nan", '"60"'):
        path.write_text(f"[scheduler]\nallocation_grace = {value}\n")
        with pytest.raises(ConfigError) as caught:
            load_config(path)
        assert "scheduler.allocation_grace" in str(caught.value)
        assert "5 to 86400 seconds" in str(caught.value)


def test_an_allocation_may_ask_for_a_share_of_one_gpu() -> None:
    """galloc and gsrun take gsubmit's --gres, shares included; a body without one has no
    share fields, as before."""
    from gpusched.cli.allocation import allocation_body

    body = allocation_body({"gres": "mps:30,gpumem:8G"}, "alloc", "/home/a", {})
    assert (body["gpus"], body["share_mode"], body["share"], body["gpu_mem_mb"]) == (
        1, "mps", 30, 8192)
    request = JobRequest.parse(body)
    assert (request.interactive, request.share_mode, request.share, request.gpu_mem_mb) == (
        True, "mps", 30, 8192)
    plain = allocation_body({"gpus": "2"}, "alloc", "/home/a", {})
    assert {"share_mode", "share", "gpu_mem_mb"}.isdisjoint(plain)
    with pytest.raises(UsageError, match="cannot take whole nodes"):
        allocation_body({"gres": "shard:1", "exclusive": True}, "alloc", "/home/a", {})
