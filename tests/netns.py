"""Another host on this machine: a network namespace joined to this one by a veth
pair, so a process run in it reaches the controller from an address of its own, as
an agent or a login node on another machine would.

Each namespace gets 10.<net>.<index>.2, with this side's end at 10.<net>.<index>.1;
``net`` differs per pytest-xdist worker so parallel tests never share a subnet. Only
addresses inside namespaces the test made are ever used.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import IO, Any


def _worker_net() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = "".join(ch for ch in worker if ch.isdigit()) or "0"
    return 200 + int(digits) % 50


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


class NetNamespace:
    """One namespace, its veth pair and its addresses; ``close()`` removes them."""

    def __init__(self, index: int) -> None:
        tag = f"{os.getpid() % 10000}x{index}"
        self.name = f"gs{tag}"
        self.host_if, self.inner_if = f"gh{tag}"[:15], f"gn{tag}"[:15]
        net = _worker_net()
        self.host_address = f"10.{net}.{index}.1"
        self.address = f"10.{net}.{index}.2"
        _ip("netns", "add", self.name)
        try:
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.inner_if)
            _ip("link", "set", self.inner_if, "netns", self.name)
            _ip("addr", "add", f"{self.host_address}/24", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            self.run_ip("addr", "add", f"{self.address}/24", "dev", self.inner_if)
            self.run_ip("link", "set", self.inner_if, "up")
            self.run_ip("link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def run_ip(self, *args: str) -> None:
        _ip("netns", "exec", self.name, "ip", *args)

    def argv(self, command: Sequence[str]) -> list[str]:
        """``command`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *command]

    def popen(self, command: Sequence[str], env: Mapping[str, str] | None = None,
              stdout: int | IO[Any] | None = None,
              stderr: int | IO[Any] | None = None) -> subprocess.Popen[bytes]:
        """Start ``command`` inside the namespace."""
        return subprocess.Popen(self.argv(command), env=None if env is None else dict(env),
                                stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)

    def close(self) -> None:
        """Remove the namespace (its end of the pair goes with it) and our end."""
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=20)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=20)
