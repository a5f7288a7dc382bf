"""ginfo: partitions and nodes with their GPUs by state, like sinfo."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

import typer

from gpusched.cli.common import new_app, run_cli
from gpusched.cli.output import print_table, print_warning
from gpusched.core.hostlist import compress_hostlist
from gpusched.core.timefmt import format_duration

PROG = "ginfo"
app = new_app("Show partitions and nodes with their GPUs by state, like sinfo.")


@dataclass
class NodeSummary:
    """One node's GPUs: a unit is a whole GPU, or a MIG slice (a GPU in MIG mode is
    counted through its slices)."""

    name: str
    state: str  # idle, mixed, allocated, drained, down, unhealthy
    allocated: int = 0
    idle: int = 0
    other: int = 0  # out of service
    types: dict[str, int] = field(default_factory=dict)  # whole GPUs by type
    mig_free: int = 0
    mig_used: int = 0
    reason: str = ""
    node_reason: str = ""  # the node's own (a drain's), without its GPUs'
    drained_by: str | None = None  # "health": its health check drained it
    enforced: bool | None = None  # whether its agent confines jobs (None: not said)
    enforcement: str | None = None  # how, or why it cannot
    sharing: str | None = None  # how its GPUs are shared: "mps", "shard" (None: whole)
    shares: int | None = None  # the units each of its shared GPUs offers
    # Each GPU shares hold units of now: {"gpu": index, "units": units held}.
    shares_in_use: list[dict[str, int]] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Every unit of the node."""
        return self.allocated + self.idle + self.other


def node_sharing(partitions: list[dict[str, Any]]) -> dict[str, tuple[str, int]]:
    """How each node's GPUs are shared, (mode, units each GPU offers), from the
    partitions of ``GET /v1/partitions`` (by name): the first partition that shares the
    node's GPUs, as the scheduler reads it (no node is shared two ways)."""
    found: dict[str, tuple[str, int]] = {}
    for part in sorted(partitions, key=lambda p: p["name"]):
        if part.get("sharing") and part.get("shares"):
            for name in part["nodes"]:
                found.setdefault(name, (part["sharing"], part["shares"]))
    return found


def summarize_node(node: dict[str, Any], sharing: tuple[str, int] | None = None
                   ) -> NodeSummary:
    """A node of ``GET /v1/nodes`` summed up; ``sharing``: how its GPUs are shared
    (``node_sharing``)."""
    gpus = node["gpus"]
    parents = {g["parent"] for g in gpus if g.get("parent") is not None}
    summary = NodeSummary(node["name"], "")
    if sharing is not None:
        summary.sharing, summary.shares = sharing
    summary.shares_in_use = [{"gpu": g["index"], "units": g["share_units"]} for g in gpus
                             if g.get("share_units") and g.get("parent") is None]
    bad: list[str] = []
    out = {g["index"] for g in gpus if not g["healthy"]}
    for gpu in gpus:
        parent = gpu.get("parent")
        if parent is None:
            kind = gpu.get("type") or "gpu"
            summary.types[kind] = summary.types.get(kind, 0) + 1
        if not gpu["healthy"] and (parent is None or parent not in out):
            bad.append(f"gpu{gpu['index']}: {gpu.get('health_reason') or 'unhealthy'}")
        if parent is None and gpu["index"] in parents:
            continue  # in MIG mode: counted through its slices
        if not gpu["healthy"]:
            summary.other += 1
        elif gpu.get("job_id") is not None:
            summary.allocated += 1
            summary.mig_used += parent is not None
        else:
            summary.idle += 1
            summary.mig_free += parent is not None
    if node["state"] == "DOWN":
        summary.state = "down"
    elif node["state"] == "DRAIN":
        summary.state = "drained"
    elif summary.total and summary.other == summary.total:
        summary.state = "unhealthy"
    elif summary.allocated == 0:
        summary.state = "idle"
    elif summary.idle == 0:
        summary.state = "allocated"
    else:
        summary.state = "mixed"
    summary.reason = "; ".join(([node["reason"]] if node.get("reason") else []) + bad)
    summary.node_reason = node.get("reason") or ""
    summary.drained_by = node.get("drained_by")
    summary.enforced = node.get("enforced")
    summary.enforcement = node.get("enforcement")
    return summary


