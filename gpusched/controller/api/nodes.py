"""``/v1/nodes`` and ``/v1/partitions``: the cluster as ginfo shows it."""

from __future__ import annotations

from typing import Any

from gpusched.controller.api.common import ApiContext
from gpusched.controller.http import Request, Router
from gpusched.db.nodes import node_listing
from gpusched.db.partitions import partition_listing


class NodeRoutes:
    """Anyone may see the nodes, their GPUs and the partitions."""

    def __init__(self, context: ApiContext) -> None:
        self.context = context

    def add_to(self, r: Router) -> None:
        """Register the node and partition listings."""
        r.add("GET", "/v1/nodes", self.nodes)
        r.add("GET", "/v1/partitions", self.partitions)

    def nodes(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Nodes with their GPUs and which job holds each."""
        with self.context.sessions() as session:
            return 200, {"nodes": node_listing(session)}

    def partitions(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Partitions with their nodes ("*" expanded to every node) and limits."""
        with self.context.sessions() as session:
            return 200, {"partitions": partition_listing(session)}
