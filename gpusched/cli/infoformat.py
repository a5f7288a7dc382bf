"""sinfo's output formats and filters for ginfo: ``-o`` field codes, ``-O`` field names,
``-l``, ``-s``, ``-S`` sort keys, and the node filters ``-n``, ``-t``, ``-d``, ``-r``."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpusched.core.hostlist import compress_hostlist
from gpusched.core.terminal import terminal_safe
from gpusched.core.timefmt import format_duration
from gpusched.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpusched.cli.ginfo import NodeSummary


@dataclass
class InfoRow:
    """One line of a sinfo format: a partition's nodes in one state (or one node, -N)."""

    part: dict[str, Any]
    state: str
    nodes: list[NodeSummary]
    cluster: str = ""


def _counts(nodes: Sequence[NodeSummary]) -> tuple[int, int, int, int]:
    """Nodes allocated (mixed too), idle, other (drained, down, unhealthy), total."""
    a = sum(n.state in ("allocated", "mixed") for n in nodes)
    i = sum(n.state == "idle" for n in nodes)
    return a, i, len(nodes) - a - i, len(nodes)


def _gres(nodes: Sequence[NodeSummary]) -> str:
    """sinfo's %G: the GPUs of a node, ``gpu:TYPE:N`` by type (the largest of the
    group's nodes); ``(null)`` for none."""
    most: dict[str, int] = {}
    for node in nodes:
        for kind, count in node.types.items():
            most[kind] = max(most.get(kind, 0), count)
    return ",".join(f"gpu:{c}" if k == "gpu" else f"gpu:{k}:{c}"  # "gpu": no type
                    for k, c in sorted(most.items())) or "(null)"


def _features(nodes: Sequence[NodeSummary]) -> str:
    """sinfo's %f: the features of the group's nodes, sorted; ``(null)`` for none."""
    return ",".join(sorted({f for node in nodes for f in node.features})) or "(null)"


def _time(seconds: object, none: str) -> str:
    return format_duration(int(seconds)) if isinstance(seconds, int) and seconds else none


def _least(values: Iterable[int]) -> str:
    """sinfo's %c and %m of a group of nodes: the value, or the least followed by ``+``
    when the nodes differ."""
    seen = sorted(set(values))
    return "0" if not seen else str(seen[0]) + ("+" if len(seen) > 1 else "")


_SHORT_STATES = {"idle": "idle", "mixed": "mix", "allocated": "alloc", "drained": "drain",
                 "down": "down", "unhealthy": "unhea", "n/a": "n/a"}
