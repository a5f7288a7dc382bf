"""``gsrun --pty bash`` end to end on ``gpusched up --nodes 2``: from the test's own
pseudo-terminal (driven as pexpect would: type, then expect what the screen shows
within a bound), an interactive shell runs on the job's first node on a terminal of
its own; its rank and terminal show, the window size follows ours, Ctrl-C interrupts
a command and the shell goes on, ``exit 7`` ends gsrun with 7, and our terminal's
settings are as before."""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import subprocess
import tempfile
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import wait_for
from tests.e2e.test_steps import BIN, LocalCluster


class Screen:
    """What gsrun shows on our pseudo-terminal, read as it comes."""

    def __init__(self, master: int) -> None:
        self.master = master
        self.data = bytearray()
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            with self.lock:
                self.data += chunk

    def text(self) -> str:
        with self.lock:
            return self.data.decode(errors="replace")

    def mark(self) -> int:
        with self.lock:
            return len(self.data)

    def expect(self, wanted: str, since: int = 0, timeout: float = 20.0) -> str:
        """The screen from ``since`` once it shows ``wanted``; fail after ``timeout``."""
        return wait_for(lambda: wanted in (tail := self.text()[since:]) and tail,
                        timeout=timeout, what=repr(wanted), seen=self.text)

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="gpusched-pty-"))
    os.chmod(root, 0o755)
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


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def test_an_interactive_shell_on_the_first_node(cluster: LocalCluster) -> None:
    job = cluster.submit_script("hold", "exec sleep 600\n")
    wait_for(lambda: cluster.job(job)["state"] == "RUNNING", timeout=60, what="the job")
    master, slave = os.openpty()
    _set_size(master, 30, 100)
    before = termios.tcgetattr(slave)
    env = {**cluster.env, "PS1": "prompt> ", "TERM": "xterm"}

    def our_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    started = time.monotonic()
    proc = subprocess.Popen(
        [str(BIN / "gsrun"), "--jobid", str(job), "--pty", "bash", "--norc", "--noprofile",
         "-i"], env=env, cwd=cluster.root, stdin=slave, stdout=slave, stderr=slave,
        start_new_session=True, preexec_fn=our_terminal)
    screen = Screen(master)
    try:
        screen.expect("prompt> ", timeout=30)
        assert time.monotonic() - started < 20
        mark = screen.mark()
        screen.type("echo rank=$SLURM_PROCID of $SLURM_NTASKS on $SLURMD_NODENAME; tty; "
                    "stty size\r")
        shown = screen.expect("\r\n30 100\r\n", since=mark)
        node = shown.split("rank=0 of 1 on ", 1)[1].split("\r\n", 1)[0]
        assert node in ("node1", "node2") and f"{node}\r\n/dev/pts/" in shown, shown
        # Our window grows: the shell's terminal follows.
        _set_size(master, 50, 132)
        mark = screen.mark()
        time.sleep(0.3)
        screen.type("stty size\r")
        screen.expect("50 132\r\n", since=mark)
        # Ctrl-C interrupts the foreground command; the shell goes on.
        mark = screen.mark()
        screen.type("echo sleeping; sleep 100; echo not-interrupted\r")
        screen.expect("sleeping\r\n", since=mark)
        time.sleep(0.3)
        typed = time.monotonic()
        screen.type("\x03")
        screen.type("echo back-$((6*7))\r")
        screen.expect("back-42\r\n", since=mark, timeout=10)
        assert time.monotonic() - typed < 5
        assert "not-interrupted" not in screen.text()[mark:].replace("echo not-interrupted",
                                                                        "")
        assert proc.poll() is None
        screen.type("exit 7\r")
        assert proc.wait(30) == 7
        screen.expect("task 0: Exited with exit code 7\r\n")
        assert termios.tcgetattr(slave) == before
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(slave)
        os.close(master)
    steps = wait_for(lambda: [s for s in cluster.api("GET", f"/v1/jobs/{job}/steps")
                              ["steps"] if s["state"] != "RUNNING"],
                     timeout=30, what="the step to end")
    assert [(s["state"], s["exit_code"], s["node_names"]) for s in steps] == [
        ("FAILED", 7, [node])]
    assert cluster.run("gcancel", str(job)).returncode == 0