def unenforced(node: NodeSummary) -> bool:
    """Whether the node's agent said it does not confine jobs."""
    return node.enforced is False


def node_reason_cell(node: NodeSummary) -> str:
    """ginfo -N's REASON: the node's and its GPUs' reasons, then whether jobs there run
    unconfined (and why)."""
    parts = [node.reason] if node.reason else []
    if unenforced(node):
        parts.append(f"unenforced: {node.enforcement or 'jobs are not confined'}")
    return "; ".join(parts) or "-"


def reason_rows(nodes: Sequence[NodeSummary]) -> list[list[str]]:
    """ginfo -R, as sinfo -R: each reason a node is out of service (drained or down)
    for, with the nodes that share it; a health check's drain says so."""
    groups: dict[tuple[str, str], list[str]] = {}
    for node in nodes:
        if node.state not in ("drained", "down") and not node.node_reason:
            continue
        reason = node.node_reason or "none given"
        key = (reason, node.state + (" (health check)" if node.drained_by == "health" else ""))
        groups.setdefault(key, []).append(node.name)
    return [[reason, state, compress_hostlist(names)]
            for (reason, state), names in sorted(groups.items())]


def shares_cell(node: NodeSummary) -> str:
    """ginfo -N's SHARES: each GPU shares hold units of, as ``gpu0:mps:60/100`` (units
    held of the units it offers), comma separated; ``-`` when none."""
    mode, offered = node.sharing or "share", node.shares or "?"
    return ",".join(f"gpu{used['gpu']}:{mode}:{used['units']}/{offered}"
                    for used in node.shares_in_use) or "-"


def sharing_cell(part: dict[str, Any]) -> str:
    """ginfo's SHARING: how a partition shares its GPUs, as ``mps:100`` (mode and the
    units each GPU offers); ``-`` for whole GPUs only."""
    return f"{part['sharing']}:{part['shares']}" if part.get("sharing") else "-"


def _counts(items: Sequence[NodeSummary]) -> str:
    a, i, o = (sum(getattr(n, k) for n in items) for k in ("allocated", "idle", "other"))
    return f"{a}/{i}/{o}/{a + i + o}"


def _types(items: Sequence[NodeSummary]) -> str:
    total: dict[str, int] = {}
    for node in items:
        for kind, count in node.types.items():
            total[kind] = total.get(kind, 0) + count
    return ",".join(f"{kind}:{count}" for kind, count in sorted(total.items())) or "-"


def _mig(items: Sequence[NodeSummary]) -> str:
    free, used = sum(n.mig_free for n in items), sum(n.mig_used for n in items)
    return f"{free}/{used}" if free or used else "-"


def partition_rows(partitions: list[dict[str, Any]], nodes: dict[str, NodeSummary]
                   ) -> list[dict[str, Any]]:
    """One row per partition and node state, as sinfo prints them."""
    rows = []
    for part in partitions:
        if part["state"] == "INACTIVE":
            continue
        members = [nodes[n] for n in part["nodes"] if n in nodes]
        by_state: dict[str, list[NodeSummary]] = {}
        for node in members:
            by_state.setdefault(node.state, []).append(node)
        for state, group in sorted(by_state.items()) or [("n/a", [])]:
            rows.append({
                "partition": part["name"] + ("*" if part["default"] else ""),
                "avail": "up" if part["state"] == "UP" else part["state"].lower(),
                "timelimit": format_duration(part["max_time"]) if part["max_time"] else "infinite",
                "sharing": part.get("sharing"), "shares": part.get("shares"),
                "nodes": len(group), "state": state, "gpus": _counts(group),
                "gpu_types": _types(group), "mig": _mig(group),
                "nodelist": compress_hostlist(n.name for n in group) if group else ""})
    return rows


