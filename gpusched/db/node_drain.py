"""Drains a node makes itself: a failed prolog or epilog (only an administrator lifts
those) and its health check (its next passing check lifts that one).

Every change is one guarded UPDATE naming the states it expects, so a report sent
twice, or racing an administrator's drain or resume, does no harm.
"""

from __future__ import annotations

from sqlalchemy import or_, update
from sqlalchemy.orm import Session

from gpusched.db.engine import rowcount
from gpusched.db.models import Node
from gpusched.messages import NodeHealth

MAX_DRAIN_REASON = 500  # characters of a reason kept on the node (as an admin's drain)
HEALTH = "health"  # nodes.drained_by of a drain the node's health check made


def drain_reason(text: str | None, fallback: str) -> str:
    """A node's drain reason from a program's message: its first line, bounded."""
    first = (text or "").strip().splitlines()[0:1]
    return (first[0].strip() if first else "")[:MAX_DRAIN_REASON] or fallback


def drain_for_site_program(session: Session, node_id: int, reason: str) -> bool:
    """Drain the node because its prolog or epilog failed: an UP node becomes DRAIN, and
    a drain its health check made becomes this one (which no passing check lifts). A
    node an administrator, a prolog or an epilog drained keeps its own reason; a node
    given up (DOWN) is left to register again. Whether the node changed."""
    return bool(rowcount(session.execute(
        update(Node).where(Node.id == node_id, or_(
            Node.state == "UP", (Node.state == "DRAIN") & (Node.drained_by == HEALTH)))
        .values(state="DRAIN", reason=reason[:MAX_DRAIN_REASON], drained_by=None))))


def record_health(session: Session, node: Node, report: NodeHealth) -> str:
    """Apply a node's health report; the node's state afterwards.

    A failing check drains an UP node with reason ``health check: <reason>``
    (``drained_by`` health); a node already drained otherwise keeps its reason. A
    passing check returns a node its health check drained to UP, and leaves any other
    drain alone."""
    if report.ok:
        session.execute(update(Node).where(Node.id == node.id, Node.state == "DRAIN",
                                           Node.drained_by == HEALTH)
                        .values(state="UP", reason=None, drained_by=None))
    else:
        why = drain_reason(report.reason, "failed")
        session.execute(update(Node).where(Node.id == node.id, or_(
            Node.state == "UP", (Node.state == "DRAIN") & (Node.drained_by == HEALTH)))
            .values(state="DRAIN", reason=f"health check: {why}"[:MAX_DRAIN_REASON],
                    drained_by=HEALTH))
    session.refresh(node)
    return node.state
