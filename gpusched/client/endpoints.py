"""Network addresses of controllers, as ``host:port`` (``[v6addr]:port`` for an IPv6
literal): where controllers listen (``[controller] listen``) and where clients reach them
(``controllers``, ``$GPUSCHED_CONTROLLERS``). Parsed once, purely (stdlib only)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpusched.configfile import TableReader

DEFAULT_PORT = 6820
MAX_ENDPOINTS = 16
MAX_TEXT = 300
EXPECTED = "'host:port' such as 'ctl1:6820', '10.0.0.5:6820' or '[::1]:6820'"
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_PORT = re.compile(r"[0-9]{1,5}")


@dataclass(frozen=True)
class Endpoint:
    """One controller address: a host name or IP literal, and a TCP port."""

    host: str
    port: int = DEFAULT_PORT

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _host(text: str) -> str | None:
    """The host part if it is an IPv4 literal or a DNS name, else None."""
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        pass
    if len(text) > 253 or not all(_LABEL.fullmatch(label) for label in text.split(".")):
        return None
    return text


def parse_endpoint(text: object) -> Endpoint:
    """``host:port`` (the port may be left out: 6820) into an Endpoint; ValueError
    with a one-line reason for anything else."""
    if not isinstance(text, str) or not text or len(text) > MAX_TEXT:
        raise ValueError(f"expected {EXPECTED}, got {text!r:.80}")
    host_text, port_text = text, ""
    if text.startswith("["):
        close = text.find("]")
        rest = text[close + 1:] if close > 0 else "?"
        if close < 0 or (rest and not rest.startswith(":")):
            raise ValueError(f"expected {EXPECTED}, got {text!r:.80}")
        host_text, port_text = text[1:close], rest[1:]
        try:
            host: str | None = str(ipaddress.IPv6Address(host_text))
        except ValueError:
            host = None
        if not rest:
            port_text = str(DEFAULT_PORT)
    else:
        if text.count(":") > 1:
            raise ValueError(f"expected {EXPECTED} (an IPv6 address goes in brackets), got "
                             f"{text!r:.80}")
        host_text, _, port_text = text.partition(":")
        if ":" not in text:
            port_text = str(DEFAULT_PORT)
        host = _host(host_text)
    if host is None:
        raise ValueError(f"expected {EXPECTED}: {host_text!r:.80} is not a host name or IP "
                         "address")
    if not _PORT.fullmatch(port_text) or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"expected {EXPECTED}: port {port_text!r:.20} is not from 1 to 65535")
    return Endpoint(host, int(port_text))


def parse_endpoints(values: Iterable[object]) -> tuple[Endpoint, ...]:
    """A list of distinct addresses (at most MAX_ENDPOINTS); ValueError naming the bad one."""
    found: list[Endpoint] = []
    for value in values:
        if len(found) >= MAX_ENDPOINTS:
            raise ValueError(f"expected at most {MAX_ENDPOINTS} addresses")
        endpoint = parse_endpoint(value)
        if endpoint in found:
            raise ValueError(f"{endpoint} is listed twice")
        found.append(endpoint)
    return tuple(found)


def endpoints_in(r: TableReader, key: str) -> tuple[Endpoint, ...]:
    """The list of addresses under ``key`` of a configuration table (empty when absent)."""
    from gpusched.errors import ConfigError

    values = r.get(key, list, [], f"a list of addresses, each {EXPECTED}")
    try:
        return parse_endpoints(values)
    except ValueError as exc:
        raise ConfigError(f"{r.source}: {r.prefix}{key}: {exc}") from None
