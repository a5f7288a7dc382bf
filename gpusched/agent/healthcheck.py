"""The node health check: a site's program, run as the agent (root) every interval and
before the node takes work, whose result the agent reports to the controller.

A failure drains the node with the program's first line of output; a pass lifts a drain
that an earlier failure made. The result is reported every interval, changed or not, so
that a controller started since (or one that lost a report) learns the node's state.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from gpusched.agent.siteprog import run_site_program
from gpusched.messages.agent import MAX_HEALTH_REASON, NodeHealth

log = logging.getLogger(__name__)

# The search path a check runs with: the agent's own may be a service manager's.
CHECK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class HealthCheck:
    """The configured ``program``, run within ``timeout`` seconds every ``interval``
    seconds for ``node``."""

    def __init__(self, program: Path, interval: float, timeout: float, node: str) -> None:
        self.program = program
        self.interval = interval
        self.timeout = timeout
        self.node = node
        self.last: NodeHealth | None = None  # the latest result, None before the first
        self._running = threading.Lock()  # one check at a time

    def environment(self) -> dict[str, str]:
        """What the program is given, and nothing of the agent's own environment."""
        return {"PATH": CHECK_PATH, "GPUSCHED_NODE": self.node,
                "SLURMD_NODENAME": self.node, "HOSTNAME": socket.gethostname()}

    def check(self) -> NodeHealth:
        """Run the program once; the result (also kept as ``last``)."""
        with self._running:
            reason = run_site_program(str(self.program), self.environment(), self.timeout,
                                      "health check")
            health = NodeHealth(node=self.node, ok=reason is None,
                                reason=None if reason is None else reason[:MAX_HEALTH_REASON])
            previous, self.last = self.last, health
        if health.ok and (previous is None or not previous.ok):
            log.info("node health check passed")
        elif not health.ok and (previous is None or previous.reason != health.reason):
            log.warning("node health check failed: %s", health.reason)
        return health

    def run(self, report: Callable[[NodeHealth], None], stop: threading.Event) -> None:
        """Until ``stop`` is set: every interval, check and ``report`` the result. A
        report that fails is logged once for a streak of failures and made again with
        the next interval's result; nothing here ends the loop but ``stop``."""
        failing = False
        while not stop.wait(self.interval):
            try:
                report(self.check())
            except Exception as exc:  # noqa: BLE001 - the node keeps being checked
                if not failing:
                    log.warning("cannot report the node health check's result (trying "
                                "again every %g s): %s", self.interval, exc)
                failing = True
                continue
            if failing:
                log.info("node health check's result reported again")
            failing = False
