"""ginfo's summaries of nodes and partitions (pure: no controller)."""

from __future__ import annotations

from typing import Any

from gpusched.cli.ginfo import partition_rows, summarize_node


def gpu(index: int, job: int | None = None, healthy: bool = True, parent: int | None = None,
        kind: str = "a100-80gb", reason: str | None = None) -> dict[str, Any]:
    return {"index": index, "job_id": job, "healthy": healthy, "parent": parent, "type": kind,
            "health_reason": reason}


def node(name: str, *gpus: dict[str, Any], state: str = "UP") -> dict[str, Any]:
    return {"name": name, "state": state, "reason": None, "gpus": list(gpus)}


def test_states_counts_types_and_mig_slices() -> None:
    idle = summarize_node(node("n1", gpu(0), gpu(1)))
    mixed = summarize_node(node("n2", gpu(0, job=5), gpu(1, healthy=False, reason="Xid 79")))
    full = summarize_node(node("n3", gpu(0, job=5), gpu(1, job=6, kind="l4")))
    mig = summarize_node(node("n4", gpu(0), gpu(100, job=7, parent=0), gpu(101, parent=0),
                              gpu(102, parent=0, healthy=False, reason="Xid 94")))
    sick = summarize_node(node("n5", gpu(0, healthy=False, reason="GPU lost")))
    down = summarize_node(node("n6", gpu(0), state="DOWN"))
    # Every usable GPU of n2 is allocated: the one out of service is counted apart (O).
    assert [s.state for s in (idle, mixed, full, mig, sick, down)] == [
        "idle", "allocated", "allocated", "mixed", "unhealthy", "down"]
    assert (mixed.allocated, mixed.idle, mixed.other, mixed.total) == (1, 0, 1, 2)
    assert mixed.reason == "gpu1: Xid 79"
    assert full.types == {"a100-80gb": 1, "l4": 1}
    # A GPU in MIG mode counts through its slices: 3 units, one used, one free, one out.
    assert (mig.total, mig.allocated, mig.idle, mig.other) == (3, 1, 1, 1)
    assert (mig.mig_free, mig.mig_used, mig.types) == (1, 1, {"a100-80gb": 1})
    assert mig.reason == "gpu102: Xid 94"
    # A failed parent names itself, not each of its slices again.
    parent_out = summarize_node(node("n7", gpu(0, healthy=False, reason="GPU lost"),
                                     gpu(100, parent=0, healthy=False, reason="GPU lost")))
    assert (parent_out.state, parent_out.reason) == ("unhealthy", "gpu0: GPU lost")


def test_partition_rows_group_nodes_by_state() -> None:
    nodes = {n.name: n for n in (summarize_node(node("g1", gpu(0), gpu(1))),
                                 summarize_node(node("g2", gpu(0), gpu(1))),
                                 summarize_node(node("g3", gpu(0, job=1), gpu(1))))}
    parts = [{"name": "gpu", "state": "UP", "default": True, "nodes": ["g1", "g2", "g3"],
              "max_time": 7200},
             {"name": "old", "state": "INACTIVE", "default": False, "nodes": ["g1"],
              "max_time": None},
             {"name": "empty", "state": "DOWN", "default": False, "nodes": [], "max_time": None}]
    rows = partition_rows(parts, nodes)
    assert [(r["partition"], r["state"], r["nodes"], r["gpus"], r["nodelist"]) for r in rows] == [
        ("gpu*", "idle", 2, "0/4/0/4", "g[1-2]"), ("gpu*", "mixed", 1, "1/1/0/2", "g3"),
        ("empty", "n/a", 0, "0/0/0/0", "")]
    assert rows[0]["timelimit"] == "2:00:00" and rows[2]["avail"] == "down"
    assert rows[0]["gpu_types"] == "a100-80gb:4" and rows[0]["mig"] == "-"
