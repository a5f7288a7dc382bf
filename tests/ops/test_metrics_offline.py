"""The controller's metrics apart from a cluster: what a pass and a request add, the
GPU-hours sum between scrapes, and a scrape when the database is out of reach."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from gpusched.controller.metrics import AccountHours, ControllerMetrics, route_template
from gpusched.core.model import (
    Pending,
    PendingJob,
    Plan,
    Reason,
    Snapshot,
    Start,
    StartKind,
)
from gpusched.db.metrics import ClusterCounts


def parsed(metrics: ControllerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(metrics.scrape().decode())
            for s in f.samples}


def counts(now: float, **held: float) -> ClusterCounts:
    return ClusterCounts(jobs=(), gpus=(), nodes=(), accounts=tuple(held.items()), now=now)


def test_a_pass_counts_its_starts_by_kind_and_each_started_tasks_wait() -> None:
    metrics = ControllerMetrics(None)
    pending = (PendingJob(1, "gpu", 1, 0, submit_time=100.0),
               PendingJob(2, "debug", 1, 0, submit_time=400.0),  # an array: two tasks start
               PendingJob(3, "gpu", 1, 0, submit_time=0.0))
    plan = Plan(starts=(Start(1, "n1", ("a",)),
                        Start(2, "n1", ("b",), array_task_id=0, kind=StartKind.BACKFILLED),
                        Start(2, "n1", ("c",), array_task_id=1, kind=StartKind.BACKFILLED)),
                pending=(Pending(3, Reason.RESOURCES),), resume_after=3)
    metrics.observe_pass(0.02, Snapshot((), (), pending), plan, now=1000.0)
    seen = parsed(metrics)
    assert seen[("gpusched_job_starts_total", (("kind", "immediate"),))] == 1
    assert seen[("gpusched_job_starts_total", (("kind", "backfilled"),))] == 2
    assert seen[("gpusched_job_wait_seconds_count", (("partition", "debug"),))] == 2
    assert seen[("gpusched_job_wait_seconds_sum", (("partition", "debug"),))] == 1200.0
    assert seen[("gpusched_job_wait_seconds_sum", (("partition", "gpu"),))] == 900.0
    assert seen[("gpusched_scheduler_pass_jobs_examined_sum", ())] == 4
    assert seen[("gpusched_scheduler_passes_stopped_early_total", ())] == 1
    scheduler = metrics.diag()["scheduler"]
    assert scheduler["starts"] == {"immediate": 1, "backfilled": 2}
    assert scheduler["depth"] == {"last": 4, "max": 4, "mean": 4.0}
    assert scheduler["stopped_early"] == 1 and scheduler["last_ms"] == 20.0


def test_requests_are_counted_by_route_pattern() -> None:
    metrics = ControllerMetrics(None)
    pattern = "^/v1/jobs/(?P<job_id>[^/]+)$"
    for status, seconds in ((200, 0.002), (404, 0.004), (200, 0.006)):
        metrics.observe_request("GET", pattern, status, seconds)
    metrics.observe_request("PROPFIND", "", 404, 0.001)
    [row, other] = metrics.diag()["api"]
    assert row == {"method": "GET", "route": "/v1/jobs/{job_id}", "count": 3, "errors": 1,
                   "mean_ms": 4.0, "max_ms": 6.0, "total_s": 0.012}
    assert (other["method"], other["route"]) == ("other", "unmatched")
    assert route_template("^/v1/jobs/(?P<job_id>[^/]+)/steps/(?P<step_id>[^/]+)/cancel$") == \
        "/v1/jobs/{job_id}/steps/{step_id}/cancel"


def test_gpu_hours_add_the_trapezoid_between_scrapes_and_skip_an_older_reading() -> None:
    hours = AccountHours()
    hours.advance(counts(0.0, a=2.0))
    assert hours.snapshot() == {"a": 0.0}
    hours.advance(counts(3600.0, a=2.0, b=1.0))
    assert hours.snapshot() == {"a": 2.0, "b": 0.5}
    hours.advance(counts(1800.0, a=100.0))  # a scrape that read before the last one
    assert hours.snapshot() == {"a": 2.0, "b": 0.5}
    hours.advance(counts(7200.0))
    assert hours.snapshot() == {"a": 3.0, "b": 1.0}


def test_a_scrape_without_the_database_still_answers_and_says_so() -> None:
    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none",
                           connect_args={"connect_timeout": 2})
    try:
        metrics = ControllerMetrics(sessionmaker(engine), engine.pool, lambda: True)
        seen = parsed(metrics)
        assert seen[("gpusched_metrics_database_up", ())] == 0
        assert seen[("gpusched_controller_leader", ())] == 1
        assert not any(name == "gpusched_jobs" for name, _ in seen)
        diag = metrics.diag()
        assert diag["agents"] is None and diag["database"]["reachable"] is False
    finally:
        engine.dispose()


@pytest.mark.parametrize("pattern", ["", "^$"])
def test_no_route_is_one_label(pattern: str) -> None:
    assert route_template(pattern) == "unmatched"
