"""Node features in the database: what each node carries (its agent's GPU features in
``nodes.features`` and its admin's in ``node_features``, by name), and the check of a
submission's -C/--constraint against the nodes of its partition."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from gpusched.core.features import parse_constraint, possible
from gpusched.errors import UsageError

# The features of the nodes of a partition, by name: those registered (with their GPUs'
# features and their admin's) and those the admin configuration names there that have
# not registered yet (their admin's alone).
_PARTITION_FEATURES = text(
    "SELECT coalesce(n.name, f.node), coalesce(n.features, '{}') || coalesce(f.features, '{}')"
    " FROM (SELECT name, features FROM nodes WHERE name = ANY(:registered)) AS n"
    " FULL JOIN (SELECT a.node, a.features FROM node_features AS a JOIN partitions AS p"
    "   ON p.name = :partition AND ('*' = ANY(p.nodes) OR a.node = ANY(p.nodes))) AS f"
    " ON f.node = n.name")
_NODE_FEATURES = text(
    "SELECT n.name, n.features, coalesce(f.features, '{}') FROM nodes AS n"
    " LEFT JOIN node_features AS f ON f.node = n.name")
MAX_SHOWN = 24  # features a refusal lists


def partition_features(session: Session, partition: str, registered: Sequence[str]
                       ) -> dict[str, frozenset[str]]:
    """Each node of ``partition`` (``registered``: its registered members) with its
    features."""
    rows = session.execute(_PARTITION_FEATURES, {"partition": partition,
                                                 "registered": list(registered)})
    return {name: frozenset(features) for name, features in rows}


def check_constraint_nodes(session: Session, partition: str, members: Sequence[Sequence[Any]],
                           nodelist: Sequence[str], exclude: Sequence[str],
                           constraint: str, nodes: int) -> None:
    """Refuse a job whose constraint no ``nodes`` nodes of its partition (``members``
    as submit_facts reads them, narrowed by its nodelist and excludes) could satisfy,
    as sbatch refuses an invalid feature specification."""
    found = partition_features(session, partition, [m[1] for m in members])
    usable = {name: features for name, features in found.items()
              if (not nodelist or name in nodelist) and name not in exclude}
    if possible(parse_constraint(constraint), dict(enumerate(usable.values())), nodes):
        return
    known = sorted(set().union(*usable.values())) if usable else []
    shown = ", ".join(known[:MAX_SHOWN]) + (", ..." if len(known) > MAX_SHOWN else "")
    count = f"{nodes} nodes" if nodes > 1 else "a node"
    raise UsageError(
        f"--constraint {constraint}: invalid feature specification: no {count} of partition "
        f"{partition} satisfy it" + (f" (features there: {shown})" if shown else
                                     " (no node there has features)"))


def node_features(session: Session) -> dict[str, tuple[list[str], list[str]]]:
    """Every registered node's features: (from its GPUs, from its admin), by name."""
    return {name: (list(gpus), list(admin))
            for name, gpus, admin in session.execute(_NODE_FEATURES)}
