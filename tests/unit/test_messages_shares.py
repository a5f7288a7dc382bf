"""POST /v1/jobs: a share of one GPU (share_mode, share) and GPU memory (gpu_mem_mb),
their bounds and what they exclude, one error naming the field each."""

from __future__ import annotations

from typing import Any

import pytest

from gpusched.errors import UsageError
from gpusched.messages import JobRequest
from gpusched.messages.jobs import MAX_GPU_MEM_MB, MAX_SHARE
from tests.unit.test_messages import BASE


@pytest.mark.parametrize(("change", "message"), [
    ({"share_mode": "mig", "share": 1}, "share_mode: expected one of ['mps', 'shard'], got 'mig'"),
    ({"share_mode": "mps"}, "share: a mps request needs share, the units of one GPU"),
    ({"share": 5}, "share_mode: give it with share (units of one GPU), or neither"),
    ({"share_mode": "mps", "share": 0}, "share: expected units of one GPU from 1 to 10000, got 0"),
    ({"share_mode": "shard", "share": MAX_SHARE + 1}, "share: expected units of one GPU from 1 "
                                                      "to 10000, got 10001"),
    ({"share_mode": "mps", "share": 1.5}, "share: expected units of one GPU"),
    ({"gpu_mem_mb": 0}, "gpu_mem_mb: expected MB of GPU memory from 1 to 16777216, got 0"),
    ({"gpu_mem_mb": MAX_GPU_MEM_MB + 1}, "gpu_mem_mb: expected MB of GPU memory from 1"),
    ({"gpu_mem_mb": "20G"}, "gpu_mem_mb: expected MB of GPU memory"),
    ({"share_mode": "mps", "share": 50, "gpus": 2},
     "gpus: a share of one GPU (share_mode mps) is one GPU, not 2"),
    ({"gpu_mem_mb": 1024, "gpus": 2}, "gpus: GPU memory (gpu_mem_mb) is one GPU, not 2"),
    ({"share_mode": "shard", "share": 2, "nodes": 2},
     "nodes: a share of one GPU (share_mode shard) is on one node, not 2"),
    ({"gpu_mem_mb": 1024, "nodelist": ["a", "b"]},
     "nodes: GPU memory (gpu_mem_mb) is on one node, not 2"),
    ({"share_mode": "mps", "share": 50, "exclusive": True},
     "exclusive: a share of one GPU (share_mode mps) cannot take whole nodes"),
])
def test_a_share_out_of_bounds_is_refused_with_its_field(change: dict[str, Any],
                                                         message: str) -> None:
    with pytest.raises(UsageError) as caught:
        JobRequest.parse({**BASE, **change})
    assert message in caught.value.message


def test_a_share_or_gpu_memory_is_one_gpu() -> None:
    """A share or a GPU-memory request is one GPU (gpus 0 or 1 sent); without either the
    three fields are None, as before."""
    share = JobRequest.parse({**BASE, "share_mode": "mps", "share": 50, "gpu_mem_mb": 20480})
    assert (share.gpus, share.share_mode, share.share, share.gpu_mem_mb) == (1, "mps", 50, 20480)
    memory = JobRequest.parse({**BASE, "gpus": 1, "gpu_types": ["a100"], "gpu_mem_mb": 512})
    assert (memory.gpus, memory.gpu_types, memory.share_mode, memory.gpu_mem_mb) == (
        1, ("a100",), None, 512)
    plain = JobRequest.parse({**BASE, "gpus": 2, "share_mode": None, "share": None})
    assert (plain.gpus, plain.share_mode, plain.share, plain.gpu_mem_mb) == (2, None, None, None)
    assert plain.to_json()["share_mode"] is None
