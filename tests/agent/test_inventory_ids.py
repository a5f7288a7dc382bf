"""GPU device minors, NUMA nodes and MIG instance ids: from NVML and static inventories."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpusched.config import parse_config
from gpusched.errors import ConfigError
from tests.agent.test_nvml_inventory import answer, inventory
from tests.nvml_fixture import FakeNvml

UUID0 = "GPU-5a1f3c8e-2d47-4b9a-8e61-0c3f7d92ab14"
UUID1 = "GPU-c83e0b6d-91f2-4e05-a7d8-6b24f1e9c530"
MIG = "MIG-d3e3804a-9481-ab90-9531-f1ddbb017b35"


def test_nvml_reports_minor_numa_and_instance_ids(
        fake_nvml_factory: Callable[..., FakeNvml], tmp_path: Path) -> None:
    fake = fake_nvml_factory("mixed_mig.json")
    found = answer(inventory(fake, tmp_path))["gpus"]
    spec = fake.inventory["gpus"]
    whole = [g for g in found if g["parent"] is None]
    for position, (got, want) in enumerate(zip(whole, spec, strict=True)):
        assert got["minor"] == want.get("minor_number", position)
        assert got["numa_node"] == want.get("numa_node")
    slices = {g["uuid"]: g for g in found if g["parent"] is not None}
    assert slices, found
    for want in spec:
        for mig in want.get("mig_devices", []):
            got = slices[mig["uuid"]]
            assert (got["gi_id"], got["ci_id"], got["minor"]) == (mig["gi"], mig["ci"], None)


def _static(*gpus: dict[str, object]) -> object:
    return parse_config({"agent": {"gpus": {"source": "static", "static": list(gpus)}}},
                        "test.toml").agent.static_gpus


def test_static_minor_defaults_to_the_index_and_numa_is_read() -> None:
    gpus = _static({"index": 0, "uuid": UUID0},
                   {"index": 1, "uuid": UUID1, "minor": 5, "numa_node": 1},
                   {"index": 100, "uuid": MIG, "parent": 1, "mig_profile": "1g.10gb",
                    "gi_id": 7, "ci_id": 0})
    assert [(g.minor, g.numa_node, g.gi_id, g.ci_id) for g in gpus] == [  # type: ignore[attr-defined]
        (0, None, None, None), (5, 1, None, None), (None, None, 7, 0)]


@pytest.mark.parametrize("entry, key", [
    ({"index": 0, "uuid": UUID0, "minor": 255}, "minor"),
    ({"index": 0, "uuid": UUID0, "minor": -1}, "minor"),
    ({"index": 0, "uuid": UUID0, "minor": "0"}, "minor"),
    ({"index": 0, "uuid": UUID0, "numa_node": 5000}, "numa_node"),
    ({"index": 0, "uuid": UUID0, "gi_id": 1}, "gi_id"),
])
def test_bad_static_device_ids_name_the_key(entry: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"static\[0\]\.{key}: expected"):
        _static(entry)


def test_a_slice_has_no_minor_of_its_own() -> None:
    with pytest.raises(ConfigError, match=r"static\[1\]\.minor: expected no minor"):
        _static({"index": 0, "uuid": UUID0},
                {"index": 100, "uuid": MIG, "parent": 0, "mig_profile": "1g.10gb", "minor": 3})


def test_registration_carries_the_new_keys(tmp_path: Path) -> None:
    result = inventory(None, tmp_path, source="static",
                       extra=f'[[agent.gpus.static]]\nuuid = "{UUID0}"\nnuma_node = 0\n')
    gpu = json.loads(result.stdout)["gpus"][0]
    assert (gpu["minor"], gpu["numa_node"]) == (0, 0)
