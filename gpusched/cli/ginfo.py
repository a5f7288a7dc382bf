"""ginfo: partitions and nodes with their GPUs by state, like sinfo."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Optional

import typer

from gpusched.cli.common import new_app, run_slurm_cli
from gpusched.cli.listing import node_set
from gpusched.cli.output import print_table, print_warning
from gpusched.core.hostlist import compress_hostlist
from gpusched.core.timefmt import format_duration
from gpusched.errors import UsageError

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
    cpus: int = 0  # as its agent reports them (0: not counted)
    memory_mb: int = 0
    features: list[str] = field(default_factory=list)  # its features (-C/--constraint)

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
    summary = NodeSummary(node["name"], "", features=list(node.get("features") or []))
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
    summary.cpus, summary.memory_mb = node.get("cpus") or 0, node.get("memory_mb") or 0
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


def gpu_config(node: NodeSummary) -> tuple[tuple[str, int], ...]:
    """What sinfo -e tells nodes apart by here: their GPUs, by type and count."""
    return tuple(sorted(node.types.items()))


def partition_rows(partitions: list[dict[str, Any]], nodes: dict[str, NodeSummary],
                   exact: bool = False) -> list[dict[str, Any]]:
    """One row per partition and node state (with ``exact``, sinfo -e, and GPU
    configuration), as sinfo prints them."""
    rows = []
    for part in partitions:
        if part["state"] == "INACTIVE":
            continue
        members = [nodes[n] for n in part["nodes"] if n in nodes]
        by_state: dict[tuple[str, tuple[tuple[str, int], ...]], list[NodeSummary]] = {}
        for node in members:
            by_state.setdefault((node.state, gpu_config(node) if exact else ()), []).append(node)
        for (state, _), group in sorted(by_state.items()) or [(("n/a", ()), [])]:
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
    dead: Annotated[bool, typer.Option("-d", "--dead", help="Only nodes that are down.")] = False,
    responding: Annotated[bool, typer.Option(
        "-r", "--responding", help="Only nodes that are not down.")] = False,
    iterate: Annotated[Optional[int], typer.Option(
        "-i", "--iterate", min=1, metavar="SECONDS", help="Print again every SECONDS.")] = None,
    long: Annotated[bool, typer.Option("-l", "--long", help="sinfo's long format.")] = False,
    clusters: Annotated[Optional[str], typer.Option(
        "-M", "--clusters", help="This cluster's name; any other is refused.")] = None,
    node_names: Annotated[Optional[str], typer.Option(
        "-n", "--nodes", help="Only these nodes (node[01-04],gpu7).")] = None,
    noheader: Annotated[bool, typer.Option("-h", "--noheader", help="No header line.")] = False,
    fmt: Annotated[Optional[str], typer.Option(
        "-o", "--format", help="sinfo's field codes, e.g. '%P %.6D %t %G %N' (docs/cli.md).")] = None,
    long_format: Annotated[Optional[str], typer.Option(
        "-O", "--Format", help="sinfo's field names, e.g. 'Partition,Nodes:.6,StateLong'.")] = None,
    partition: Annotated[Optional[str], typer.Option(
        "-p", "--partition", help="Only these partitions (comma separated).")] = None,
    summarize: Annotated[bool, typer.Option(
        "-s", "--summarize", help="One line per partition: NODES(A/I/O/T).")] = False,
    sort: Annotated[Optional[str], typer.Option(
        "-S", "--sort", help="Sort by these field codes, '-' for descending (e.g. 'P,-D').")] = None,
    states: Annotated[Optional[str], typer.Option(
        "-t", "--states", help="Only nodes in these states: idle, mix, alloc, drain, down, "
        "unhealthy (or 'all').")] = None,
    verbose: Annotated[bool, typer.Option(
        "-v", "--verbose", help="Say on stderr what is asked of the controller.")] = False,
    exact: Annotated[bool, typer.Option(
        "-e", "--exact", help="Nodes of different GPU types or counts on lines of their own.")
    ] = False,
    reservation: Annotated[bool, typer.Option(
        "-T", "--reservation", help="Advance reservations: name, state, start, end, duration "
        "and nodes.")] = False,
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

    Examples: ginfo; ginfo -N; ginfo -R; ginfo --json; ginfo -p gpu -t idle,mix;
    ginfo -o '%P %.6D %t %G %N'; ginfo -s
    """
    import os
    import time

    from gpusched.cli import infoformat
    from gpusched.cli.slurmflags import check_clusters

    check_clusters(clusters if clusters is not None else os.environ.get("SLURM_CLUSTERS"))
    if reservation:  # sinfo -T (gpusched/cli/reservations.py)
        from gpusched.cli.reservations import print_reservations
        return print_reservations(as_json)
    fmt = fmt or (None if long_format or long or summarize or as_json else
                  os.environ.get("GINFO_FORMAT") or os.environ.get("SINFO_FORMAT") or None)
    partition = partition or os.environ.get("GINFO_PARTITION") or os.environ.get(
        "SINFO_PARTITION") or None
    sort = sort or os.environ.get("GINFO_SORT") or os.environ.get("SINFO_SORT") or None
    if sum(x is not None for x in (fmt, long_format)) + long + summarize > 1:
        raise UsageError("choose one of -o/--format, -O/--Format, -l/--long and -s/--summarize")
    pieces = (infoformat.parse_long_format(long_format) if long_format is not None
              else infoformat.parse_format(fmt) if fmt is not None
              else infoformat.parse_format(
                  infoformat.SUMMARY_FORMAT if summarize
                  else (infoformat.LONG_NODE_FORMAT if per_node else infoformat.LONG_FORMAT)
                  if long else (infoformat.NODE_FORMAT if per_node else infoformat.DEFAULT_FORMAT)
                  if sort is not None else "%P"))
    formatted = fmt is not None or long_format is not None or long or summarize or sort is not None
    keys = infoformat.parse_sort(sort) if sort is not None else []
    wanted_parts = ({w.strip() for w in partition.split(",") if w.strip()}
                    if partition is not None else None)
    names = node_set(node_names, "--nodes")
    wanted_states = infoformat.parse_node_states(states)
    filtered = bool(names is not None or wanted_states is not None or dead or responding)
    while True:
        nodes, parts = _fetch(verbose)
        if wanted_parts is not None:
            parts = [p for p in parts if p["name"] in wanted_parts]
        nodes = {name: n for name, n in nodes.items()
                 if infoformat.keep_node(n, names, wanted_states, dead, responding)}
        if filtered:
            parts = [p for p in parts if any(n in nodes for n in p["nodes"])]
        if formatted and not as_json and not reasons:
            from gpusched.cli.submission import local_cluster_name

            cluster = local_cluster_name() if any(p[0] == "V" for p in pieces) else ""
            rows = (infoformat.summary_rows(parts, nodes, cluster) if summarize
                    else infoformat.info_rows(parts, nodes, per_node, cluster, exact))
            lines = [] if noheader else [infoformat.render(pieces, None)]
            lines += [infoformat.render(pieces, row) for row in infoformat.sort_rows(rows, keys)]
            if lines:
                typer.echo("\n".join(lines))
        else:
            _show(nodes, parts, per_node, as_json, reasons, noheader,
                  listed=None if wanted_parts is None and not filtered else set(nodes),
                  exact=exact)
        if iterate is None:
            return
        sys.stdout.flush()
        time.sleep(iterate)
        typer.echo()


