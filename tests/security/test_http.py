"""The controller's HTTP server against a real unprivileged user: bogus lengths and
streamed bodies are refused without the controller's memory growing, a connection flood
is capped per uid while another user's gqueue stays responsive, silent connections are
closed, and none of it leaves a traceback in the controller's log."""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import BIN, Cluster, wait_for
from tests.security.conftest import LocalUser, run_as

IDLE_TIMEOUT = 3.0
PER_USER = 8
RESPONSIVE = 5.0  # seconds within which the bystander's gqueue must answer
MEMORY_BOUND_KB = 100 * 1024

# Runs as the attacker: each case sends a head with a bogus length, then streams up to
# 200 MB of body; prints what it managed to send and what the controller answered.
STREAM = r"""
import json, socket, sys
path, cases = sys.argv[1], json.loads(sys.argv[2])
chunk, results = b"x" * (1 << 20), []
for head in cases:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    sent = 0
    try:
        s.sendall(head.encode("latin-1"))
        for _ in range(200):
            s.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass
    answer = b""
    try:
        for _ in range(1000):
            data = s.recv(65536)
            if not data:
                break
            answer += data
        closed = True
    except ConnectionResetError:
        closed = True
    except OSError:
        closed = False
    s.close()
    results.append({"sent": sent, "answer": answer.decode("latin-1"), "closed": closed})
print(json.dumps(results))
"""

# Runs as the attacker: opens connections as fast as it can for up to ``seconds``, holds
# the ones the controller admits (silent, half-open) and counts the ones it refuses.
# Writes its counts to ``progress`` as it goes and stops when ``stop`` appears.
FLOOD = r"""
import json, os, socket, sys, time
path, progress, stop, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
held, counts, samples = [], {"attempts": 0, "refused": 0, "admitted": 0,
                             "closed_by_server": 0, "max_held": 0, "other": 0}, []
deadline, reported = time.monotonic() + seconds, 0.0
def prune():
    for s in list(held):
        s.setblocking(False)
        try:
            s.recv(65536)
        except BlockingIOError:
            continue
        except OSError:
            pass
        counts["closed_by_server"] += 1
        held.remove(s)
        s.close()
while time.monotonic() < deadline and counts["attempts"] < 50000 and not os.path.exists(stop):
    prune()
    counts["attempts"] += 1
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)
    try:
        s.sendall(b"GET /v1/jobs HTTP/1.1\r\n")
    except BrokenPipeError:
        pass  # refused before it could ask: the answer may still be there to read
    s.settimeout(0.2)
    try:
        data = s.recv(65536)
    except ConnectionResetError:
        data = b""
    except TimeoutError:
        prune()  # a place opens when the server closes one: it is closed by now
        held.append(s)
        counts["admitted"] += 1
        counts["max_held"] = max(counts["max_held"], len(held))
        data = None
    if data is not None:
        if data.startswith(b"HTTP/1.1 503"):
            counts["refused"] += 1
            if len(samples) < 1:
                samples.append(data.decode("latin-1"))
        else:
            counts["other"] += 1
            samples.append(data[:300].decode("latin-1"))
        s.close()
    if time.monotonic() - reported > 0.2:
        reported = time.monotonic()
        with open(progress + ".tmp", "w") as f:
            json.dump(counts, f)
        os.replace(progress + ".tmp", progress)
for s in held:
    s.close()
print(json.dumps({**counts, "samples": samples}))
"""


@pytest.fixture
def cluster(db_url: str) -> Iterator[Cluster]:
    """A cluster like the suite's, with a short idle timeout and a small per-user cap."""
    c = Cluster(db_url)
    c.config.write_text(c.config.read_text().replace(
        "[controller]\n", f"[controller]\nidle_timeout = {IDLE_TIMEOUT}\n"
                          f"max_connections_per_user = {PER_USER}\n", 1))
    try:
        yield c.up()
    finally:
        c.close()


