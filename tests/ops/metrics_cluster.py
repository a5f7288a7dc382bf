"""A real cluster serving metrics, for the metrics, diag and dashboard tests: a
controller and an agent on the fake NVML library (``dgx_a100_8.json``, 8 A100s, unless
another inventory is named), each
with its metrics listener on a free loopback port; and a scrape read by
prometheus_client's own text-format parser."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.e2e.cluster import Cluster
from tests.nvml_fixture import FakeNvml

HEALTH = "[agent.health]\ninterval = 0.3\nmax_temperature = 95\n"


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class MetricsCluster:
    """The cluster, its fake NVML, and where its two metrics listeners are."""

    def __init__(self, db_url: str, fake: FakeNvml) -> None:
        self.fake = fake
        self.controller_port, self.agent_port = free_port(), free_port()
        metrics = (f"[metrics]\ncontroller_listen = \"127.0.0.1:{self.controller_port}\"\n"
                   f"agent_listen = \"127.0.0.1:{self.agent_port}\"\n")
        self.cluster = Cluster(db_url, nvml=fake.variables(), agent_toml=HEALTH,
                               auth_toml=metrics)

    def controller(self) -> dict[str, list[Sample]]:
        """A scrape of the controller, parsed: samples by metric family name."""
        return scrape(self.controller_port)

    def agent(self) -> dict[str, list[Sample]]:
        """A scrape of the agent, parsed."""
        return scrape(self.agent_port)


@contextmanager
def metrics_cluster(db_url: str, fake_nvml_factory: Callable[..., FakeNvml],
                    inventory: str = "dgx_a100_8.json") -> Iterator[MetricsCluster]:
    """A MetricsCluster up, stopped and removed on leaving."""
    made = MetricsCluster(db_url, fake_nvml_factory(inventory))
    try:
        made.cluster.up()
        yield made
    finally:
        made.cluster.close()


def get(port: int, path: str, method: str = "GET") -> tuple[int, str, bytes]:
    """One request to a metrics listener: status, content type, body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path)
        answer = conn.getresponse()
        return answer.status, answer.getheader("Content-Type") or "", answer.read()
    finally:
        conn.close()


def scrape(port: int) -> dict[str, list[Sample]]:
    """``GET /metrics``, parsed by the Prometheus text-format parser."""
    status, content_type, body = get(port, "/metrics")
    assert status == 200, (status, body[:300])
    assert content_type.startswith("text/plain; version=0.0.4"), content_type
    return {family.name: list(family.samples)
            for family in text_string_to_metric_families(body.decode())}


def value(families: dict[str, list[Sample]], family: str, sample: str | None = None,
          **labels: str) -> float | None:
    """The value of the one sample of ``family`` (named ``sample``, default the family's
    name) whose labels include ``labels``; None when there is none."""
    found = [s.value for s in families.get(family, [])
             if s.name == (sample or family) and labels.items() <= s.labels.items()]
    assert len(found) <= 1, (family, labels, found)
    return found[0] if found else None


def total(families: dict[str, list[Sample]], family: str) -> float:
    """The sum of a family's samples (a counter's ``_total`` series, a gauge's own)."""
    return sum(s.value for s in families.get(family, [])
               if s.name in (family, f"{family}_total"))


def sample_names(families: dict[str, list[Sample]]) -> set[str]:
    """Every series name a scrape holds (``_bucket``, ``_count``, ``_total``...)."""
    return {s.name for samples in families.values() for s in samples}
