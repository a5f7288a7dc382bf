"""A launch order's share of one GPU (LaunchOrder.share, a ShareGrant): it round-trips
through JSON with the rest of the order, each field is bounded, and it must name the
order's only GPU; and the agent's mps_control setting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.config import load_config
from gpusched.errors import ConfigError, UsageError
from gpusched.messages import LaunchOrder, NodeCommand
from gpusched.messages.agent import MAX_GPU_MEM_MB, MAX_SHARE_UNITS, ShareGrant
from tests.unit.test_messages import JSON_VALUES, ORDER, launch_orders

UUID = "GPU-11111111-2222-3333-4444-555555555555"
OTHER = "GPU-66666666-7777-8888-9999-000000000000"
MIG = "MIG-GPU-11111111-2222-3333-4444-555555555555/1/0"
SHARE = {"mode": "mps", "gpu_uuid": UUID, "units": 30, "of": 100, "mem_mb": 20480}


@st.composite
def shared_orders(draw: st.DrawFn) -> dict[str, Any]:
    """A launch order that holds a share of its one GPU, and must parse."""
    body = draw(launch_orders())
    gpu = draw(st.sampled_from([UUID, OTHER, MIG, "MIG-" + UUID[4:]]))
    of = draw(st.integers(1, MAX_SHARE_UNITS))
    share = {"mode": draw(st.sampled_from(["mps", "shard"])), "gpu_uuid": gpu,
             "units": draw(st.integers(1, of)), "of": of}
    if draw(st.booleans()):
        share["mem_mb"] = draw(st.integers(0, MAX_GPU_MEM_MB))
    return {**body, "gpu_uuids": [gpu], "share": share}


def _through_json(order: LaunchOrder) -> Any:
    return json.loads(json.dumps(order.to_json()))


@settings(max_examples=200, deadline=None)
@given(body=shared_orders())
def test_a_shared_order_parses_and_round_trips(body: dict[str, Any]) -> None:
    order = LaunchOrder.parse(body)
    assert isinstance(order.share, ShareGrant)
    assert order.share.gpu_uuid == order.gpu_uuids[0]
    assert order.share.mem_mb == body["share"].get("mem_mb", 0)
    again = LaunchOrder.parse(_through_json(order))
    assert again == order and again.to_json() == order.to_json()
    command = {"kind": "launch", "node": order.node, "job_id": order.job_id, "run": order.run,
               "seq": 1, "payload": order.to_json()}
    assert NodeCommand.parse(json.loads(json.dumps(command))).payload == order


@settings(max_examples=600, deadline=None)
@given(body=shared_orders(), key=st.sampled_from(sorted(SHARE) + ["extra"]),
       value=JSON_VALUES)
def test_a_share_with_any_field_changed_parses_or_is_one_usage_error(
        body: dict[str, Any], key: str, value: object) -> None:
    body["share"][key] = value
    try:
        order = LaunchOrder.parse(body)
    except UsageError as exc:
        assert exc.message.startswith("share: ") and "\n" not in exc.message
        return
    assert LaunchOrder.parse(_through_json(order)) == order


def test_an_order_without_a_share_has_none_and_does_not_send_one() -> None:
    for body in (ORDER, {**ORDER, "share": None}):
        order = LaunchOrder.parse(body)
        assert order.share is None
        assert "share" not in order.to_json()


def test_a_share_keeps_its_fields_and_defaults_to_no_memory_limit() -> None:
    order = LaunchOrder.parse({**ORDER, "gpu_uuids": [UUID], "share": SHARE})
    assert order.share == ShareGrant("mps", UUID, 30, 100, 20480)
    assert order.to_json()["share"] == SHARE
    plain = {k: v for k, v in SHARE.items() if k != "mem_mb"}
    assert LaunchOrder.parse({**ORDER, "gpu_uuids": [UUID], "share": plain}).share.mem_mb == 0


@pytest.mark.parametrize(("change", "message"), [
    ({"mode": "mig"}, "share: mode: expected one of ['mps', 'shard'], got 'mig'"),
    ({"mode": None}, "share: mode: expected one of"),
    ({"units": 0}, "share: units: expected units of the GPU from 1 to 100, got 0"),
    ({"units": 101}, "share: units: expected units of the GPU from 1 to 100, got 101"),
    ({"units": None}, "share: units: expected units of the GPU, got nothing"),
    ({"units": True}, "share: units: expected units of the GPU, got True"),
    ({"of": 0}, "share: of: expected the units the GPU offers from 1 to 10000, got 0"),
    ({"of": 10_001, "units": 1}, "share: of: expected the units the GPU offers from 1 to 10000"),
    ({"mem_mb": -1}, "share: mem_mb: expected MB of GPU memory from 0 to 16777216, got -1"),
    ({"mem_mb": MAX_GPU_MEM_MB + 1}, "share: mem_mb: expected MB of GPU memory from 0 to"),
    ({"mem_mb": 1.5}, "share: mem_mb: expected MB of GPU memory, got 1.5"),
    ({"gpu_uuid": "GPU-1"}, "share: gpu_uuid: expected a GPU UUID (GPU- or MIG- and a UUID)"),
    ({"gpu_uuid": UUID + "/../x"}, "share: gpu_uuid: expected a GPU UUID"),
    ({"gpu_uuid": "../" + UUID}, "share: gpu_uuid: expected a GPU UUID"),
    ({"gpu_uuid": ""}, "share: gpu_uuid: expected 1 to 256 characters"),
    ({"gpu_uuid": "G" * 300}, "share: gpu_uuid: expected at most 256 characters, got 300"),
    ({"gpu_uuid": None}, "share: gpu_uuid: expected a GPU UUID, got nothing"),
    ({"extra": 1}, "share: unknown field 'extra' in the share"),
])
def test_a_share_out_of_bounds_is_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        LaunchOrder.parse({**ORDER, "gpu_uuids": [UUID], "share": {**SHARE, **change}})
    assert message in caught.value.message


@pytest.mark.parametrize(("gpus", "share"), [
    ([], SHARE), ([OTHER], SHARE), ([UUID, OTHER], SHARE), ([OTHER, UUID], SHARE),
    ([UUID, UUID], SHARE)])
def test_a_share_must_be_of_the_orders_only_gpu(gpus: list[str], share: object) -> None:
    with pytest.raises(UsageError) as caught:
        LaunchOrder.parse({**ORDER, "gpu_uuids": gpus, "share": share})
    assert caught.value.message.startswith(
        f"share: the share is of GPU {UUID}, which must be the order's only GPU")


@pytest.mark.parametrize("share", [5, "mps", [SHARE], True])
def test_a_share_is_an_object(share: object) -> None:
    with pytest.raises(UsageError) as caught:
        LaunchOrder.parse({**ORDER, "gpu_uuids": [UUID], "share": share})
    assert caught.value.message.startswith("share: expected a JSON object, got ")


# ------------------------------------------------------------ [agent] mps_control


def _agent_config(tmp_path: Path, line: str) -> Any:
    path = tmp_path / "gpusched.toml"
    path.write_text(f"[agent]\n{line}\n")
    return load_config(path).agent


def test_mps_control_defaults_to_the_program_on_path_and_takes_a_path(tmp_path: Path) -> None:
    assert _agent_config(tmp_path, "").mps_control == "nvidia-cuda-mps-control"
    assert _agent_config(tmp_path, 'mps_control = "/opt/cuda/bin/mps-control"').mps_control \
        == "/opt/cuda/bin/mps-control"
    assert _agent_config(tmp_path, 'mps_control = "mps-ctl.2"').mps_control == "mps-ctl.2"


@pytest.mark.parametrize("value", ['"bin/nvidia-cuda-mps-control"', '""', '".."',
                                   '"a b"', '"/opt/\\u0007x"', f'"/{"x" * 5000}"', "3",
                                   '"x;rm"'])
def test_mps_control_must_be_a_path_or_a_program_name(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _agent_config(tmp_path, f"mps_control = {value}")
    assert "agent.mps_control" in str(caught.value)
    assert "an absolute path or a program name found on PATH" in str(caught.value)
