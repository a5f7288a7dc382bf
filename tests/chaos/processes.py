"""The processes of a chaos cluster (tests/chaos/cluster.py): a daemon the keeper may
kill, pause and start again, and the cluster's own PostgreSQL, killed with SIGKILL and
started again (crash recovery)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpusched.errors import Unavailable
from tests.pg import _FAST, ScratchPostgres


def _alive_pid(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody reaps has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Daemon:
    """One controller or agent process; ``wanted`` while it should run."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    wanted: bool = False
    spawned_at: float = 0.0
    self_exits: list[tuple[float, int]] = field(default_factory=list)  # (time, status)

    def spawn(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, env=self.env, cwd="/")
        self.spawned_at = time.monotonic()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, sig: int) -> bool:
        """Signal the process if it runs; True if it did."""
        if not self.alive():
            return False
        assert self.proc is not None
        self.proc.send_signal(sig)
        return True

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def terminate(self) -> None:
        """Ask it to end for good (SIGCONT and SIGTERM); see ``reap``."""
        self.wanted = False
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)

    def reap(self, grace: float = 10.0) -> None:
        """Wait for the end ``terminate`` asked for; SIGKILL after ``grace``."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill()


class Postgres:
    """The cluster's PostgreSQL server: a database migrated from the template."""

    def __init__(self) -> None:
        self.scratch = ScratchPostgres()
        self.url = self.scratch.fresh_database()
        # The scratch server runs with synchronous_commit off, which loses the last
        # commits to a kill -9: the cluster's database keeps every commit it answered
        # (a database's setting comes before the server's command line).
        with self.scratch.admin() as conn:
            name = self.url.split("@/", 1)[1].split("?", 1)[0]
            conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = on')

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.scratch.server.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def up(self) -> bool:
        pid = self.postmaster_pid()
        return pid is not None and _alive_pid(pid)

    def kill(self) -> bool:
        """kill -9 of the postmaster; its backends end when they notice."""
        pid = self.postmaster_pid()
        if pid is None or not _alive_pid(pid):
            return False
        os.kill(pid, signal.SIGKILL)
        return True

    def start(self, timeout: float = 60.0) -> None:
        """Start the server again after a kill, once the old backends have let go of its
        shared memory (crash recovery follows)."""
        deadline = time.monotonic() + timeout
        while True:
            pid = self.postmaster_pid()
            if pid is not None and not _alive_pid(pid):
                # This host's init reaps no orphans: pg_ctl would take the zombie for a
                # running server, and the new postmaster would refuse its lock files.
                server = self.scratch.server
                (server.data_dir / "postmaster.pid").unlink(missing_ok=True)
                server.socket_file.with_name(server.socket_file.name + ".lock").unlink(
                    missing_ok=True)
            try:
                self.scratch.server.start(_FAST, timeout=20)
                return
            except Unavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def close(self) -> None:
        if self.up():
            self.scratch.server.stop("immediate")
        shutil.rmtree(self.scratch.root, ignore_errors=True)
