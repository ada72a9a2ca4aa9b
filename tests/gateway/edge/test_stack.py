"""The declarative stack: which guards a config turns on, their order, and the whole stack over HTTP
with rejections counted in Prometheus."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fleetserve.gateway.edge.adaptive_guard import AdaptiveConcurrencyMiddleware
from fleetserve.gateway.edge.auth import JwtAuthMiddleware
from fleetserve.gateway.edge.config import AdaptiveConcurrencyConfig, EdgeConfig
from fleetserve.gateway.edge.identity import StripIdentityHeaders
from fleetserve.gateway.edge.limits import BodyLimits, HeadLimits, app_kwargs, server_kwargs
from fleetserve.gateway.edge.metrics import REASONS, PrometheusRejections
from fleetserve.gateway.edge.ratelimit import RateLimitMiddleware
from fleetserve.gateway.edge.shed import LoadShedMiddleware
from fleetserve.gateway.edge.stack import LAYERS, build_middlewares
from tests.support.clock import FakeClock
from tests.support.jwt_keys import AUDIENCE, ISSUER, ServeFn, SigningKey, claims, write


def _full(tmp_path: Path, keys: dict[str, SigningKey]) -> EdgeConfig:
    pem = write(tmp_path, "ec.pem", keys["ec256"].public_pem)
    return EdgeConfig.from_mapping(
        {
            "limits": {"max_body_bytes": 2048, "json_max_depth": 3},
            "shedding": {"max_inflight": 100},
            "jwt": {
                "issuers": [ISSUER],
                "audiences": [AUDIENCE],
                "keys": [{"pem": pem, "algorithms": ["ES256"]}],
                "route_scopes": [{"prefix": "/v2/repository", "scopes": ["admin"]}],
            },
            "rate_limits": [{"rate": 1, "burst": 2, "key": "subject"}],
        }
    )


def test_input_limits_and_the_adaptive_limit_are_on_by_default() -> None:
    middlewares = build_middlewares(EdgeConfig())
    assert [type(m) for m in middlewares] == [HeadLimits, AdaptiveConcurrencyMiddleware, BodyLimits]
    unlimited = build_middlewares(EdgeConfig(adaptive=AdaptiveConcurrencyConfig(enabled=False)))
    assert [type(m) for m in unlimited] == [HeadLimits, BodyLimits]
    assert [name for name, _ in LAYERS] == [
        "head_limits", "identity", "shedding", "auth", "rate_limit", "adaptive_concurrency", "body_limits",
    ]  # fmt: skip


def test_full_config_builds_every_guard_in_order(tmp_path: Path, signing_keys: dict[str, SigningKey]) -> None:
    config = replace(_full(tmp_path, signing_keys), adaptive=AdaptiveConcurrencyConfig(enabled=True))
    middlewares = build_middlewares(config)
    assert [type(m) for m in middlewares] == [
        HeadLimits, StripIdentityHeaders, LoadShedMiddleware, JwtAuthMiddleware, RateLimitMiddleware,
        AdaptiveConcurrencyMiddleware, BodyLimits,
    ]  # fmt: skip


def test_unreadable_key_file_fails_at_build_time(tmp_path: Path) -> None:
    config = EdgeConfig.from_mapping(
        {"jwt": {"keys": [{"pem": str(tmp_path / "missing.pem"), "algorithms": ["RS256"]}]}}
    )
    with pytest.raises(ValueError, match="cannot read pem"):
        build_middlewares(config)


def test_prometheus_counter_starts_every_reason_at_zero() -> None:
    registry = CollectorRegistry()
    observer = PrometheusRejections.create(registry)
    assert all(registry.get_sample_value("fleetserve_gateway_rejected_total", {"reason": r}) == 0 for r in REASONS)
    observer.rejected("rate_limited")
    assert registry.get_sample_value("fleetserve_gateway_rejected_total", {"reason": "rate_limited"}) == 1


async def test_whole_stack_over_http(serve: ServeFn, tmp_path: Path, signing_keys: dict[str, SigningKey]) -> None:
    config = _full(tmp_path, signing_keys)
    registry = CollectorRegistry()
    clock = FakeClock()
    middlewares = build_middlewares(config, PrometheusRejections.create(registry), clock)
    client = await serve(middlewares, app=app_kwargs(config.limits), server=server_kwargs(config.limits))

    def count(reason: str) -> float | None:
        return registry.get_sample_value("fleetserve_gateway_rejected_total", {"reason": reason})

    token = signing_keys["ec256"].sign(claims(sub="carol"))
    auth = {"Authorization": f"Bearer {token}"}

    # Oversized and unauthenticated: the outermost guard answers.
    assert (await client.post("/v2/models/m/infer", data=b"x" * 4096)).status == 413
    # Unauthenticated with a too-deep body: auth answers before the body is read or scanned.
    assert (await client.post("/v2/models/m/infer", json=[[[[1]]]])).status == 401
    assert (await client.get("/v2/health/ready")).status == 200  # exempt

    ok = await client.post("/v2/models/m/infer", json={"inputs": [1, 2]}, headers=auth)
    assert ok.status == 200
    assert (await ok.json())["identity"] == {"X-Fleetserve-Subject": "carol"}
    deep = await client.post("/v2/models/m/infer", json=[[[[1]]]], headers=auth)
    assert deep.status == 400
    limited = await client.get("/v2/models", headers=auth)
    assert limited.status == 429 and limited.headers["RateLimit-Limit"] == "2"
    clock.now += 1.0
    forbidden = await client.get("/v2/repository/index", headers=auth)
    assert forbidden.status == 403

    assert (count("body_too_large"), count("missing_token"), count("json_too_deep")) == (1, 1, 1)
    assert (count("rate_limited"), count("insufficient_scope"), count("overloaded")) == (1, 1, 0)
