"""The Grafana dashboard (etc/grafana/gpusched.json): it loads, it has the cluster,
partition, user and node views, and every metric its queries (and the example alerting
rules of docs/operations.md) name is one that a real controller and a real agent export
(scraped, with a job running and an Xid seen, so that every series exists)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import wait_for
from tests.nvml_fixture import FakeNvml
from tests.ops.metrics_cluster import metrics_cluster, sample_names, value

DASHBOARD = Path(__file__).resolve().parents[2] / "etc" / "grafana" / "gpusched.json"
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
# PromQL words that are not metric names.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
             "or", "unless", "offset", "inf", "nan"}
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not
    functions, keywords, label names (in braces or in a by/without/on list), range
    durations, strings or dashboard variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges
    text = re.sub(r"\$\{?\w+\}?", " ", text)  # variables
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in _IDENT.finditer(text):
        word, rest = match.group(), text[match.end():]
        if word.lower() in _KEYWORDS or rest.lstrip().startswith("("):
            continue
        if match.start() and (text[match.start() - 1].isdigit() or text[match.start() - 1] == "."):
            continue  # the exponent or unit of a number
        names.add(word)
    return names


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, expression) of every query: the panels' and the variables'."""
    def walk(panels: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
        for panel in panels:
            for target in panel.get("targets", []):
                yield f"panel {panel['title']!r}", target["expr"]
            yield from walk(panel.get("panels", []))

    yield from walk(dashboard["panels"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            found = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
            assert found, f"variable {variable['name']}: {query}"
            yield f"variable {variable['name']}", found.group(1)


def test_the_extractor_finds_names_and_only_names() -> None:
    assert metric_names('histogram_quantile(0.99, sum by (le, route) (rate('
                        'gpusched_api_request_duration_seconds_bucket{route!="/x"}'
                        '[$__rate_interval])))') == {"gpusched_api_request_duration_seconds_bucket"}
    assert metric_names('sum(max by (state) (a_b{state="allocated"})) / sum(c) > 1e3') == {
        "a_b", "c"}
    assert metric_names("time() - x_seconds{node=~\"$node\"}") == {"x_seconds"}


def test_the_dashboard_loads_with_its_four_views() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Cluster", "Partition", "User and account", "Node"]
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "partition", "account", "node"}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for where, expr in queries(dashboard):
        assert metric_names(expr), f"{where}: no metric in {expr!r}"


@pytest.mark.slow
def test_every_query_names_a_metric_the_daemons_export(
        db_url: str, fake_nvml_factory: Callable[..., FakeNvml]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    with metrics_cluster(db_url, fake_nvml_factory) as mc:
        job = mc.cluster.submit("-G", "1", "--wrap", "sleep 60")
        mc.cluster.wait_state(job, "RUNNING")
        mc.fake.inject("xid 0 13")
        agent = wait_for(lambda: (lambda f: f if value(
            f, "gpusched_gpu_xid_errors", "gpusched_gpu_xid_errors_total", gpu="0", xid="13")
            else None)(mc.agent()), what="the agent's Xid count")
        exported = sample_names(mc.controller()) | sample_names(agent)
        mc.cluster.run("gcancel", str(job))
    named = {}
    alerts = [("docs/operations.md alert", line.split("expr:", 1)[1].strip())
              for line in OPERATIONS.read_text().splitlines() if line.strip().startswith("expr:")]
    assert len(alerts) >= 5, "the example alerting rules are read"
    for where, expr in [*queries(dashboard), *alerts]:
        for name in metric_names(expr):
            named.setdefault(name, where)
    missing = {name: where for name, where in named.items() if name not in exported}
    assert not missing, f"queries name metrics no daemon exports: {missing}"
    # The dashboard covers each kind of figure the daemons export.
    for family in ("gpusched_gpus", "gpusched_jobs", "gpusched_job_wait_seconds_bucket",
                   "gpusched_scheduler_pass_duration_seconds_bucket", "gpusched_job_starts_total",
                   "gpusched_account_gpu_hours_total", "DCGM_FI_DEV_GPU_UTIL",
                   "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "gpusched_gpu_xid_errors_total"):
        assert family in named, family
