"""Client address: X-Forwarded-For only as far as trusted proxies vouch (rightmost untrusted hop)."""

from __future__ import annotations

import ipaddress

import pytest
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from fleetserve.gateway.edge.clientip import client_ip, parse_ip
from fleetserve.gateway.edge.config import parse_networks

TRUSTED = parse_networks(["10.0.0.0/8", "fd00::/8"])


def _request(peer: str, *xff: str) -> object:
    headers = CIMultiDict(("X-Forwarded-For", value) for value in xff)
    return make_mocked_request("GET", "/", headers=headers).clone(remote=peer)


@pytest.mark.parametrize(
    ("peer", "xff", "trusted", "expected"),
    [
        ("1.2.3.4", ["9.9.9.9"], (), "1.2.3.4"),  # no trusted proxies: header ignored
        ("1.2.3.4", ["9.9.9.9"], TRUSTED, "1.2.3.4"),  # untrusted peer: header ignored
        ("10.0.0.1", [], TRUSTED, "10.0.0.1"),  # trusted peer, no header: the proxy itself
        ("10.0.0.1", ["9.9.9.9"], TRUSTED, "9.9.9.9"),
        ("10.0.0.1", ["6.6.6.6, 9.9.9.9, 10.0.0.5"], TRUSTED, "9.9.9.9"),  # spoofed leftmost entry ignored
        ("10.0.0.1", ["6.6.6.6", "9.9.9.9, 10.0.0.5"], TRUSTED, "9.9.9.9"),  # header split over lines
        ("10.0.0.1", ["10.0.0.7, 10.0.0.5"], TRUSTED, "10.0.0.7"),  # all trusted: leftmost
        ("10.0.0.1", ["9.9.9.9, garbage"], TRUSTED, "10.0.0.1"),  # junk ends the walk at the last vouched hop
        ("10.0.0.1", [" 9.9.9.9:4711 "], TRUSTED, "9.9.9.9"),
        ("10.0.0.1", ["[2001:db8::1]:443"], TRUSTED, "2001:db8::1"),
        ("fd00::1", ["2001:db8::2"], TRUSTED, "2001:db8::2"),
        ("::ffff:10.0.0.1", ["9.9.9.9"], TRUSTED, "9.9.9.9"),  # IPv4-mapped peer is the IPv4 proxy
    ],
)
def test_rightmost_untrusted_hop(peer: str, xff: list[str], trusted: tuple[object, ...], expected: str) -> None:
    assert client_ip(_request(peer, *xff), trusted) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.2.3.4", "1.2.3.4"),
        ("1.2.3.4:80", "1.2.3.4"),
        ("::1", "::1"),
        ("[::1]:80", "::1"),
        ("[::1", None),
        ("unknown", None),
        ("", None),
        ("::ffff:1.2.3.4", "1.2.3.4"),
    ],
)
def test_parse_ip(text: str, expected: str | None) -> None:
    parsed = parse_ip(text)
    assert (None if parsed is None else str(parsed)) == expected
    if parsed is not None:
        assert isinstance(parsed, ipaddress.IPv4Address | ipaddress.IPv6Address)
