"""Render a static Envoy bootstrap that balances fleetserve replicas (``fleetserve deploy envoy``).

One listener (HTTP connection manager → router) and one cluster of the replicas, with the gateway's defaults
(``BalancerConfig``) spelled in Envoy's terms:

- balancing: ``LEAST_REQUEST`` with ``choice_count`` 2 (power of two choices on active requests), or
  ``client_side_weighted_round_robin`` (``envoy.load_balancing_policies.client_side_weighted_round_robin``),
  whose weights are ``rps_fractional / utilization`` from the ORCA report each replica puts on every
  response (``endpoint-load-metrics``; out-of-band reporting off). Envoy's router reads that header
  whenever the host's load-balancing policy asked for ORCA reports, so the policy is all it takes;
  see https://www.envoyproxy.io/docs/envoy/latest/intro/arch_overview/upstream/load_balancing/load_balancers;
- active health checks of ``/v2/health/ready`` (interval, timeout and thresholds of the gateway), outlier
  detection (consecutive 5xx, consecutive local-origin connect failures, base ejection time, at most half the
  fleet ejected) and the gateway's panic threshold;
- retries on another replica (connect failures, resets, 503) within a retry budget of the gateway's size
  (a share of active requests, with a floor), a per-try timeout and an overall route timeout;
- the edge guards (``EdgeConfig``) as ``jwt_authn`` and ``local_ratelimit`` filters (:mod:`.envoy_edge`).

The document is built as data and dumped with PyYAML, so no host name or path can break its syntax; every
value is validated here or in :class:`~fleetserve.deploy.proxy.Backend`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetserve.deploy.envoy_edge import edge_filters, exempt_route_config, listener_limits, overload_manager
from fleetserve.deploy.proxy import HEALTH_PATH, Backend, _check_host, integer_weights
from fleetserve.gateway.balance import BalancerConfig
from fleetserve.gateway.config import GatewayConfig
from fleetserve.gateway.edge.config import EdgeConfig

LEAST_REQUEST = "least-request"
CLIENT_SIDE_WRR = "client-side-weighted-round-robin"
ENVOY_POLICIES = (LEAST_REQUEST, CLIENT_SIDE_WRR)
CLUSTER = "fleetserve_replicas"
RETRY_ON = "connect-failure,refused-stream,reset,retriable-status-codes"
_MAX_WEIGHT = 128  # Envoy's endpoint weights are 1..128 for weighted LEAST_REQUEST's active-request bias

_B = BalancerConfig


def _seconds(value: float) -> str:
    """A protobuf Duration in YAML: ``2s``, ``0.25s``."""
    return f"{value:g}s"


@dataclass(frozen=True)
class EnvoyConfig:
    """Envoy in front of replicas. Times are seconds; defaults are the gateway's (``BalancerConfig``)."""

    backends: tuple[Backend, ...]
    port: int = 8080
    host: str = "0.0.0.0"
    admin_port: int = 9901
    admin_host: str = "127.0.0.1"
    policy: str = LEAST_REQUEST
    choice_count: int = 2
    connect_timeout_s: float = 1.0  # the gateway's upstream connect timeout
    timeout_s: float = GatewayConfig.request_timeout_ms / 1000  # the whole request, retries included
    per_try_timeout_s: float = 10.0
    retries: int = GatewayConfig.max_retries
    retry_budget_percent: float = _B.retry_budget_percent
    retry_min_concurrency: int = _B.retry_min_concurrency
    health_interval_s: float = _B.health_interval_s
    health_timeout_s: float = _B.health_timeout_s
    unhealthy_threshold: int = _B.unhealthy_threshold
    healthy_threshold: int = _B.healthy_threshold
    consecutive_5xx: int = _B.consecutive_errors
    consecutive_connect_errors: int = _B.consecutive_connect_errors
    base_ejection_s: float = _B.base_ejection_s
    max_ejection_s: float = _B.max_ejection_s
    max_ejection_percent: float = _B.max_ejection_percent
    panic_threshold_percent: float = _B.panic_threshold_percent
    # client_side_weighted_round_robin: a new report counts after the blackout, a stale one expires.
    weight_update_period_s: float = 1.0
    blackout_period_s: float = 1.0
    weight_expiration_period_s: float = 30.0
    max_body_bytes: int = GatewayConfig.max_body_bytes
    access_log: Path | None = None
    edge: EdgeConfig = field(default_factory=EdgeConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "backends", tuple(self.backends))
        if not self.backends:
            raise ValueError("Envoy needs at least one --backend URL[=WEIGHT]")
        if len({b.address for b in self.backends}) != len(self.backends):
            raise ValueError("backends must be distinct; each host:port may appear once")
        _check_host(self.host, "listen host")
        _check_host(self.admin_host, "admin host")
        for name in ("port", "admin_port"):
            if not 0 < getattr(self, name) < 65536:
                raise ValueError(f"{name} must be in 1..65535, got {getattr(self, name)}")
        if self.port == self.admin_port:
            raise ValueError("the listener and the admin interface need different ports")
        if self.policy not in ENVOY_POLICIES:
            raise ValueError(f"Envoy policy must be one of {', '.join(ENVOY_POLICIES)}, got {self.policy!r}")
        if self.choice_count < 2:
            raise ValueError(f"choice_count must be >= 2, got {self.choice_count}")
        for name in ("connect_timeout_s", "timeout_s", "per_try_timeout_s", "health_interval_s",
                     "health_timeout_s", "base_ejection_s", "max_ejection_s", "weight_expiration_period_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.per_try_timeout_s > self.timeout_s:
            raise ValueError(f"per_try_timeout_s ({self.per_try_timeout_s}) must not exceed timeout_s "
                             f"({self.timeout_s})")
        if self.weight_update_period_s < 0.1:
            raise ValueError(f"weight_update_period_s must be >= 0.1 (Envoy's floor), "
                             f"got {self.weight_update_period_s}")
        if self.blackout_period_s < 0:
            raise ValueError(f"blackout_period_s must be >= 0, got {self.blackout_period_s}")
        if not 0 <= self.retries <= 10:
            raise ValueError(f"retries must be in 0..10, got {self.retries}")
        for name in ("retry_budget_percent", "max_ejection_percent", "panic_threshold_percent"):
            if not 0 <= getattr(self, name) <= 100:
                raise ValueError(f"{name} must be in 0..100, got {getattr(self, name)}")
        for name in ("unhealthy_threshold", "healthy_threshold", "consecutive_5xx", "consecutive_connect_errors"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")

    @classmethod
    def from_pairs(cls, backends: Sequence[tuple[str, float]], **settings: Any) -> EnvoyConfig:
        """A config from ``(url, weight)`` pairs, the form benchmarks hold."""
        return cls(tuple(Backend.from_url(url, weight) for url, weight in backends), **settings)


def _weights(backends: Sequence[Backend]) -> list[int]:
    return integer_weights([b.weight for b in backends], _MAX_WEIGHT)


def _endpoints(config: EnvoyConfig) -> list[dict[str, Any]]:
    return [
        {"endpoint": {"address": {"socket_address": {"address": b.host, "port_value": b.port}},
                      "hostname": b.address},
         "load_balancing_weight": w}
        for b, w in zip(config.backends, _weights(config.backends), strict=True)
    ]


def _balancing(config: EnvoyConfig) -> dict[str, Any]:
    if config.policy == LEAST_REQUEST:
        policy: dict[str, Any] = {
            "name": "envoy.load_balancing_policies.least_request",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.least_request.v3.LeastRequest",
                "choice_count": config.choice_count,
            },
        }
    else:
        policy = {
            "name": "envoy.load_balancing_policies.client_side_weighted_round_robin",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies."
                         "client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin",
                "enable_oob_load_report": False,
                "blackout_period": _seconds(config.blackout_period_s),
                "weight_update_period": _seconds(config.weight_update_period_s),
                "weight_expiration_period": _seconds(config.weight_expiration_period_s),
            },
        }
    return {"load_balancing_policy": {"policies": [{"typed_extension_config": policy}]}}


