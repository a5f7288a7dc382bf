"""Containers and the nodes that run them: the runtime a node registers, and the check at
submit that some node a container job could run on has a runtime that can run it (a
job no node can ever run is refused then, not left pending)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from gpusched.errors import UsageError
from gpusched.messages.containers import RUNTIMES, ContainerRequest

_RUNTIMES_OF = text("SELECT name, container_runtime FROM nodes WHERE name = ANY(:names)"
                    " ORDER BY name")
_SQUASHFS = (".sqsh", ".squashfs")


def registered_runtime(body: dict[str, Any]) -> str | None:
    """A registration's ``container_runtime``: one of RUNTIMES, or None (absent: none)."""
    value = body.get("container_runtime")
    if value is not None and value not in RUNTIMES:
        raise UsageError(f"container_runtime: expected one of {', '.join(RUNTIMES)} or "
                         f"null, got {str(value)[:40]!r}")
    return value


def check_container_nodes(session: Session, partition: str, members: Sequence[Sequence[Any]],
                          nodelist: Sequence[str], exclude: Sequence[str],
                          container: ContainerRequest) -> None:
    """Refuse a container job when no node it may run on (``members`` of the partition,
    as submit_facts reads them, narrowed by its nodelist and excludes) has a runtime
    that can run it."""
    names = [m[1] for m in members if (not nodelist or m[1] in nodelist)
             and m[1] not in exclude]
    found = session.execute(_RUNTIMES_OF, {"names": names}).all() if names else []
    able = {runtime for _, runtime in found if runtime is not None}
    if not able:
        without = ", ".join(name for name, _ in found[:5]) + (", ..." if len(found) > 5 else "")
        raise UsageError(f"--container-image: no node of partition {partition} can run "
                         "containers" + (f" (no container runtime on {without})" if found
                                         else " (it has no registered nodes)"))
    needs_enroot = container.name is not None or container.image.endswith(_SQUASHFS)
    if needs_enroot and "enroot" not in able:
        what = ("--container-name" if container.name is not None
                else f"--container-image {container.image}")
        raise UsageError(f"{what}: needs enroot, and the nodes of partition {partition} "
                         f"run containers with {', '.join(sorted(able))}")
    if able == {"enroot"} and container.name is None and container.image[0] not in "/.":
        raise UsageError(f"--container-image {container.image}: the nodes of partition "
                         f"{partition} run enroot, which runs a squashfs image file or a "
                         "named container (--container-name): import the image first")


def stored_container(container: ContainerRequest | None) -> str | None:
    """A job's container as ``jobs.container`` stores it (JSON text; None: none)."""
    return None if container is None else json.dumps(container.to_json())