@app.command()
def ginfo(
    per_node: Annotated[bool, typer.Option("-N", "--Node", help="One line per node.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    reasons: Annotated[bool, typer.Option(
        "-R", "--list-reasons", help="Why nodes are drained or down, like sinfo -R.")] = False,
) -> None:
    """Partitions and nodes with GPUs allocated/idle/out of service/total (A/I/O/T), GPU
    types, MIG slices free/used, and, where some partition shares its GPUs, how: SHARING,
    a partition's mode and units per GPU (mps:100, shard:4; - for whole GPUs only);
    SHARES (-N), the units shares hold of each GPU (gpu0:mps:60/100). A GPU shares hold
    part of counts as allocated.

    Node states: idle, mixed, allocated, drained, down, and unhealthy (every GPU out of
    service). REASON names each GPU the health checks took out, and why, and says
    "unenforced" where the node's agent does not confine jobs (GPU devices, memory and
    CPUs are then not enforced).

    Examples: ginfo; ginfo -N; ginfo -R; ginfo --json
    """
    from gpusched.client import ApiClient

    with ApiClient() as client:
        nodes_answer = client.request("GET", "/v1/nodes")
        parts = client.request("GET", "/v1/partitions")["partitions"]
    shared = node_sharing(parts)
    nodes = {n["name"]: summarize_node(n, shared.get(n["name"])) for n in nodes_answer["nodes"]}
    member_of: dict[str, list[str]] = {}
    for part in parts:
        for name in part["nodes"]:
            member_of.setdefault(name, []).append(part["name"])
    if as_json:
        typer.echo(json.dumps({
            "partitions": partition_rows(parts, nodes),
            "nodes": [{**asdict(n), "total": n.total, "partitions": member_of.get(n.name, [])}
                      for n in nodes.values()]}, indent=2))
        return
    loose = [n.name for n in nodes.values() if unenforced(n)]
    if loose:
        print_warning(PROG, f"jobs are not confined on {compress_hostlist(loose)} "
                      "(unenforced: see ginfo -N)")
    if reasons:
        print_table(["REASON", "STATE", "NODELIST"], reason_rows(list(nodes.values())),
                    shrinkable=frozenset({0, 2}))
        return
    # The sharing columns only where some partition shares its GPUs.
    sharing = any(part.get("sharing") for part in parts)
    if per_node:
        rows = [[n.name, ",".join(member_of.get(n.name, [])) or "-", n.state, _counts([n]),
                 _types([n]), _mig([n]), *([shares_cell(n)] if sharing else []),
                 node_reason_cell(n)] for n in nodes.values()]
        print_table(["NODELIST", "PARTITION", "STATE", "GPUS(A/I/O/T)", "GPU_TYPES", "MIG(F/U)",
                     *(["SHARES"] if sharing else []), "REASON"], rows,
                    shrinkable=frozenset({1, 4, 7 if sharing else 6}))
        return
    table = [[r["partition"], r["avail"], r["timelimit"], str(r["nodes"]), r["state"], r["gpus"],
              r["gpu_types"], r["mig"], *([sharing_cell(r)] if sharing else []), r["nodelist"]]
             for r in partition_rows(parts, nodes)]
    print_table(["PARTITION", "AVAIL", "TIMELIMIT", "NODES", "STATE", "GPUS(A/I/O/T)",
                 "GPU_TYPES", "MIG(F/U)", *(["SHARING"] if sharing else []), "NODELIST"], table,
                right_aligned=frozenset({3}), shrinkable=frozenset({6, 9 if sharing else 8}))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ginfo`` console script."""
    return run_cli(app, PROG, argv)