def _cluster(config: EnvoyConfig) -> dict[str, Any]:
    shed = config.edge.shedding
    thresholds: dict[str, Any] = {
        "priority": "DEFAULT",
        "retry_budget": {"budget_percent": {"value": config.retry_budget_percent},
                         "min_retry_concurrency": config.retry_min_concurrency},
    }
    if shed is not None:
        thresholds |= {"max_requests": shed.max_inflight, "max_pending_requests": shed.max_inflight}
    circuit_breakers: dict[str, Any] = {"thresholds": [thresholds]}
    if shed is not None and shed.replica_max_inflight is not None:
        # HTTP/1.1 upstreams carry one request per connection: a connection cap per host is an in-flight cap.
        circuit_breakers["per_host_thresholds"] = [{"priority": "DEFAULT",
                                                    "max_connections": shed.replica_max_inflight}]
    return {
        "name": CLUSTER,
        "type": "STATIC",
        "connect_timeout": _seconds(config.connect_timeout_s),
        **_balancing(config),
        "common_lb_config": {"healthy_panic_threshold": {"value": config.panic_threshold_percent}},
        "load_assignment": {"cluster_name": CLUSTER, "endpoints": [{"lb_endpoints": _endpoints(config)}]},
        "health_checks": [{
            "timeout": _seconds(config.health_timeout_s),
            "interval": _seconds(config.health_interval_s),
            "no_traffic_interval": _seconds(config.health_interval_s),
            "unhealthy_threshold": config.unhealthy_threshold,
            "healthy_threshold": config.healthy_threshold,
            "http_health_check": {"path": HEALTH_PATH},
        }],
        "outlier_detection": {
            "consecutive_5xx": config.consecutive_5xx,
            "split_external_local_origin_errors": True,
            "consecutive_local_origin_failure": config.consecutive_connect_errors,
            "enforcing_consecutive_local_origin_failure": 100,
            "base_ejection_time": _seconds(config.base_ejection_s),
            "max_ejection_time": _seconds(config.max_ejection_s),
            "max_ejection_percent": config.max_ejection_percent,
            "interval": "1s",
        },
        "circuit_breakers": circuit_breakers,
        "per_connection_buffer_limit_bytes": config.max_body_bytes,
    }


