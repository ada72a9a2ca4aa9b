"""GatewayConfig validation: every bad value is a ValueError that names it."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from fleetserve.gateway.balance import BalancerConfig
from fleetserve.gateway.config import GatewayConfig
from fleetserve.gateway.edge import EdgeConfig, ShedConfig

BACKEND = ("http://127.0.0.1:8000",)


def test_defaults_and_endpoints() -> None:
    config = GatewayConfig(backends=("http://10.0.0.1:8000=3", "http://10.0.0.2:8000"))
    assert (config.port, config.workers, config.discovery) == (8080, 1, "static")
    assert [(ep.url, ep.weight) for ep in config.endpoints()] == [
        ("http://10.0.0.1:8000", 3), ("http://10.0.0.2:8000", 1)]


def test_the_per_replica_cap_is_one_setting_enforced_by_the_balancer() -> None:
    edge = EdgeConfig(shedding=ShedConfig(max_inflight=100, replica_max_inflight=4))
    assert GatewayConfig(backends=BACKEND, edge=edge).balancer.replica_max_inflight == 4
    assert GatewayConfig(backends=BACKEND).balancer.replica_max_inflight is None
    with pytest.raises(ValueError, match="replica_max_inflight must be an integer >= 1"):
        BalancerConfig(replica_max_inflight=0)


def test_config_pickles_for_worker_processes() -> None:
    config = GatewayConfig(backends=BACKEND, balancer=BalancerConfig(policy="round-robin"))
    assert pickle.loads(pickle.dumps(config)) == config


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"port": 70000}, "port"), ({"grpc_port": -1}, "grpc_port"), ({"host": ""}, "host"),
        ({"workers": 0}, "workers"), ({"workers": 2, "port": 0}, "explicit --port"),
        ({"discovery": "consul"}, "discovery must be one of"),
        ({"backends": ()}, "at least one --backend"),
        ({"discovery": "dns", "dns_name": "x"}, "only used with --discovery static"),
        ({"discovery": "file", "backends": ()}, "--discovery-file"),
        ({"discovery": "dns", "backends": ()}, "--dns-name"),
        ({"discovery_poll_s": 0}, "discovery_poll_s"),
        ({"request_timeout_ms": 0}, "request_timeout_ms"),
        ({"request_timeout_ms": 20, "max_request_timeout_ms": 10}, "request_timeout_ms"),
        ({"max_body_bytes": 0}, "max_body_bytes"), ({"max_retries": 4}, "max_retries"),
        ({"retry_after_s": 0}, "retry_after_s"), ({"backend_grpc_port_offset": -1}, "backend_grpc_port_offset"),
        ({"backends": ("https://a:1",)}, "only http://"), ({"backends": ("10.0.0.1:80",)}, "needs a scheme"),
    ],
)
def test_invalid_values_are_named(overrides: dict[str, Any], message: str) -> None:
    settings: dict[str, Any] = {"backends": BACKEND, **overrides}
    with pytest.raises(ValueError, match=message):
        GatewayConfig(**settings)
