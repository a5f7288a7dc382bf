"""What a metrics scrape reads of the nodes, against a real database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import update

from gpusched.db.metrics import read_counts
from gpusched.db.models import Node
from tests.db.node import node_sessions


def test_a_heartbeat_stamped_after_the_scrape_began_is_age_zero(db_url: str) -> None:
    """A controller stamps a heartbeat with its own clock; one stamped after the scrape's
    transaction began (or by a controller whose clock is a little ahead) is heard now,
    not in the future. An old heartbeat keeps its age."""
    with node_sessions(db_url, [{"index": 0, "uuid": "GPU-0"}]) as sessions:
        for offset, low, high in ((timedelta(seconds=2), 0.0, 0.0),
                                  (timedelta(seconds=-40), 39.0, 60.0)):
            with sessions() as s, s.begin():
                s.execute(update(Node).values(last_seen=datetime.now(UTC) + offset))
            with sessions() as s:
                ((name, _, age),) = read_counts(s).nodes
            assert name == "n1" and low <= age <= high, (offset, age)