_FIELDS: dict[str, tuple[str, Callable[[InfoRow], str]]] = {
    "P": ("PARTITION", lambda r: r.part["name"] + ("*" if r.part.get("default") else "")),
    "R": ("PARTITION", lambda r: r.part["name"]),
    "a": ("AVAIL", lambda r: "up" if r.part.get("state") == "UP" else str(r.part.get("state", "")).lower()),
    "l": ("TIMELIMIT", lambda r: _time(r.part.get("max_time"), "infinite")),
    "L": ("DEFAULTTIME", lambda r: _time(r.part.get("default_time"), "n/a")),
    "D": ("NODES", lambda r: str(len(r.nodes))),
    "t": ("STATE", lambda r: _SHORT_STATES.get(r.state, r.state)),
    "T": ("STATE", lambda r: r.state),
    "N": ("NODELIST", lambda r: compress_hostlist(n.name for n in r.nodes)),
    "n": ("HOSTNAMES", lambda r: compress_hostlist(n.name for n in r.nodes)),
    "F": ("NODES(A/I/O/T)", lambda r: "/".join(map(str, _counts(r.nodes)))),
    "A": ("NODES(A/I)", lambda r: "/".join(map(str, _counts(r.nodes)[:2]))),
    "G": ("GRES", lambda r: _gres(r.nodes)),
    "E": ("REASON", lambda r: "; ".join(sorted({n.reason for n in r.nodes if n.reason})) or "none"),
    "V": ("CLUSTER", lambda r: r.cluster),
    "c": ("CPUS", lambda r: _least(n.cpus for n in r.nodes)),
    "m": ("MEMORY", lambda r: _least(n.memory_mb for n in r.nodes)),
    # Node features (-C/--constraint): all of them are always active here.
    "f": ("AVAIL_FEATURES", lambda r: _features(r.nodes)),
    "b": ("ACTIVE_FEATURES", lambda r: _features(r.nodes)),
}
_NOT_KEPT = "nodes report their GPUs, CPU count and memory only here"
REFUSED_CODES = {
    **{code: _NOT_KEPT for code in "BCdeOXYZz"},
    "g": "partitions are not limited to groups here", "h": "partitions do not oversubscribe "
    "nodes here (GPUs are shared only by MPS or shards)",
    "H": "the time a node's reason was set is not kept", "I": _NOT_KEPT,
    "M": "preemption is set by QOS here, not by partition", "o": "nodes have no address here",
    "p": "partition priority tiers are shown by gcontrol show partition",
    "r": "partitions are not restricted to root here", "s": "partitions set no job size here",
    "S": "partitions are not limited to allocating nodes here",
    "u": "who set a node's reason is not kept", "U": "who set a node's reason is not kept",
    "v": "agents report no version here", "w": "nodes have no scheduling weight here",
}
LONG_NAMES = {
    "available": "a", "cluster": "V", "defaulttime": "L", "features": "f",
    "featuresact": "b", "gres": "G", "nodeai": "A",
    "nodeaiot": "F", "nodehost": "n", "nodelist": "N", "nodes": "D", "partition": "P",
    "partitionname": "R", "reason": "E", "statecompact": "t", "statelong": "T", "time": "l",
    "cpus": "c", "memory": "m",
}
DEFAULT_FORMAT = "%9P %.5a %.10l %.6D %.6t %N"
NODE_FORMAT = "%N %.6D %P %.6t"
LONG_FORMAT = "%9P %.5a %.10l %.10L %.6D %.10T %G %N"
LONG_NODE_FORMAT = "%N %.6D %9P %.11T %G %E"
SUMMARY_FORMAT = "%9P %.5a %.10l %.16F %N"
_CODE = r"%(\.?)(\d*)([A-Za-z%])"


def _code(code: str, flag: str) -> str:
    if code in REFUSED_CODES:
        raise UsageError(f"invalid {flag}: %{code} is not supported: {REFUSED_CODES[code]}")
    if code not in _FIELDS:
        raise UsageError(f"invalid {flag}: unknown field %{code} (known: "
                         f"{''.join(sorted(_FIELDS))})")
    return code


Piece = tuple[str, int | None, bool, str]  # code ("" for text), width, right, text


def parse_format(text: str) -> list[Piece]:
    """sinfo's ``-o``: ``%[.][width]code`` pieces and literal text."""
    pieces: list[Piece] = []
    at = 0
    for match in re.finditer(_CODE, text):
        if match.start() > at:
            pieces.append(("", None, False, text[at:match.start()]))
        dot, width, code = match.groups()
        pieces.append(("", None, False, "%") if code == "%" else
                      (_code(code, "--format"), int(width[:6]) if width else None, bool(dot), ""))
        at = match.end()
    if at < len(text):
        pieces.append(("", None, False, text[at:]))
    if not any(p[0] for p in pieces):
        raise UsageError(f"invalid --format {text[:64]!r}: no field codes such as %P or %N")
    return pieces


def parse_long_format(text: str) -> list[Piece]:
    """sinfo's ``-O``: ``name[:[.]size]`` items, comma separated (size 20 unless given)."""
    pieces: list[Piece] = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        name, _, spec = item.partition(":")
        code = LONG_NAMES.get(name.lower())
        if code is None:
            raise UsageError(f"invalid --Format: no field {name[:40]!r} here (known: "
                             f"{', '.join(sorted(LONG_NAMES))})")
        match = re.fullmatch(r"(\.?)(\d{0,6})(.*)", spec)
        assert match is not None
        dot, width, suffix = match.groups()
        pieces += [(code, int(width) if width else 20, bool(dot), ""), ("", None, False, suffix or " ")]
    if not pieces:
        raise UsageError("invalid --Format: name at least one field, such as NodeList")
    return pieces


