"""``/v1/nodes``, ``/v1/partitions`` and ``/v1/licenses``: the cluster as ginfo and
``gcontrol show`` show it."""

from __future__ import annotations

from typing import Any

from gpusched.controller.api.common import ApiContext
from gpusched.controller.http import Request, Router
from gpusched.db.licenses import license_usage
from gpusched.db.nodes import node_listing
from gpusched.db.partitions import partition_listing


class NodeRoutes:
    """Anyone may see the nodes, their GPUs, the partitions and the licenses."""

    def __init__(self, context: ApiContext) -> None:
        self.context = context

    def add_to(self, r: Router) -> None:
        """Register the node and partition listings."""
        r.add("GET", "/v1/nodes", self.nodes)
        r.add("GET", "/v1/partitions", self.partitions)
        r.add("GET", "/v1/licenses", self.licenses)

    def nodes(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Nodes with their GPUs and which job holds each."""
        with self.context.sessions() as session:
            return 200, {"nodes": node_listing(session)}

    def partitions(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Partitions with their nodes ("*" expanded to every node) and limits."""
        with self.context.sessions() as session:
            return 200, {"partitions": partition_listing(session)}

    def licenses(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Each license of the cluster (sbatch's -L): total, used by running jobs, free."""
        with self.context.sessions() as session:
            return 200, {"licenses": [{"name": u.name, "total": u.total, "used": u.used,
                                       "free": u.free} for u in license_usage(session)]}
