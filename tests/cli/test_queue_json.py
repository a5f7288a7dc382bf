"""gqueue --json prints the controller's JSON as it came when that is safe, and a
re-encoded, escaped copy when it is not."""

from __future__ import annotations

import json

import pytest

from gpusched.cli.listing import print_jobs_json
from gpusched.errors import GpuschedError

JOB = {"job_id": 7, "name": "train \u202e\x1b]0;x\x07", "user": "alice", "state": "PENDING"}


def printed(capfd: pytest.CaptureFixture[str], data: bytes) -> str:
    print_jobs_json(data)
    return capfd.readouterr().out


def test_the_controllers_text_is_printed_as_it_came(capfd: pytest.CaptureFixture[str]) -> None:
    data = json.dumps({"jobs": [JOB]}, separators=(",", ":")).encode()
    out = printed(capfd, data + b"\n")
    assert out == data.decode() + "\n"
    assert "\\u202e\\u001b]0;x\\u0007" in out and "\x1b" not in out


@pytest.mark.parametrize("data", [
    # Raw non-ASCII and control characters, which the controller never sends.
    json.dumps({"jobs": [JOB]}, ensure_ascii=False).encode(),
    # A key beside "jobs" is not printed.
    json.dumps({"jobs": [JOB], "next": None}).encode(),
    # A table of fields becomes JOB objects.
    json.dumps({"fields": list(JOB), "rows": [list(JOB.values())]}).encode(),
])
def test_anything_else_is_re_encoded_and_escaped(
        capfd: pytest.CaptureFixture[str], data: bytes) -> None:
    out = printed(capfd, data)
    assert out.isascii() and "\x1b" not in out and "\u202e" not in out
    assert out.count("\n") == 1 and json.loads(out) == {"jobs": [JOB]}


@pytest.mark.parametrize("data", [b"<html>", b"[1, 2]"])
def test_a_non_json_answer_is_one_clear_error(
        capfd: pytest.CaptureFixture[str], data: bytes) -> None:
    with pytest.raises(GpuschedError, match="non-JSON answer"):
        print_jobs_json(data)
    assert capfd.readouterr().out == ""
