"""How an agent acknowledges the commands it did: carried by its next work poll where
the controller said (when the node registered) that it takes them there, by a request
of their own where it did not, and by a request of their own at once for what one poll
cannot carry. NodeCommands is the agent's own; the client records the requests it is
asked to send (the controller's side is tests/controller/test_command_acks.py, the
whole way tests/e2e/test_lifecycle.py)."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

from gpusched.agent.commands import NodeCommands
from gpusched.agent.jobends import JobEnd
from gpusched.agent.settings import AgentConfig
from gpusched.core.bounds import MAX_ACKS_IN_POLL


class Recorder:
    """Stands in for the ApiClient: keeps each request and answers it as the controller
    answers an acknowledgement."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any, float | None]] = []

    def request(self, method: str, path: str, body: Any = None,
                timeout: float | None = None) -> dict[str, Any]:
        self.sent.append((method, path, body, timeout))
        return {"ok": True, "changed": body.get("seqs", []) if body else []}


def _commands(tmp_path: Path) -> tuple[NodeCommands, list[JobEnd]]:
    ends: list[JobEnd] = []
    config = AgentConfig(node_name="n1", state_dir=tmp_path)
    commands = NodeCommands(config, None, None, None, deque(), dict,  # type: ignore[arg-type]
                            ends.append)
    return commands, ends


def _refused(*seqs: int) -> dict[str, Any]:
    """A work answer of commands this agent refuses (and so has done with at once)."""
    return {"commands": [{"kind": "nonsense", "seq": seq} for seq in seqs]}


def _acked(client: Recorder) -> list[int]:
    return [seq for method, path, body, _ in client.sent
            if (method, path) == ("POST", "/agent/v1/commands/done") for seq in body["seqs"]]


def test_without_the_controllers_word_each_answer_is_acknowledged_at_once(
        tmp_path: Path) -> None:
    commands, _ = _commands(tmp_path)
    client = Recorder()
    commands.handle(client, _refused(4, 5))  # type: ignore[arg-type]
    assert _acked(client) == [4, 5]
    assert commands.acks_for_poll(client) == []  # type: ignore[arg-type]


def test_the_next_poll_carries_them_and_they_are_forgotten_once_answered(
        tmp_path: Path) -> None:
    commands, _ = _commands(tmp_path)
    commands.acks_in_poll = True
    client = Recorder()
    commands.handle(client, _refused(4, 5))  # type: ignore[arg-type]
    commands.handle(client, _refused(6))  # type: ignore[arg-type]
    assert client.sent == []
    carried = commands.acks_for_poll(client)  # type: ignore[arg-type]
    assert carried == [4, 5, 6]
    # A poll that failed: the next carries them again.
    assert commands.acks_for_poll(client) == [4, 5, 6]  # type: ignore[arg-type]
    commands.handle(client, _refused(7))  # type: ignore[arg-type]
    commands.acked(carried)
    assert commands.acks_for_poll(client) == [7]  # type: ignore[arg-type]
    assert client.sent == []


def test_what_one_poll_cannot_carry_goes_at_once_oldest_first(tmp_path: Path) -> None:
    commands, _ = _commands(tmp_path)
    commands.acks_in_poll = True
    client = Recorder()
    seqs = list(range(1, MAX_ACKS_IN_POLL + 4))
    commands.handle(client, _refused(*seqs))  # type: ignore[arg-type]
    assert _acked(client) == seqs[:3]
    assert commands.acks_for_poll(client) == seqs[3:]  # type: ignore[arg-type]


def test_held_ones_go_by_a_request_once_polls_no_longer_take_them(tmp_path: Path) -> None:
    commands, _ = _commands(tmp_path)
    commands.acks_in_poll = True
    client = Recorder()
    commands.handle(client, _refused(8, 9))  # type: ignore[arg-type]
    commands.acks_in_poll = False  # registered again with a controller that does not say so
    assert commands.acks_for_poll(client) == []  # type: ignore[arg-type]
    assert _acked(client) == [8, 9]


def test_a_stopping_agent_sends_what_it_holds_within_its_timeout(tmp_path: Path) -> None:
    commands, _ = _commands(tmp_path)
    commands.acks_in_poll = True
    client = Recorder()
    commands.handle(client, _refused(10))  # type: ignore[arg-type]
    commands.flush_acks(client, timeout=2.0)  # type: ignore[arg-type]
    assert client.sent == [("POST", "/agent/v1/commands/done", {"node": "n1", "seqs": [10]},
                            2.0)]
    commands.flush_acks(client, timeout=2.0)  # type: ignore[arg-type]
    assert len(client.sent) == 1  # nothing held: nothing sent
