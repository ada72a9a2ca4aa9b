"""The client address of a request, believing ``X-Forwarded-For`` only as far as trusted proxies vouch.

Every proxy appends the address it received the request from, so the list is only as honest as the
hop that wrote each entry. Starting from the TCP peer and walking ``X-Forwarded-For`` from the right,
each trusted hop vouches for the entry to its left; the first address not in ``trusted_proxies`` is
the client (the "rightmost untrusted hop" rule of MDN's X-Forwarded-For security notes and NGINX's
``real_ip_recursive``). An entry that is not an IP address ends the walk at the last vouched hop.
Without trusted proxies the header is ignored entirely: a client could write anything into it.

Parsing an address costs microseconds, more than the rest of a rate-limit check, and the same few
addresses (the load balancers, the busiest clients) recur; each resolver keeps a bounded LRU of
parsed, classified addresses.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Sequence

from aiohttp import web

from fleetserve.gateway.edge.config import IPNetwork

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
UNKNOWN_CLIENT = "unknown"
_CACHE_ENTRIES = 4096


def parse_ip(text: str) -> IPAddress | None:
    """An address from a header entry or peer name: tolerates ``[v6]:port``, ``v4:port``, IPv4-mapped v6."""
    text = text.strip()
    if text.startswith("["):
        text = text[1 : text.find("]")] if "]" in text else ""
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class ClientAddress:
    """Resolves the client address of requests for one list of trusted proxy networks."""

    def __init__(self, trusted: Sequence[IPNetwork]) -> None:
        self.trusted = tuple(trusted)
        self._classify = functools.lru_cache(maxsize=_CACHE_ENTRIES)(self._classify_uncached)

    def _classify_uncached(self, text: str) -> tuple[str, bool] | None:
        """The normalized address and whether it is a trusted proxy (None: not an address)."""
        address = parse_ip(text)
        if address is None:
            return None
        return str(address), any(address in network for network in self.trusted)

    def __call__(self, request: web.BaseRequest) -> str:
        if not self.trusted or "X-Forwarded-For" not in request.headers:
            return self.resolve(request.remote, ())
        return self.resolve(request.remote, request.headers.getall("X-Forwarded-For"))

    def resolve(self, peer: str | None, forwarded_lines: Sequence[str]) -> str:
        """The client of a request from ``peer`` that carried these ``X-Forwarded-For`` lines."""
        if not peer:
            return UNKNOWN_CLIENT
        if not self.trusted:
            return peer
        current = self._classify(peer)
        if current is None:
            return peer
        if current[1] and forwarded_lines:
            entries = [entry for line in forwarded_lines for entry in line.split(",")]
            for entry in reversed(entries):
                hop = self._classify(entry.strip())
                if hop is None:
                    break
                current = hop
                if not current[1]:
                    break
        return current[0]


def client_ip(request: web.BaseRequest, trusted: Sequence[IPNetwork]) -> str:
    """One-off resolution (no cache shared across calls)."""
    return ClientAddress(trusted)(request)
