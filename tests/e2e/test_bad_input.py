"""Bad input: exit code 2, one clear line, nothing stored."""

from __future__ import annotations

import pytest

from tests.e2e.cluster import Cluster


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--partition", "nope", "--wrap", "true"], "invalid partition specified: nope"),
        (["--gpus", "-1", "--wrap", "true"], "gpus"),
        (["--time", "abc", "--wrap", "true"], "invalid time"),
        (["/no/such/script.sh"], "/no/such/script.sh"),
        (["--gpus", "5", "--wrap", "true"], "no node in partition gpu has that (the most: 4 such GPUs)"),
        (["--time", "2-00:00:00", "--wrap", "true"], "MaxTime"),
        (["--time", "UNLIMITED", "--wrap", "true"], "UNLIMITED"),
    ],
)
def test_rejected_with_exit_2_and_nothing_stored(cluster: Cluster, args: list[str], needle: str) -> None:
    result = cluster.run("gsubmit", *args)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert result.stdout == ""
    assert cluster.jobs() == []