def render(pieces: Sequence[Piece], row: InfoRow | None) -> str:
    """One line: the header (``row`` None) or a row's fields, escaped, cut and padded."""
    out = []
    for code, width, right, text in pieces:
        if not code:
            out.append(text)
            continue
        header, value_of = _FIELDS[code]
        value = header if row is None else terminal_safe(value_of(row))
        if width is not None:
            value = value[:width]
            value = value.rjust(width) if right else value.ljust(width)
        out.append(value)
    return "".join(out).rstrip()


def parse_sort(text: str) -> list[tuple[str, bool]]:
    """sinfo's ``-S``: field codes, comma separated, ``-`` for descending (``#`` is
    taken as ``+``)."""
    keys = []
    for item in (p.strip() for p in text.split(",") if p.strip()):
        code = item.lstrip("+-#")
        if len(code) != 1:
            raise UsageError(f"invalid --sort key {item[:16]!r}: expected a field code such "
                             "as P, -t or +N")
        keys.append((_code(code, "--sort"), item.startswith("-")))
    if not keys:
        raise UsageError("invalid --sort: name at least one field code, such as P")
    return keys


def sort_rows(rows: list[InfoRow], keys: Sequence[tuple[str, bool]]) -> list[InfoRow]:
    """Rows ordered by ``keys`` (node counts as numbers)."""
    ordered = list(rows)
    for code, descending in reversed(keys):
        if code == "D":
            ordered.sort(key=lambda r: len(r.nodes), reverse=descending)
        else:
            value_of = _FIELDS[code][1]
            ordered.sort(key=lambda r: value_of(r), reverse=descending)  # noqa: B023
    return ordered


# sinfo's state names (and short forms) -> ginfo's.
STATE_NAMES = {"idle": "idle", "mix": "mixed", "mixed": "mixed", "alloc": "allocated",
               "allocated": "allocated", "drain": "drained", "drained": "drained",
               "draining": "drained", "drng": "drained", "down": "down",
               "unhealthy": "unhealthy", "fail": "unhealthy"}


def parse_node_states(text: str | None) -> set[str] | None:
    """``-t``'s states, comma separated, by sinfo's names (``all``: every state)."""
    if text is None:
        return None
    states: set[str] = set()
    for word in (w.strip().lower() for w in text.split(",") if w.strip()):
        if word == "all":
            return None
        if word not in STATE_NAMES:
            raise UsageError(f"invalid --states {word[:24]!r}: expected one of "
                             f"{', '.join(sorted(STATE_NAMES))}")
        states.add(STATE_NAMES[word])
    if not states:
        raise UsageError("--states: give at least one node state")
    return states


def keep_node(node: NodeSummary, names: set[str] | None, states: set[str] | None,
              dead: bool, responding: bool) -> bool:
    """Whether ginfo's node filters keep ``node``."""
    return ((names is None or node.name in names) and (states is None or node.state in states)
            and (not dead or node.state == "down") and (not responding or node.state != "down"))


def info_rows(parts: Iterable[dict[str, Any]], nodes: dict[str, NodeSummary], per_node: bool,
              cluster: str, exact: bool = False) -> list[InfoRow]:
    """The rows of a format: per partition and node state (with ``exact``, and GPU
    configuration), or with ``per_node`` per node and partition."""
    rows = []
    for part in parts:
        if part["state"] == "INACTIVE":
            continue
        members = [nodes[n] for n in part["nodes"] if n in nodes]
        if per_node:
            rows += [InfoRow(part, node.state, [node], cluster) for node in members]
            continue
        by_state: dict[tuple[str, tuple[tuple[str, int], ...]], list[NodeSummary]] = {}
        for node in members:
            config = tuple(sorted(node.types.items())) if exact else ()
            by_state.setdefault((node.state, config), []).append(node)
        rows += [InfoRow(part, state, group, cluster)
                 for (state, _), group in sorted(by_state.items())]
    return rows


def summary_rows(parts: Iterable[dict[str, Any]], nodes: dict[str, NodeSummary],
                 cluster: str) -> list[InfoRow]:
    """sinfo -s: one row per partition, every state together."""
    return [InfoRow(part, "", [nodes[n] for n in part["nodes"] if n in nodes], cluster)
            for part in parts if part["state"] != "INACTIVE"]
