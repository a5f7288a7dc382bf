"""How much of a GPU one holding counts for in GPU-hours (core.usage.gpu_fraction)."""

from __future__ import annotations

import pytest

from gpusched.core.usage import gpu_fraction


@pytest.mark.parametrize(("units", "offered", "fraction"), [
    (None, None, 1.0),   # a whole GPU or a MIG slice
    (None, 100, 1.0),    # a whole GPU of a node whose GPUs may be shared
    (25, 100, 0.25),     # mps:25 of the usual 100
    (1, 4, 0.25),        # shard:1 of 4
    (3, 7, 3 / 7),
    (100, 100, 1.0),
    (150, 100, 1.0),     # never more than the GPU
    (25, None, 1.0),     # the partition no longer shares it: what it offered is unknown
    (25, 0, 1.0),
])
def test_a_share_counts_as_its_fraction_of_the_gpu(units: int | None, offered: int | None,
                                                   fraction: float) -> None:
    assert gpu_fraction(units, offered) == pytest.approx(fraction)
