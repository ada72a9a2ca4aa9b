"""Validated configuration of the gateway's edge guards (the ``edge:`` section of a config file).

Every guard is off unless its section is present, except the input limits, which always apply with
defaults sized for KServe v2 inference bodies. The adaptive concurrency limit is set by its options
(flags, environment, top-level file keys), not by the ``edge:`` section. :meth:`EdgeConfig.from_mapping`
turns the parsed YAML section into these objects; each dataclass validates itself in ``__post_init__``.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from fleetserve.gateway.edge._mapping import Section
from fleetserve.gateway.edge.jwtconfig import JwtConfig
from fleetserve.options import option

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
RateKey = Literal["ip", "subject", "tenant"]
RATE_KEYS: tuple[RateKey, ...] = ("ip", "subject", "tenant")
# Probes and scrapes; the last two are the gRPC listener's health methods (a call's path is its method).
DEFAULT_EXEMPT_PATHS = ("/healthz", "/readyz", "/metrics", "/v2/health/live", "/v2/health/ready",
                        "/inference.GRPCInferenceService/ServerLive", "/inference.GRPCInferenceService/ServerReady")


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def _positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def _route_prefix(name: str, value: str) -> None:
    if not isinstance(value, str) or not value.startswith("/"):
        raise ValueError(f"{name} must be a path starting with '/', got {value!r}")


@dataclass(frozen=True)
class InputLimits:
    """Bounds on what one client may send; always enforced.

    - ``max_body_bytes``: largest request body (413 beyond; checked on Content-Length before reading).
    - ``max_header_bytes``: largest request head (request line plus all header lines); 431 beyond.
    - ``max_headers``: most header lines in one request.
    - ``header_read_timeout_s``: a request head must arrive completely within this time of its first
      byte (of the connection's start, for the first request); slow senders are disconnected with 408.
    - ``body_read_timeout_s``: the whole body must arrive within this time of the head (408 beyond).
    - ``keepalive_timeout_s``: an idle kept-alive connection is closed after this long.
    - ``max_connections``: most open client connections; more are answered 503 and closed.
    - ``json_max_depth`` / ``json_max_elements``: bounds on nesting and on the number of values of a JSON
      body, checked by a byte scan before any parser sees it.
    """

    max_body_bytes: int = 8 * 1024 * 1024
    max_header_bytes: int = 16 * 1024
    max_headers: int = 100
    header_read_timeout_s: float = 10.0
    body_read_timeout_s: float = 30.0
    keepalive_timeout_s: float = 75.0
    max_connections: int = 10_000
    json_max_depth: int = 32
    json_max_elements: int = 1_000_000

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_header_bytes", "max_headers", "max_connections"):
            _positive_int(name, getattr(self, name))
        for name in ("json_max_depth", "json_max_elements"):
            _positive_int(name, getattr(self, name))
        for name in ("header_read_timeout_s", "body_read_timeout_s", "keepalive_timeout_s"):
            _positive(name, getattr(self, name))
        if self.max_header_bytes < 256:
            raise ValueError(f"max_header_bytes must be >= 256, got {self.max_header_bytes}")

    @classmethod
    def from_section(cls, s: Section) -> InputLimits:
        d = cls()
        return s.build(
            cls,
            max_body_bytes=s.integer("max_body_bytes", d.max_body_bytes),
            max_header_bytes=s.integer("max_header_bytes", d.max_header_bytes),
            max_headers=s.integer("max_headers", d.max_headers),
            header_read_timeout_s=s.number("header_read_timeout_s", d.header_read_timeout_s),
            body_read_timeout_s=s.number("body_read_timeout_s", d.body_read_timeout_s),
            keepalive_timeout_s=s.number("keepalive_timeout_s", d.keepalive_timeout_s),
            max_connections=s.integer("max_connections", d.max_connections),
            json_max_depth=s.integer("json_max_depth", d.json_max_depth),
            json_max_elements=s.integer("json_max_elements", d.json_max_elements),
        )


@dataclass(frozen=True)
class ShedConfig:
    """Load shedding: ``max_inflight`` requests at once at the gateway (503 + Retry-After beyond).

    ``replica_max_inflight`` is the per-replica cap on attempts in flight, which the balancer enforces
    (``None``: no per-replica cap; see :class:`~fleetserve.gateway.balance.BalancerConfig`).
    """

    max_inflight: int
    retry_after_s: float = 1.0
    replica_max_inflight: int | None = None

    def __post_init__(self) -> None:
        _positive_int("max_inflight", self.max_inflight)
        _positive("retry_after_s", self.retry_after_s)
        if self.replica_max_inflight is not None:
            _positive_int("replica_max_inflight", self.replica_max_inflight)

    @classmethod
    def from_section(cls, s: Section) -> ShedConfig:
        if not s.has("max_inflight"):
            raise ValueError(f"{s.where('max_inflight')} is required")
        return s.build(
            cls,
            max_inflight=s.integer("max_inflight", 0),
            retry_after_s=s.number("retry_after_s", 1.0),
            replica_max_inflight=s.optional_integer("replica_max_inflight"),
        )


@dataclass(frozen=True)
class AdaptiveConcurrencyConfig:
    """The adaptive concurrency limit (:mod:`.adaptive`): requests in flight at most, following latency.

    Beyond the limit a request is answered 503 + ``Retry-After`` at once. Defaults are Envoy's
    ``adaptive_concurrency`` defaults, except the start (Envoy starts at ``min_concurrency``; here at
    ``initial_concurrency``, as Netflix's Gradient2Limit), the RTT buffer (100%, for batching replicas), the
    update interval (Envoy requires one), ``min_rtt_interval_s`` (Envoy requires one; here forced windows are
    off by default, see :mod:`.adaptive`) and the latency floor (Envoy has none). ``initial_concurrency`` is used
    within ``[min, max]_concurrency``. On by default (BENCHMARKS.md §4.4): with the floor it refuses nothing in
    front of a batching GPU replica that answers within it, and it keeps an overload's excess out of the queues.
    """

    enabled: bool = option(True, "limit requests in flight to what the replicas answer without queueing, "
                           "measured from latency; 503 + Retry-After beyond", flag="--adaptive-concurrency")
    min_concurrency: int = option(3, "the limit's floor; requests admitted with fewer in flight measure the "
                                  "no-load latency", flag="--adaptive-min-concurrency")
    initial_concurrency: int = option(32, "the limit at start and while demand stays below half of it",
                                      flag="--adaptive-initial-concurrency")
    max_concurrency: int = option(1000, "the limit's ceiling", flag="--adaptive-max-concurrency")
    update_interval_ms: float = option(100.0, "recompute the limit this often", flag="--adaptive-update-interval-ms")
    min_rtt_interval_s: float = option(0.0, "also re-measure the no-load latency this often, plus up to 15 percent "
                                       "jitter, refusing beyond the floor meanwhile, as Envoy does (0: it follows "
                                       "requests admitted at low load instead)", flag="--adaptive-min-rtt-interval-s")
    rtt_buffer_percent: float = option(100.0, "latency above the no-load latency tolerated before the limit "
                                       "shrinks (a request behind a running batch waits up to twice it)",
                                       flag="--adaptive-rtt-buffer-percent")
    latency_floor_ms: float = option(50.0, "median latency at or below this is never a reason to shrink the limit, "
                                     "whatever the no-load latency: a batching replica whose fuller batches cost "
                                     "latency but gain throughput is not refused while it answers within it (0: "
                                     "the RTT buffer alone)", flag="--adaptive-latency-floor-ms")
    min_rtt_samples: int = 50
    min_update_samples: int = 20
    sample_percentile: float = 50.0
    jitter_percent: float = 15.0
    retry_after_s: float = 1.0

    def __post_init__(self) -> None:
        _positive_int("adaptive min_concurrency", self.min_concurrency)
        _positive_int("adaptive initial_concurrency", self.initial_concurrency)
        _positive_int("adaptive max_concurrency", self.max_concurrency)
        if self.max_concurrency < self.min_concurrency:
            raise ValueError(f"adaptive max_concurrency ({self.max_concurrency}) must be >= min_concurrency "
                             f"({self.min_concurrency})")
        _positive("adaptive update_interval_ms", self.update_interval_ms)
        if not (math.isfinite(self.min_rtt_interval_s) and self.min_rtt_interval_s >= 0):
            raise ValueError(f"adaptive min_rtt_interval_s must be >= 0, got {self.min_rtt_interval_s}")
        if not (math.isfinite(self.rtt_buffer_percent) and self.rtt_buffer_percent >= 0):
            raise ValueError(f"adaptive rtt_buffer_percent must be >= 0, got {self.rtt_buffer_percent}")
        if not (math.isfinite(self.latency_floor_ms) and self.latency_floor_ms >= 0):
            raise ValueError(f"adaptive latency_floor_ms must be >= 0, got {self.latency_floor_ms}")
        _positive_int("adaptive min_rtt_samples", self.min_rtt_samples)
        _positive_int("adaptive min_update_samples", self.min_update_samples)
        if not 0 < self.sample_percentile <= 100:
            raise ValueError(f"adaptive sample_percentile must be in (0, 100], got {self.sample_percentile}")
        if not 0 <= self.jitter_percent <= 100:
            raise ValueError(f"adaptive jitter_percent must be in 0..100, got {self.jitter_percent}")
        _positive("adaptive retry_after_s", self.retry_after_s)

    @property
    def update_interval_s(self) -> float:
        return self.update_interval_ms / 1000

    @property
    def latency_floor_s(self) -> float:
        return self.latency_floor_ms / 1000


@dataclass(frozen=True)
class RateLimitRule:
    """A token bucket of ``rate`` requests per second and depth ``burst`` per client, for paths
    starting with ``prefix``.

    ``key`` picks what a client is: its IP (``ip``), its verified token subject (``subject``) or tenant
    (``tenant``); requests without a verified identity fall back to their IP. At most ``max_entries``
    buckets are kept (least recently used ones are dropped).
    """

    rate: float
    burst: int
    prefix: str = "/"
    key: RateKey = "ip"
    max_entries: int = 100_000

    def __post_init__(self) -> None:
        _positive("rate", self.rate)
        _positive_int("burst", self.burst)
        _route_prefix("prefix", self.prefix)
        if self.key not in RATE_KEYS:
            raise ValueError(f"key must be one of {', '.join(RATE_KEYS)}, got {self.key!r}")
        _positive_int("max_entries", self.max_entries)

    @classmethod
    def from_section(cls, s: Section) -> RateLimitRule:
        for required in ("rate", "burst"):
            if not s.has(required):
                raise ValueError(f"{s.where(required)} is required")
        return s.build(
            cls,
            rate=s.number("rate", 0.0),
            burst=s.integer("burst", 0),
            prefix=s.string("prefix", "/"),
            key=s.string("key", "ip"),
            max_entries=s.integer("max_entries", 100_000),
        )


def parse_networks(values: Sequence[str]) -> tuple[IPNetwork, ...]:
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value, strict=False))
        except ValueError as exc:
            raise ValueError(f"{value!r} is not an IP address or CIDR network") from exc
    return tuple(networks)


@dataclass(frozen=True)
class EdgeConfig:
    """All edge guards of one gateway. ``exempt_paths`` (exact paths) skip shedding, auth and rate
    limits, so probes and scrapes keep working under overload; input limits still apply to them."""

    jwt: JwtConfig | None = None
    rate_limits: tuple[RateLimitRule, ...] = ()
    shedding: ShedConfig | None = None
    limits: InputLimits = field(default_factory=InputLimits)
    adaptive: AdaptiveConcurrencyConfig = field(default_factory=AdaptiveConcurrencyConfig)
    trusted_proxies: tuple[IPNetwork, ...] = ()
    exempt_paths: tuple[str, ...] = DEFAULT_EXEMPT_PATHS

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate_limits", tuple(self.rate_limits))
        object.__setattr__(self, "trusted_proxies", tuple(self.trusted_proxies))
        object.__setattr__(self, "exempt_paths", tuple(self.exempt_paths))
        if not isinstance(self.adaptive, AdaptiveConcurrencyConfig):
            raise ValueError(f"adaptive must be an AdaptiveConcurrencyConfig, got {self.adaptive!r}")
        for rule in self.rate_limits:
            if not isinstance(rule, RateLimitRule):
                raise ValueError(f"rate_limits must hold RateLimitRule objects, got {rule!r}")
        for net in self.trusted_proxies:
            if not isinstance(net, ipaddress.IPv4Network | ipaddress.IPv6Network):
                raise ValueError(f"trusted_proxies must hold IP networks, got {net!r}")
        for path in self.exempt_paths:
            _route_prefix("exempt path", path)
        if any(r.key != "ip" for r in self.rate_limits) and self.jwt is None:
            raise ValueError("rate limits keyed by subject or tenant need the jwt section (no identity)")
        if self.jwt is not None and self.jwt.tenant_claim is None and any(r.key == "tenant" for r in self.rate_limits):
            raise ValueError("a rate limit keyed by tenant needs jwt.tenant_claim")

    @classmethod
    def from_mapping(cls, data: Mapping[str, object] | None, path: str = "edge") -> EdgeConfig:
        """Parse the ``edge:`` section of a config file (``None`` or ``{}``: defaults only)."""
        s = Section(data or {}, path)
        jwt_section = s.section("jwt")
        shed_section = s.section("shedding")
        limits_section = s.section("limits")
        try:
            proxies = parse_networks(s.strings("trusted_proxies", ()))
        except ValueError as exc:
            raise ValueError(f"{s.where('trusted_proxies')}: {exc}") from exc
        return s.build(
            cls,
            jwt=None if jwt_section is None else JwtConfig.from_section(jwt_section),
            rate_limits=tuple(RateLimitRule.from_section(r) for r in s.sections("rate_limits")),
            shedding=None if shed_section is None else ShedConfig.from_section(shed_section),
            limits=InputLimits() if limits_section is None else InputLimits.from_section(limits_section),
            trusted_proxies=proxies,
            exempt_paths=s.strings("exempt_paths", DEFAULT_EXEMPT_PATHS),
        )
