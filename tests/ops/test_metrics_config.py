"""``[metrics]``: where the controller and the agent serve /metrics, checked at load
(each bad value one ConfigError naming the key), and a listener that cannot bind
stopping the daemon with one line."""

from __future__ import annotations

import socket

import pytest

from gpusched.client.endpoints import Endpoint
from gpusched.config import parse_config
from gpusched.controller.metrics_http import MetricsServer
from gpusched.errors import ConfigError, Unavailable


def test_absent_means_not_served_and_addresses_are_read() -> None:
    assert parse_config({}, "t.toml").metrics.controller_listen is None
    metrics = parse_config({"metrics": {"controller_listen": "127.0.0.1:9464",
                                        "agent_listen": "[::1]:9465"}}, "t.toml").metrics
    assert metrics.controller_listen == Endpoint("127.0.0.1", 9464)
    assert metrics.agent_listen == Endpoint("::1", 9465)
    assert metrics.controller_listen != metrics.agent_listen


@pytest.mark.parametrize(("table", "message"), [
    ({"controller_listen": "127.0.0.1"}, "t.toml: metrics.controller_listen: expected "
                                         "'host:port' such as '127.0.0.1:9464' (the port is "
                                         "required)"),
    ({"agent_listen": "[::1]"}, "metrics.agent_listen: expected 'host:port'"),
    ({"agent_listen": "bad host!:9465"}, "metrics.agent_listen: expected 'host:port'"),
    ({"agent_listen": "127.0.0.1:70000"}, "port '70000' is not from 1 to 65535"),
    ({"agent_listen": 9465}, "metrics.agent_listen: expected 'host:port'"),
    ({"listen": "127.0.0.1:1"}, "metrics"),
])
def test_a_bad_value_is_one_error_naming_the_key(table: dict[str, object],
                                                 message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"metrics": table}, "t.toml")
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_port_taken_is_one_line_naming_the_key() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(Unavailable) as raised:
            MetricsServer("127.0.0.1", port, lambda: b"", "metrics.agent_listen")
    assert str(raised.value).startswith(f"metrics.agent_listen: cannot listen on 127.0.0.1:{port}")
