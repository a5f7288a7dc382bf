"""The fake MPS control program (tests/fakemps/nvidia-cuda-mps-control) for tests: a
wrapper named like the real program that records into a file of the test's, what it
recorded, and the daemons it left (killed when the test ends)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FAKE = Path(__file__).resolve().parent / "nvidia-cuda-mps-control"
NAME = "nvidia-cuda-mps-control"


class FakeMps:
    """One test's fake: ``program`` is its path (``bin`` the directory to put on PATH),
    ``record`` the JSON lines it writes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir(parents=True)
        self.record = root / "record.jsonl"
        self.program = self.bin / NAME
        self.program.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" '
                                f'--record "{self.record}" "$@"\n')
        self.program.chmod(0o755)

    def fail_start(self, fail: bool = True, how: str = "fail-start") -> None:
        """Make ``-d`` fail from now on, or work again: ``how`` is "fail-start" (status
        1, a message), "start-hangs" (never returns) or "start-no-daemon" (status 0,
        no daemon)."""
        flag = self.root / how
        if fail:
            flag.touch()
        else:
            flag.unlink(missing_ok=True)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """What it recorded, in order (only events of ``kind`` if given)."""
        try:
            lines = self.record.read_text().splitlines()
        except FileNotFoundError:
            return []
        found = [json.loads(line) for line in lines]
        return [e for e in found if kind is None or e["event"] == kind]

    def live_daemons(self) -> list[int]:
        """The pids of the daemons it started that still run."""
        quit_pids = {e["pid"] for e in self.events("quit")}
        return [e["pid"] for e in self.events("daemon")
                if e["pid"] not in quit_pids and _alive(e["pid"])]

    def kill_all(self) -> None:
        for pid in self.live_daemons():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:].split()[0] not in (b"Z", b"X")


@contextmanager
def fake_mps_in(root: Path) -> Iterator[FakeMps]:
    """A fake nvidia-cuda-mps-control under ``root``; its daemons are killed at the end
    (a test's fixture: ``with fake_mps_in(tmp_path) as fake: yield fake``)."""
    fake = FakeMps(root / "fakemps")
    try:
        yield fake
    finally:
        fake.kill_all()
