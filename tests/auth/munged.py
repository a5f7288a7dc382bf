"""A private munged for tests and benchmarks: its own key, socket, pid, log and seed
files in a directory of its own, started in the foreground and stopped by its pid."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

MUNGED = "/usr/sbin/munged"


def munge_installed() -> bool:
    """Whether munged, munge and unmunge are all here."""
    return (os.access(MUNGED, os.X_OK) or shutil.which("munged") is not None) and all(
        shutil.which(p) for p in ("munge", "unmunge"))


class Munged:
    """One munged with its own key; ``key`` shares another instance's key."""

    def __init__(self, key: bytes | None = None, origin: str | None = None) -> None:
        if not munge_installed():
            raise RuntimeError("munge is not installed: run ./run-tests, which installs it, "
                               "or apt-get install munge")
        # munged wants every directory above its socket passable by all, and its own
        # directory writable by its owner only.
        self.dir = Path(tempfile.mkdtemp(prefix="gpusched-munge-", dir="/tmp"))
        os.chmod(self.dir, 0o755)
        self.key = key if key is not None else secrets.token_bytes(1024)
        self.key_file = self.dir / "munge.key"
        fd = os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, self.key)
        os.close(fd)
        self.socket = self.dir / "munge.socket"
        self.log = self.dir / "munged.log"
        argv = [shutil.which("munged") or MUNGED, "--foreground", "--force",
                f"--socket={self.socket}", f"--key-file={self.key_file}",
                f"--pid-file={self.dir / 'munged.pid'}", f"--log-file={self.log}",
                f"--seed-file={self.dir / 'munged.seed'}", "--num-threads=4"]
        if origin is not None:
            argv.append(f"--origin={origin}")
        self.stderr = open(self.dir / "munged.stderr", "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.stderr,
                                     stderr=self.stderr)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"munged exited with {self.proc.returncode}: "
                                   f"{self.output()}")
            if self.socket.exists():
                probe = subprocess.run(["munge", "-n", "-S", str(self.socket)],
                                       capture_output=True, timeout=10)
                if probe.returncode == 0:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"munged did not answer within {timeout}s: {self.output()}")
            time.sleep(0.05)

    def output(self) -> str:
        """What munged wrote to its stderr so far."""
        try:
            return (self.dir / "munged.stderr").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop this munged (only this one: by its own pid) and remove its files."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)
