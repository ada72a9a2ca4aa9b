"""Validated settings shared by the NGINX and HAProxy renderers: backends, policy, timeouts, retries.

Backends use the gateway's ``URL[=WEIGHT]`` form. Both proxies take integer weights in a bounded range,
so fractional weights are scaled to the smallest integers that keep their ratios (:func:`integer_weights`).
Every value that lands in a rendered file is checked here, so a config can never be injected through a
host name or a policy string.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from fleetserve.wire import check_weight, parse_weighted

HEALTH_PATH = "/v2/health/ready"
# Host names and IPv4 literals; IPv6 literals are checked separately (they arrive without brackets).
_HOSTNAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")
_IPV6 = re.compile(r"^[0-9A-Fa-f:.]+$")

# Each proxy spells its policies differently; every spelling maps to one canonical name.
_POLICY_ALIASES = {
    "round-robin": "round-robin", "round_robin": "round-robin", "roundrobin": "round-robin",
    "least-conn": "least-conn", "least_conn": "least-conn", "leastconn": "least-conn",
}
POLICIES = ("round-robin", "least-conn")


def canonical_policy(name: str) -> str:
    """``round-robin`` or ``least-conn`` for any of the proxies' spellings; ValueError otherwise."""
    try:
        return _POLICY_ALIASES[name.strip().lower()]
    except KeyError:
        raise ValueError(f"policy {name!r} is not one of {', '.join(sorted(_POLICY_ALIASES))}") from None


def _check_host(host: str, where: str) -> str:
    if _HOSTNAME.match(host) or (":" in host and _IPV6.match(host)):
        return host
    raise ValueError(f"{where}: {host!r} is not a valid host name or IP address")


@dataclass(frozen=True)
class Backend:
    """One replica behind the proxy: ``host:port`` and a positive relative weight."""

    host: str
    port: int
    weight: float = 1.0

    def __post_init__(self) -> None:
        _check_host(self.host, "backend")
        if not 0 < self.port < 65536:
            raise ValueError(f"backend {self.host}: port {self.port} is outside 1..65535")
        object.__setattr__(self, "weight", check_weight(self.weight, self.address))

    @property
    def address(self) -> str:
        """``host:port``, with IPv6 literals bracketed as both proxies expect."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def from_url(cls, url: str, weight: float = 1.0) -> Backend:
        """A backend from ``http://host[:port]`` (port 80 if absent); paths, queries and https are refused."""
        text = url.strip()
        if "://" not in text:
            raise ValueError(f"backend {url!r} needs a scheme, e.g. http://{text}")
        parts = urlsplit(text)
        if parts.scheme.lower() != "http":
            raise ValueError(f"backend {url!r}: only http:// replicas can be proxied, got {parts.scheme!r}")
        if parts.path.strip("/") or parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError(f"backend {url!r} must be scheme://host:port with no path, query or credentials")
        if not parts.hostname:
            raise ValueError(f"backend {url!r} has no host")
        try:
            port = parts.port or 80
        except ValueError as exc:
            raise ValueError(f"backend {url!r}: {exc}") from None
        return cls(parts.hostname, port, weight)

    @classmethod
    def parse(cls, spec: str) -> Backend:
        """The CLI form ``URL[=WEIGHT]`` (:func:`fleetserve.wire.parse_weighted`), e.g. ``http://10.0.0.5:8000=2``."""
        url, weight = parse_weighted(spec)
        return cls.from_url(url, weight)


def integer_weights(weights: Sequence[float], limit: int) -> list[int]:
    """Integers in ``1..limit`` with the ratios of ``weights``: exact when a small multiplier makes them whole
    (``[1.5, 1]`` -> ``[3, 2]``), otherwise the largest weight is scaled to ``limit`` and the rest rounded."""
    if not weights:
        return []
    for multiplier in range(1, 101):
        scaled = [w * multiplier for w in weights]
        if all(abs(s - round(s)) < 1e-9 for s in scaled) and max(scaled) <= limit:
            ints = [max(1, round(s)) for s in scaled]
            divisor = math.gcd(*ints)
            return [i // divisor for i in ints]
    top = max(weights)
    return [max(1, round(w / top * limit)) for w in weights]


@dataclass(frozen=True)
class ProxyConfig:
    """A proxy in front of replicas. Times are seconds; ``workers`` 0 means one per CPU core."""

    backends: tuple[Backend, ...]
    port: int = 8080
    host: str = "0.0.0.0"
    policy: str = "round-robin"
    workers: int = 0
    max_body_bytes: int = 16 * 1024 * 1024  # the replica's --max-body-bytes default
    connect_timeout_s: float = 2.0
    timeout_s: float = 30.0
    tries: int = 2  # attempts per request, the first included
    keepalive: int = 64  # idle upstream connections kept per worker (NGINX) / reused (HAProxy)
    max_fails: int = 3  # NGINX passive health: failures within fail_timeout_s mark a backend down
    fail_timeout_s: float = 10.0
    health_interval_s: float = 2.0  # HAProxy active checks of HEALTH_PATH
    fall: int = 3
    rise: int = 2
    maxconn: int = 4096  # client connections (HAProxy maxconn, NGINX worker_connections)
    access_log: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "backends", tuple(self.backends))
        object.__setattr__(self, "policy", canonical_policy(self.policy))
        if not self.backends:
            raise ValueError("a proxy needs at least one --backend URL[=WEIGHT]")
        seen = {b.address for b in self.backends}
        if len(seen) != len(self.backends):
            raise ValueError("backends must be distinct; each host:port may appear once")
        _check_host(self.host, "listen host")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0 (0 = one per core), got {self.workers}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        for name in ("connect_timeout_s", "timeout_s", "fail_timeout_s", "health_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("tries", "keepalive", "max_fails", "fall", "rise", "maxconn"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def from_pairs(cls, backends: Sequence[tuple[str, float]], **settings: Any) -> ProxyConfig:
        """A config from ``(url, weight)`` pairs, the form benchmarks hold."""
        return cls(tuple(Backend.from_url(url, weight) for url, weight in backends), **settings)


def duration(seconds: float) -> str:
    """A duration both NGINX and HAProxy read: whole seconds as ``Ns``, anything finer as ``Nms``."""
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"
