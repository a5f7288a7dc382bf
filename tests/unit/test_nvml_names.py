"""Normalised GPU types and MIG profile names from what NVML reports."""

from __future__ import annotations

import pytest

from gpusched.agent.nvml import gpu_type, mig_profile
from gpusched.core.shapes import is_gpu_kind, is_mig_profile


@pytest.mark.parametrize("name,expected", [
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA A100-PCIE-40GB", "a100-40gb"),
    ("NVIDIA A100 80GB PCIe", "a100-80gb"),
    ("NVIDIA H100 80GB HBM3", "h100-80gb"),  # as an H100 VM's driver 580 reports it
    ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"),
    ("Tesla T4", "t4"),
    ("Tesla V100-SXM2-32GB", "v100-32gb"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA", "gpu"),
])
def test_gpu_types(name: str, expected: str) -> None:
    assert gpu_type(name) == expected
    assert is_gpu_kind(expected)


@pytest.mark.parametrize("slices,memory,parent,name,expected", [
    (1, 9728, 81920, "NVIDIA A100-SXM4-80GB", "1g.10gb"),
    (2, 19968, 81920, "NVIDIA A100-SXM4-80GB", "2g.20gb"),
    (3, 40192, 81920, "NVIDIA A100-SXM4-80GB", "3g.40gb"),
    (4, 40192, 81920, "NVIDIA A100-SXM4-80GB", "4g.40gb"),
    (7, 80896, 81920, "NVIDIA A100-SXM4-80GB", "7g.80gb"),
    (1, 4864, 40960, "NVIDIA A100-PCIE-40GB", "1g.5gb"),
    (1, 9984, 81559, "NVIDIA H100 80GB HBM3", "1g.10gb"),
    (1, 19968, 81559, "NVIDIA H100 80GB HBM3", "1g.20gb"),
    (1, 11008, 95830, "NVIDIA H100 NVL", "1g.12gb"),  # nominal from memory: 94 GiB
])
def test_mig_profiles(slices: int, memory: int, parent: int, name: str, expected: str) -> None:
    assert mig_profile(slices, memory, parent, name) == expected
    assert is_mig_profile(expected)
