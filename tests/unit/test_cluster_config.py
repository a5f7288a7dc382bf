"""Cluster mode's settings: controller addresses (``listen``, ``controllers``), the
munge node address table, and what is refused at load."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.auth.nodeaddr import NodeAddressBook
from gpusched.client.endpoints import Endpoint, parse_endpoint, parse_endpoints
from gpusched.config import load_config
from gpusched.errors import ConfigError


@pytest.mark.parametrize("text, host, port", [
    ("ctl1:6820", "ctl1", 6820),
    ("ctl1.example.org:7000", "ctl1.example.org", 7000),
    ("ctl1", "ctl1", 6820),
    ("10.0.0.5:6820", "10.0.0.5", 6820),
    ("0.0.0.0:1", "0.0.0.0", 1),
    ("[::]:6820", "::", 6820),
    ("[fe80::1]", "fe80::1", 6820),
    ("[2001:db8::1]:65535", "2001:db8::1", 65535),
])
def test_addresses_parse(text: str, host: str, port: int) -> None:
    endpoint = parse_endpoint(text)
    assert (endpoint.host, endpoint.port) == (host, port)
    assert parse_endpoint(str(endpoint)) == endpoint


@pytest.mark.parametrize("text, why", [
    ("", "expected 'host:port'"),
    ("ctl1:0", "port '0' is not from 1 to 65535"),
    ("ctl1:65536", "not from 1 to 65535"),
    ("ctl1:http", "port 'http'"),
    ("::1:6820", "an IPv6 address goes in brackets"),
    ("[::1", "expected 'host:port'"),
    ("[::1]x", "expected 'host:port'"),
    ("[ctl1]:80", "is not a host name or IP address"),
    ("-ctl:80", "is not a host name"),
    ("ctl 1:80", "is not a host name"),
    ("ctl1:80/x", "port '80/x'"),
    ("x" * 400, "expected 'host:port'"),
    (6820, "expected 'host:port'"),
])
def test_bad_addresses_are_refused_with_the_reason(text: object, why: str) -> None:
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace("[", r"\[")):
        parse_endpoint(text)


def test_a_list_is_bounded_and_without_repeats() -> None:
    assert parse_endpoints(["a:1", "b:1"]) == (Endpoint("a", 1), Endpoint("b", 1))
    with pytest.raises(ValueError, match="a:1 is listed twice"):
        parse_endpoints(["a:1", "a:1"])
    with pytest.raises(ValueError, match="at most 16"):
        parse_endpoints(f"h{i}:1" for i in range(17))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpusched.toml"
    path.write_text(text)
    return path


def test_cluster_mode_keys_load(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, """
controllers = ["ctl1:6820", "ctl2:6820"]
[controller]
listen = ["0.0.0.0:6820", "[::]:6820"]
node_addresses = { gpu01 = ["10.0.0.11"], gpu02 = ["10.0.0.12", "fd00::12"] }
admin_group = "hpcadmin"
[auth]
method = "munge"
"""))
    assert config.controllers == (Endpoint("ctl1"), Endpoint("ctl2"))
    assert config.controller.listen == (Endpoint("0.0.0.0"), Endpoint("::"))
    assert dict(config.controller.node_addresses) == {"gpu01": ("10.0.0.11",),
                                                       "gpu02": ("10.0.0.12", "fd00::12")}


@pytest.mark.parametrize("text, message", [
    ('[controller]\nlisten = ["0.0.0.0:6820"]\n',
     "controller.listen: the API over TCP needs credentials: set [auth] method"),
    ('controllers = ["ctl1:6820"]\n[auth]\nmethod = "none"\n',
     "controllers: the API over TCP needs credentials"),
    ('[controller]\nlisten = "0.0.0.0:6820"\n[auth]\nmethod = "key"\n',
     "controller.listen: expected a list of addresses"),
    ('[controller]\nlisten = ["0.0.0.0:99999"]\n[auth]\nmethod = "key"\n',
     "controller.listen: expected 'host:port'"),
    ('controllers = ["c:1", "c:1"]\n[auth]\nmethod = "key"\n', "controllers: c:1 is listed twice"),
    ('[controller]\nnode_addresses = { gpu01 = "10.0.0.1" }\n',
     "controller.node_addresses.gpu01: expected a list of 1 to 16 IP addresses"),
    ('[controller]\nnode_addresses = { gpu01 = ["gpu01.example.org"] }\n',
     "controller.node_addresses.gpu01: expected a list of 1 to 16 IP addresses"),
    ('[controller]\nnode_addresses = { gpu01 = [] }\n', "expected a list of 1 to 16 IP"),
    ('[controller]\nnode_addresses = { "bad name" = ["10.0.0.1"] }\n',
     "controller.node_addresses.'bad name': expected a node name"),
    ('[controller]\nnode_addresses = ["10.0.0.1"]\n', "controller.node_addresses: expected a table"),
])
def test_bad_cluster_settings_name_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)


def test_node_addresses_listed_replace_the_resolvers() -> None:
    book = NodeAddressBook({"gpu01": ("10.0.0.11",)})
    assert list(book("gpu01")) == ["10.0.0.11"]
    assert "127.0.0.1" in book("localhost")  # the resolver, through /etc/hosts
    assert list(book("no-such-node.invalid")) == []


def test_node_addresses_are_remembered_for_a_while() -> None:
    calls: list[str] = []

    def resolve(name: str, *args: object) -> list[tuple[object, ...]]:
        calls.append(name)
        return [(None, None, None, "", ("10.1.2.3", 0)), (None, None, None, "", ("10.1.2.3", 0))]

    book = NodeAddressBook(ttl=60.0, resolve=resolve)
    assert list(book("gpu07")) == ["10.1.2.3"]
    assert list(book("gpu07")) == ["10.1.2.3"]
    assert calls == ["gpu07"]
    stale = NodeAddressBook(ttl=0.0, resolve=resolve)
    stale("gpu07")
    stale("gpu07")
    assert calls == ["gpu07", "gpu07", "gpu07"]
