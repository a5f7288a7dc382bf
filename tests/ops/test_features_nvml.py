"""The features an agent registers, read through the real pynvml against the fake NVML
library (``gpusched agent inventory``): GPU types and models, memory, MIG, NVLink and
each compute capability; a static inventory gives what its GPU records say."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agent.test_nvml_inventory import answer, inventory
from tests.nvml_fixture import FakeNvml


@pytest.mark.parametrize(("name", "features"), [
    ("dgx_a100_8.json", ["a100", "a100-80gb", "gpumem80g", "nvlink", "sm_80"]),
    ("hetero.json", ["gpumem16g", "gpumem24g", "gpumem80g", "h100", "h100-80gb", "l4", "sm_75",
                     "sm_89", "sm_90", "t4"]),
    ("mixed_mig.json", ["a100", "a100-80gb", "gpumem80g", "mig", "sm_80"]),
])
def test_nvml_features(fake_nvml_factory: Callable[..., FakeNvml], tmp_path: Path, name: str,
                       features: list[str]) -> None:
    found = answer(inventory(fake_nvml_factory(name), tmp_path))
    assert found["features"] == features
    assert ("nvlink" in features) == any(link["kind"] == "NVLINK" for link in found["links"])


def test_static_features(tmp_path: Path) -> None:
    extra = ('[[agent.gpus.static]]\nindex = 0\nuuid = "GPU-4c4c4c4c-0000-4000-8000-000000000001"\n'
             'type = "l4"\nmemory_mb = 23034\n')
    assert answer(inventory(None, tmp_path, "static", extra))["features"] == ["gpumem24g", "l4"]