def _fetch(verbose: bool) -> tuple[dict[str, NodeSummary], list[dict[str, Any]]]:
    """The nodes (summed up, by name) and partitions, from the controller."""
    from gpusched.client import ApiClient

    with ApiClient() as client:
        if verbose:
            print(f"{PROG}: GET /v1/nodes, GET /v1/partitions", file=sys.stderr)
        nodes_answer = client.request("GET", "/v1/nodes")
        parts = client.request("GET", "/v1/partitions")["partitions"]
    shared = node_sharing(parts)
    return ({n["name"]: summarize_node(n, shared.get(n["name"])) for n in nodes_answer["nodes"]},
            parts)


def _show(nodes: dict[str, NodeSummary], parts: list[dict[str, Any]], per_node: bool,
          as_json: bool, reasons: bool, noheader: bool, listed: set[str] | None,
          exact: bool = False) -> None:
    """ginfo's own views: JSON, -R, -N or the partition table (``listed``: the nodes
    the filters kept, None when none was given)."""
    if listed is not None:
        parts = [{**p, "nodes": [n for n in p["nodes"] if n in listed]} for p in parts]
    member_of: dict[str, list[str]] = {}
    for part in parts:
        for name in part["nodes"]:
            member_of.setdefault(name, []).append(part["name"])
    if as_json:
        typer.echo(json.dumps({
            "partitions": partition_rows(parts, nodes, exact),
            "nodes": [{**asdict(n), "total": n.total, "partitions": member_of.get(n.name, [])}
                      for n in nodes.values()]}, indent=2))
        return
    header = not noheader
    loose = [n.name for n in nodes.values() if unenforced(n)]
    if loose:
        print_warning(PROG, f"jobs are not confined on {compress_hostlist(loose)} "
                      "(unenforced: see ginfo -N)")
    if reasons:
        print_table(["REASON", "STATE", "NODELIST"], reason_rows(list(nodes.values())),
                    shrinkable=frozenset({0, 2}), show_header=header)
        return
    # The sharing columns only where some partition shares its GPUs.
    sharing = any(part.get("sharing") for part in parts)
    if per_node:
        rows = [[n.name, ",".join(member_of.get(n.name, [])) or "-", n.state, _counts([n]),
                 _types([n]), _mig([n]), *([shares_cell(n)] if sharing else []),
                 node_reason_cell(n)] for n in nodes.values()]
        print_table(["NODELIST", "PARTITION", "STATE", "GPUS(A/I/O/T)", "GPU_TYPES", "MIG(F/U)",
                     *(["SHARES"] if sharing else []), "REASON"], rows,
                    shrinkable=frozenset({1, 4, 7 if sharing else 6}), show_header=header)
        return
    table = [[r["partition"], r["avail"], r["timelimit"], str(r["nodes"]), r["state"], r["gpus"],
              r["gpu_types"], r["mig"], *([sharing_cell(r)] if sharing else []), r["nodelist"]]
             for r in partition_rows(parts, nodes, exact)]
    print_table(["PARTITION", "AVAIL", "TIMELIMIT", "NODES", "STATE", "GPUS(A/I/O/T)",
                 "GPU_TYPES", "MIG(F/U)", *(["SHARING"] if sharing else []), "NODELIST"], table,
                right_aligned=frozenset({3}), shrinkable=frozenset({6, 9 if sharing else 8}),
                show_header=header)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ginfo`` console script."""
    return run_slurm_cli(app, PROG, argv, declared=True)