def _status(pid: int, field: str) -> int:
    """A number from /proc/PID/status (kB for memory fields)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _answers(data: str) -> list[tuple[int, dict[str, str], Any]]:
    """The (status, headers, decoded body) of each HTTP answer in ``data``."""
    found = []
    while data:
        head, _, rest = data.partition("\r\n\r\n")
        status_line, *lines = head.split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        length = int(headers["content-length"])
        found.append((int(status_line.split(" ")[1]), headers, json.loads(rest[:length])))
        data = rest[length:]
    return found


def _controller_log(cluster: Cluster) -> str:
    return (cluster.root / "controller.log").read_text(errors="replace")


def _python_as(user: LocalUser, script: str, *args: str, timeout: float) -> Any:
    """Run ``script`` as ``user``; its stdout is one JSON document."""
    result = run_as(user, [sys.executable, "-c", script, *args], timeout=timeout)
    assert result.returncode == 0, result
    return json.loads(result.stdout)


def _gqueue(cluster: Cluster, user: LocalUser) -> float:
    """Run gqueue as ``user``; it must succeed. Returns how long it took."""
    started = time.monotonic()
    result = run_as(user, [str(BIN / "gqueue")], env=cluster.env, cwd=cluster.work,
                    timeout=60)
    took = time.monotonic() - started
    assert result.returncode == 0 and "JOBID" in result.stdout, result
    return took


def test_the_socket_is_reachable_by_users(cluster: Cluster,
                                          attackers: tuple[LocalUser, LocalUser]) -> None:
    mode = stat.S_IMODE(os.stat(cluster.socket).st_mode)
    assert mode & 0o006 == 0o006, oct(mode)
    assert _gqueue(cluster, attackers[1]) < RESPONSIVE


def test_bogus_lengths_and_streamed_bodies_are_refused_without_memory_growth(
        cluster: Cluster, attackers: tuple[LocalUser, LocalUser]) -> None:
    mallory, _ = attackers
    pid = cluster.procs["controller"].pid
    before_kb = _status(pid, "VmRSS")
    heads = {  # the head, and the statuses of the answers to it
        "Content-Length: -1": [400], "Content-Length: abc": [400],
        "Content-Length: 5\r\nContent-Length: 6": [400], "Content-Length: 209715200": [400],
        "Content-Length: 99999999999999999999999": [400], "Transfer-Encoding: chunked": [411],
        # Ten bytes are read as a body (not JSON: 400), then the rest as the next request,
        # whose request line never ends.
        "Content-Length: 10": [400, 414],
    }
    cases = [f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\n{h}\r\n\r\n" for h in heads]
    results = _python_as(mallory, STREAM, str(cluster.socket), json.dumps(cases), timeout=120)
    for (head, statuses), result in zip(heads.items(), results, strict=True):
        answers = _answers(result["answer"])
        assert [status for status, _, _ in answers] == statuses, (head, result["answer"][:600])
        for _, _, body in answers:
            assert body["error"]["code"] == "invalid" and body["error"]["message"], body
        assert answers[-1][1].get("connection") == "close" and result["closed"], (head, result)
        assert result["sent"] < 20 * (1 << 20), (head, result["sent"])  # cut off, not read
    grown_kb = _status(pid, "VmHWM") - before_kb
    assert grown_kb < MEMORY_BOUND_KB, f"the controller's peak RSS grew by {grown_kb} kB"
    assert cluster.jobs() == []
    assert "Traceback" not in _controller_log(cluster)


def test_a_connection_flood_is_capped_and_another_user_is_still_served(
        cluster: Cluster, attackers: tuple[LocalUser, LocalUser]) -> None:
    mallory, alice = attackers
    pid = cluster.procs["controller"].pid
    threads_before = _status(pid, "Threads")
    progress, stop = cluster.work / "flood.json", cluster.work / "flood.stop"
    outcome: dict[str, Any] = {}

    def flood() -> None:
        outcome.update(_python_as(mallory, FLOOD, str(cluster.socket), str(progress),
                                  str(stop), "60", timeout=120))

    attacker = threading.Thread(target=flood, daemon=True)
    attacker.start()
    try:
        def flooding() -> dict[str, int] | None:
            counts = json.loads(progress.read_text()) if progress.exists() else None
            # Held connections past the idle timeout were closed and their places retaken.
            return counts if counts and counts["refused"] >= 500 and \
                counts["closed_by_server"] >= PER_USER else None
        wait_for(flooding, 45, "the flood to be capped and its idle connections closed",
                 seen=lambda: progress.read_text() if progress.exists() else None)
        assert _status(pid, "Threads") <= threads_before + PER_USER + 6
        took = [_gqueue(cluster, alice) for _ in range(3)]
        assert max(took) < RESPONSIVE, took
        assert cluster.api("GET", "/v1/ping")["version"]  # root, as agents and admins
    finally:
        stop.touch()
        attacker.join(90)
    assert not attacker.is_alive()
    assert _gqueue(cluster, alice) < RESPONSIVE
    assert outcome["max_held"] <= PER_USER and outcome["other"] == 0, outcome
    assert outcome["admitted"] >= PER_USER, outcome
    (status, _, body), = _answers(outcome["samples"][0])
    assert status == 503
    assert body["error"]["code"] == "unavailable"
    assert f"uid {mallory.uid} already has {PER_USER} connections" in body["error"]["message"]
    log = _controller_log(cluster)
    assert "Traceback" not in log and "BrokenPipe" not in log
    refusals = log.count(f"refused a connection from uid {mallory.uid}")
    assert 1 <= refusals <= 10, refusals  # one line per ten seconds, not one per connection
    # The agent's long polls (5 s) outlast the idle timeout (3 s) and are not cut.
    assert all(n["state"] == "UP" for n in cluster.api("GET", "/v1/nodes")["nodes"])
    assert "controller unavailable" not in (cluster.root / "agent.log").read_text()
