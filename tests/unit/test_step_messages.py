"""The step messages and the I/O frames between a step's nodes and gsrun."""

from __future__ import annotations

import secrets

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.errors import UsageError
from gpusched.messages import NodeCommand
from gpusched.messages import stepio
from gpusched.messages.steps import (
    StepCancel,
    StepCreated,
    StepEnd,
    StepIO,
    StepLaunch,
    StepRequest,
    StepTask,
)

TOKEN = "ab" * 32
IO = StepIO("127.0.0.1", 40_000, TOKEN)


def _launch(**changes: object) -> StepLaunch:
    base = StepLaunch(
        job_id=7, run=1, step_id=0, node="n1", node_index=1, name="python", job_name="train",
        user="alice", uid=1000, gid=1000, argv=("python", "-c", "pass"), work_dir="/home/a",
        tasks=(StepTask(2, 0, ("GPU-a",)), StepTask(3, 1, ("GPU-b",))), ntasks=4,
        node_names=("n0", "n1"), tasks_per_node=(2, 2), master_addr="10.0.0.1",
        master_port=29_517, io=IO, environment={"PATH": "/usr/bin"}, umask=0o022,
        gpu_uuids=("GPU-a", "GPU-b"), cpus=4, mem_mb=1024, deadline=2_000_000_000.0,
        output="out-%t.txt")
    return StepLaunch(**{**base.__dict__, **changes})  # type: ignore[arg-type]


def test_round_trips() -> None:
    request = StepRequest(argv=("hostname",), work_dir="/tmp", io=IO, nodes=2, ntasks=4,
                          gpus_per_task=1, exact=True, environment={"A": "b"}, output="o-%t")
    assert StepRequest.parse(request.to_json()) == request
    launch = _launch()
    assert StepLaunch.parse(launch.to_json()) == launch
    created = StepCreated(3, ("n0", "n1"), {"n0": (0, 1), "n1": (2,)}, 3, "n0", 29_600)
    assert StepCreated.parse(created.to_json()) == created
    end = StepEnd("n1", "failed", 1, 3, None, 1.5e9, "boom", 100, 200, ((2, 0, None), (3, 3, None)))
    assert StepEnd.parse(end.to_json()) == end
    command = NodeCommand("step", "n1", 7, 1, 9, launch)
    assert NodeCommand.parse(command.to_json()) == command
    cancel = NodeCommand("step_cancel", "n1", 7, 1, 10, StepCancel(0, 10))
    assert NodeCommand.parse(cancel.to_json()) == cancel


@pytest.mark.parametrize(("change", "message"), [
    ({"argv": []}, "argv: expected the command"),
    ({"work_dir": "relative"}, "work_dir: expected an absolute"),
    ({"ntasks": 0}, "ntasks"),
    ({"ntasks": 70_000}, "ntasks"),
    ({"gpus_per_task": True}, "gpus_per_task"),
    ({"io": {"host": "h", "port": 0, "token": TOKEN}}, "port"),
    ({"io": {"host": "h", "port": 1, "token": "AB" * 32}}, "io.token"),
    ({"io": {"host": "h;rm -rf", "port": 1, "token": TOKEN}}, "io.host"),
    ({"io": None}, "io: expected where gsrun listens"),
    ({"surprise": 1}, "unknown field 'surprise'"),
    ({"environment": {"A": 1}}, "environment"),
])
def test_bad_requests_are_refused_with_one_line(change: dict[str, object], message: str) -> None:
    body = {**StepRequest(argv=("x",), work_dir="/tmp", io=IO).to_json(), **change}
    with pytest.raises(UsageError, match=message) as info:
        StepRequest.parse(body)
    assert "\n" not in str(info.value)


def test_a_step_command_must_match_its_payload() -> None:
    command = NodeCommand("step", "n1", 7, 1, 9, _launch()).to_json()
    command["job_id"] = 8
    with pytest.raises(UsageError, match="the step is for job 7"):
        NodeCommand.parse(command)


def test_frames_split_anywhere_decode_the_same() -> None:
    data = (stepio.hello(TOKEN, 7, 0, 1, [2, 3]) + stepio.encode(stepio.STDOUT, 2, b"hi\n")
            + stepio.exit_frame(2, 0, None) + stepio.encode(stepio.STDERR, 3, b""))
    whole = stepio.Decoder().feed(data)
    assert [f.kind for f in whole] == [stepio.HELLO, stepio.STDOUT, stepio.EXIT, stepio.STDERR]
    for cut in range(len(data)):
        decoder = stepio.Decoder()
        assert decoder.feed(data[:cut]) + decoder.feed(data[cut:]) == whole
    hello = stepio.check_hello(whole[0], TOKEN, 7, 0)
    assert hello.node_index == 1 and hello.tasks == (2, 3)
    assert stepio.check_exit(whole[2]) == (0, None)


def test_bad_frames_are_refused() -> None:
    with pytest.raises(stepio.FrameError, match="wrong token"):
        stepio.check_hello(stepio.Decoder().feed(stepio.hello("cd" * 32, 7, 0, 0, [0]))[0],
                           TOKEN, 7, 0)
    with pytest.raises(stepio.FrameError, match="another step"):
        stepio.check_hello(stepio.Decoder().feed(stepio.hello(TOKEN, 7, 1, 0, [0]))[0],
                           TOKEN, 7, 0)
    with pytest.raises(stepio.FrameError, match="at most"):
        stepio.Decoder().feed(stepio.HEADER.pack(stepio.STDOUT, 0, stepio.MAX_PAYLOAD + 1))
    with pytest.raises(stepio.FrameError, match="unexpected frame kind"):
        stepio.Decoder(stepio.TO_NODE).feed(stepio.encode(stepio.STDOUT, 0, b"x"))
    with pytest.raises(stepio.FrameError, match="exit_code"):
        stepio.check_exit(stepio.Frame(stepio.EXIT, 0, b'{"exit_code": 300}'))


@given(st.binary(max_size=3 * stepio.MAX_PAYLOAD // 2))
def test_chunks_carry_any_output(data: bytes) -> None:
    frames = stepio.Decoder().feed(b"".join(stepio.chunks(stepio.STDOUT, 5, data)))
    assert b"".join(f.payload for f in frames) == data
    assert all(f.task == 5 and len(f.payload) <= stepio.MAX_PAYLOAD for f in frames)


def test_random_tokens_have_the_wire_shape() -> None:
    token = secrets.token_hex(32)
    assert StepIO.parse({"host": "::1", "port": 5, "token": token}).token == token
