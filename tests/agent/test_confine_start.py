"""Finding the agent's cgroup subtree at start: unique names, and under cgroup v2 the
agent moving itself into a leaf of its own beside its jobs' subtree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpusched.agent.confine import subtree_name

START = """
import json, sys
from pathlib import Path
from gpusched.agent.confine import open_confinement
from gpusched.config import AgentConfig
config = AgentConfig(node_name="node1", state_dir=Path(sys.argv[2]))
found = open_confinement(config, base=Path(sys.argv[1]))
print(json.dumps({**found.registration(), "cgroup": Path("/proc/self/cgroup").read_text()}))
"""


def test_names_differ_per_node_and_state_dir() -> None:
    a = subtree_name("node1", Path("/tmp/a/agent"))
    assert a == subtree_name("node1", Path("/tmp/a/agent"))
    assert a.startswith("gpusched-node1-") and len(a) <= 64
    assert a != subtree_name("node1", Path("/tmp/b/agent"))
    assert a != subtree_name("node2", Path("/tmp/a/agent"))
    assert "/" not in subtree_name("../x/" * 20, Path("/s"))


def test_under_cgroup_v2_the_agent_moves_into_a_leaf_of_its_own(
        cgroup2: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    own = cgroup2 / Path(Path("/proc/self/cgroup").read_text().split("0::", 1)[1].strip()
                         ).relative_to("/")
    name = subtree_name("node1", state)
    result = subprocess.run([sys.executable, "-c", START, str(cgroup2), str(state)],
                            capture_output=True, text=True, timeout=30)
    try:
        assert result.returncode == 0, result.stderr
        found = json.loads(result.stdout)
        assert found["enforced"] is True
        assert found["enforcement"].startswith(f"cgroup v2 at {own / name}")
        # it was itself in the leaf when it finished, not in the subtree's parent
        leaf = "/" + str((own / f"{name}.agent").relative_to(cgroup2))
        assert f"0::{leaf.replace('//', '/')}\n" in found["cgroup"], found["cgroup"]
        assert (own / name).is_dir()
    finally:
        for path in (own / f"{name}.agent", own / name):
            if path.is_dir():
                path.rmdir()


def test_the_registered_description_stays_within_the_controllers_bound() -> None:
    from gpusched.agent.confine import MAX_ENFORCEMENT, Confinement

    long = Confinement(None, "not confined: cannot create cgroup /" + "x/" * 300 + "\n\tdenied")
    body = long.registration()
    assert body["enforced"] is False
    assert len(body["enforcement"]) == MAX_ENFORCEMENT and body["enforcement"].isprintable()
    assert body["enforcement"].endswith("...")
    short = Confinement(None, "not confined: off").registration()
    assert short == {"enforced": False, "enforcement": "not confined: off"}