def _route(config: EnvoyConfig) -> dict[str, Any]:
    return {
        "cluster": CLUSTER,
        "timeout": _seconds(config.timeout_s),
        "retry_policy": {
            "retry_on": RETRY_ON,
            "retriable_status_codes": [503],
            "num_retries": config.retries,
            "per_try_timeout": _seconds(config.per_try_timeout_s),
            "retry_host_predicate": [{
                "name": "envoy.retry_host_predicates.previous_hosts",
                "typed_config": {"@type": "type.googleapis.com/"
                                          "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"},
            }],
            # Reselect up to 10 times before settling for a host tried before: with 3, a 2-replica fleet
            # whose P2C kept drawing the just-killed replica failed about one retry in 16 (measured).
            "host_selection_retry_max_attempts": 10,
        },
    }


def _http_connection_manager(config: EnvoyConfig) -> dict[str, Any]:
    route = _route(config)
    routes = [{"match": {"path": path}, "route": route, **exempt_route_config(config.edge)}
              for path in config.edge.exempt_paths]
    routes.append({"match": {"prefix": "/"}, "route": route})
    manager: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
                 "HttpConnectionManager",
        "stat_prefix": "fleetserve",
        "codec_type": "AUTO",
        "route_config": {"name": "fleetserve", "virtual_hosts": [{"name": "replicas", "domains": ["*"],
                                                                   "routes": routes}]},
        "http_filters": [*edge_filters(config.edge), {
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
        }],
        **listener_limits(config.edge),
    }
    if config.access_log is not None:
        manager["access_log"] = [{
            "name": "envoy.access_loggers.file",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                             "path": str(config.access_log)},
        }]
    return manager


def envoy_bootstrap(config: EnvoyConfig) -> dict[str, Any]:
    """The bootstrap document as data."""
    return {
        "admin": {"address": {"socket_address": {"address": config.admin_host, "port_value": config.admin_port}}},
        "static_resources": {
            "listeners": [{
                "name": "fleetserve",
                "address": {"socket_address": {"address": config.host, "port_value": config.port}},
                "per_connection_buffer_limit_bytes": config.max_body_bytes,
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": _http_connection_manager(config),
                }]}],
            }],
            "clusters": [_cluster(config)],
        },
        "overload_manager": overload_manager(config.edge),
    }


def render_envoy_config(config: EnvoyConfig) -> str:
    """The bootstrap YAML for ``envoy -c FILE``."""
    header = (f"# Envoy in front of {len(config.backends)} fleetserve replica(s): {config.policy}, "
              "rendered by `fleetserve deploy envoy`.\n")
    return header + yaml.safe_dump(envoy_bootstrap(config), sort_keys=False, width=120)
