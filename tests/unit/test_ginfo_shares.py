"""ginfo's view of shared GPUs (pure: no controller): how each node's GPUs are shared,
the units shares hold of each GPU, and a partition's sharing."""

from __future__ import annotations

from typing import Any

from gpusched.cli.ginfo import (
    node_sharing,
    partition_rows,
    shares_cell,
    sharing_cell,
    summarize_node,
)


def gpu(index: int, job: int | None = None, units: int = 0, parent: int | None = None
        ) -> dict[str, Any]:
    return {"index": index, "job_id": job, "healthy": True, "parent": parent, "type": "a100",
            "health_reason": None, "share_units": units}


def node(name: str, *gpus: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "state": "UP", "reason": None, "gpus": list(gpus)}


def part(name: str, nodes: list[str], sharing: str | None = None, shares: int | None = None
         ) -> dict[str, Any]:
    return {"name": name, "state": "UP", "default": False, "nodes": nodes, "max_time": None,
            "sharing": sharing, "shares": shares}


def test_nodes_take_the_sharing_of_the_first_partition_by_name_that_shares_them() -> None:
    parts = [part("whole", ["a", "b", "c"]), part("zz", ["b"], "mps", 200),
             part("slices", ["c"], "shard", 4), part("mps", ["b"], "mps", 100)]
    assert node_sharing(parts) == {"b": ("mps", 100), "c": ("shard", 4)}


def test_shares_in_use_per_gpu() -> None:
    shared = summarize_node(node("b", gpu(0, job=5, units=60), gpu(1, job=7, units=25),
                                 gpu(2), gpu(3, job=9)), ("mps", 100))
    assert shared.shares_in_use == [{"gpu": 0, "units": 60}, {"gpu": 1, "units": 25}]
    assert (shared.sharing, shared.shares) == ("mps", 100)
    assert shares_cell(shared) == "gpu0:mps:60/100,gpu1:mps:25/100"
    # A GPU shares hold part of counts as allocated, as a whole one does.
    assert (shared.allocated, shared.idle, shared.state) == (3, 1, "mixed")
    idle = summarize_node(node("c", gpu(0)), ("shard", 4))
    assert (shares_cell(idle), idle.shares_in_use) == ("-", [])
    whole = summarize_node(node("a", gpu(0, job=3)))
    assert (shares_cell(whole), whole.sharing, whole.shares) == ("-", None, None)
    # An agent's listing from before shares (no share_units) reads as none held.
    old = summarize_node({"name": "d", "state": "UP", "reason": None, "gpus": [
        {"index": 0, "job_id": 1, "healthy": True, "parent": None, "type": "a100"}]})
    assert old.shares_in_use == []


def test_partition_rows_say_how_gpus_are_shared() -> None:
    nodes = {"b": summarize_node(node("b", gpu(0, job=5, units=60)), ("mps", 100)),
             "a": summarize_node(node("a", gpu(0)))}
    rows = partition_rows([part("mps", ["b"], "mps", 100), part("whole", ["a"])], nodes)
    assert [(r["partition"], r["sharing"], r["shares"], sharing_cell(r)) for r in rows] == [
        ("mps", "mps", 100, "mps:100"), ("whole", None, None, "-")]
