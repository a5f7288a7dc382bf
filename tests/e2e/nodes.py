"""More nodes for an end-to-end cluster: agents of their own (own node name, state
directory and log) beside the cluster's node01, and ways to make a node die, freeze or
come back."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.e2e.cluster import Cluster, end_agent_jobs, wait_for


def set_controller(cluster: Cluster, **settings: float) -> None:
    """Add ``[controller]`` settings to the cluster's configuration (before up())."""
    lines = "".join(f"{key} = {value}\n" for key, value in settings.items())
    text = cluster.config.read_text()
    cluster.config.write_text(text.replace("[controller]\n", f"[controller]\n{lines}", 1))


class Node:
    """One node's agent, started from the cluster's configuration under its own name."""

    def __init__(self, cluster: Cluster, name: str, gpus: int = 1) -> None:
        self.cluster, self.name = cluster, name
        if name == "node01":  # the cluster's own agent
            self.state, self.config, self.key = cluster.agent_state, cluster.config, "agent"
            return
        self.state = cluster.root / f"agent-{name}"
        cluster.extra_agents.append((self.state, name))
        self.config = cluster.root / f"{name}.toml"
        self.key = f"agent-{name}"
        text = cluster.config.read_text()
        text = text.replace('node_name = "node01"', f'node_name = "{name}"')
        text = text.replace(f'state_dir = "{cluster.agent_state}"', f'state_dir = "{self.state}"')
        self.config.write_text(re.sub(r"count = \d+", f"count = {gpus}", text))

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.cluster.procs[self.key]

    def start(self) -> None:
        """Start the agent and wait until the controller lists the node UP."""
        log = open(self.cluster.root / f"{self.key}.log", "ab")
        self.cluster.procs[self.key] = subprocess.Popen(
            [sys.executable, "-P", "-m", "gpusched.cli.gpusched", "agent", "--config",
             str(self.config)], stdout=log, stderr=log, stdin=subprocess.DEVNULL,
            env=self.cluster.agent_env)
        log.close()
        wait_for(lambda: self.state_of() == ("UP", None), what=f"{self.name} UP",
                 seen=self.cluster.logs)

    def state_of(self) -> tuple[str, str | None] | None:
        """(state, reason) as the controller lists the node; None when it does not."""
        for node in self.cluster.api("GET", "/v1/nodes")["nodes"]:
            if node["name"] == self.name:
                return node["state"], node["reason"]
        return None

    def supervisors(self) -> list[dict[str, int]]:
        """supervisor.json of each job directory of this node."""
        found = []
        for info in self.state.glob("jobs/*/supervisor.json"):
            try:
                found.append(json.loads(info.read_text()))
            except (OSError, ValueError):
                pass
        return found

    def freeze(self) -> None:
        """SIGSTOP the agent; its jobs' supervisors run on."""
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def die(self) -> None:
        """The whole node dies: the agent, every supervisor and every job, at once."""
        self.proc.send_signal(signal.SIGKILL)
        end_agent_jobs(self.state, self.name, remove=False)
        self.proc.wait(timeout=20)
        del self.cluster.procs[self.key]

    def stop_jobs(self) -> None:
        """Kill whatever this node still runs (for the end of a test)."""
        end_agent_jobs(self.state, self.name)


def ran(path: Path) -> list[list[str]]:
    """The lines a test job appended to ``path``, split into words."""
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []
