"""EdgeConfig parsing from the ``edge:`` mapping: defaults, a full example, and errors naming the key."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
import yaml

from fleetserve.gateway.edge.config import (
    DEFAULT_EXEMPT_PATHS,
    EdgeConfig,
    InputLimits,
    RateLimitRule,
    ShedConfig,
)
from fleetserve.gateway.edge.jwtconfig import JwtConfig, KeySpec, RouteScope

FULL = """
edge:
  trusted_proxies: [10.0.0.0/8, "::1"]
  exempt_paths: [/healthz]
  limits: {max_body_bytes: 1048576, header_read_timeout_s: 5, json_max_depth: 16}
  shedding: {max_inflight: 256, retry_after_s: 2, replica_max_inflight: 32}
  jwt:
    issuers: https://issuer.test
    audiences: [fleetserve, other]
    leeway_s: 30
    required_claims: [exp, iat, nbf]
    tenant_claim: org
    keys:
      - {jwks_url: "https://issuer.test/.well-known/jwks.json", algorithms: [RS256, ES256]}
      - {pem: /etc/fleetserve/pub.pem, algorithms: [EdDSA], kid: ed}
      - {secret_file: /etc/fleetserve/hmac, algorithms: [HS256, HS512]}
    route_scopes:
      - {prefix: /v2/repository, scopes: [admin]}
      - {prefix: /v2/models/secret, claims: {org: acme}}
  rate_limits:
    - {rate: 100, burst: 200}
    - {prefix: /v2/models, rate: 5.5, burst: 10, key: tenant, max_entries: 1000}
"""


def test_defaults_when_section_absent() -> None:
    config = EdgeConfig.from_mapping(None)
    assert config == EdgeConfig()
    assert config.jwt is None and config.shedding is None and config.rate_limits == ()
    assert config.limits == InputLimits()
    assert config.limits.max_body_bytes == 8 * 1024 * 1024
    assert config.exempt_paths == DEFAULT_EXEMPT_PATHS


def test_full_example_parses() -> None:
    config = EdgeConfig.from_mapping(yaml.safe_load(FULL)["edge"])
    assert config.trusted_proxies == (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("::1/128"))
    assert config.exempt_paths == ("/healthz",)
    assert config.limits.max_body_bytes == 1048576
    assert config.limits.header_read_timeout_s == 5.0
    assert config.limits.json_max_depth == 16
    assert config.limits.max_headers == InputLimits().max_headers
    assert config.shedding == ShedConfig(max_inflight=256, retry_after_s=2.0, replica_max_inflight=32)
    jwt = config.jwt
    assert isinstance(jwt, JwtConfig)
    assert jwt.issuers == ("https://issuer.test",)
    assert jwt.audiences == ("fleetserve", "other")
    assert jwt.leeway_s == 30.0
    assert jwt.required_claims == ("exp", "iat", "nbf")
    assert jwt.tenant_claim == "org"
    assert jwt.keys == (
        KeySpec("jwks_url", "https://issuer.test/.well-known/jwks.json", ("RS256", "ES256")),
        KeySpec("pem", "/etc/fleetserve/pub.pem", ("EdDSA",), kid="ed"),
        KeySpec("secret_file", "/etc/fleetserve/hmac", ("HS256", "HS512")),
    )
    assert jwt.route_scopes == (
        RouteScope("/v2/repository", scopes=("admin",)),
        RouteScope("/v2/models/secret", claims=(("org", "acme"),)),
    )
    assert config.rate_limits == (
        RateLimitRule(rate=100.0, burst=200),
        RateLimitRule(rate=5.5, burst=10, prefix="/v2/models", key="tenant", max_entries=1000),
    )


def _edge(**sections: Any) -> dict[str, Any]:
    return dict(sections)


def _jwt(**overrides: Any) -> dict[str, Any]:
    section: dict[str, Any] = {"keys": [{"pem": "/k.pem", "algorithms": ["RS256"]}]}
    section.update(overrides)
    return section


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"limitz": {}}, r"edge: unknown key\(s\) limitz"),
        ({"limits": {"max_body_bytes": "8M"}}, r"edge\.limits\.max_body_bytes must be an integer"),
        ({"limits": {"max_body_bytes": 0}}, r"edge\.limits: max_body_bytes must be >= 1"),
        ({"limits": {"header_read_timeout_s": -1}}, r"edge\.limits: header_read_timeout_s must be > 0"),
        ({"limits": {"keepalive_timeout_s": True}}, r"edge\.limits\.keepalive_timeout_s must be a finite"),
        ({"limits": []}, r"edge\.limits must be a mapping"),
        ({"shedding": {"retry_after_s": 1}}, r"edge\.shedding\.max_inflight is required"),
        ({"shedding": {"max_inflight": 0}}, r"edge\.shedding: max_inflight must be >= 1"),
        ({"rate_limits": {"rate": 1}}, r"edge\.rate_limits must be a list"),
        ({"rate_limits": [{"rate": 1}]}, r"edge\.rate_limits\[0\]\.burst is required"),
        ({"rate_limits": [{"rate": 1, "burst": 1, "key": "cookie"}]}, r"rate_limits\[0\]: key must be one of"),
        ({"rate_limits": [{"rate": 1, "burst": 1, "prefix": "v2"}]}, r"rate_limits\[0\]: prefix must be a path"),
        ({"rate_limits": [{"rate": 1, "burst": 1, "key": "subject"}]}, r"need the jwt section"),
        ({"trusted_proxies": ["10.0.0.0/33"]}, r"edge\.trusted_proxies: '10\.0\.0\.0/33' is not an IP"),
        ({"exempt_paths": "healthz"}, r"exempt path must be a path starting with '/'"),
        ({"jwt": {}}, r"edge\.jwt: keys must list at least one key source"),
        ({"jwt": _jwt(leeway_s=-1)}, r"edge\.jwt: leeway_s must be a finite number >= 0"),
        ({"jwt": _jwt(audience="x")}, r"edge\.jwt: unknown key\(s\) audience"),
        ({"jwt": _jwt(keys=[{"pem": "/k.pem"}])}, r"edge\.jwt\.keys\[0\]\.algorithms is required"),
        ({"jwt": _jwt(keys=[{"algorithms": ["RS256"]}])}, r"edge\.jwt\.keys\[0\] must set exactly one of"),
        (
            {"jwt": _jwt(keys=[{"pem": "/a", "jwks_url": "https://x/j", "algorithms": ["RS256"]}])},
            r"must set exactly one of",
        ),
        ({"jwt": _jwt(keys=[{"pem": "/k", "algorithms": ["none"]}])}, r"algorithm 'none' is not supported"),
        ({"jwt": _jwt(keys=[{"pem": "/k", "algorithms": ["HS256"]}])}, r"HS256 need a secret_file"),
        ({"jwt": _jwt(keys=[{"jwks_url": "https://x/j", "algorithms": ["HS256"]}])}, r"need a secret_file"),
        (
            {"jwt": _jwt(keys=[{"secret_file": "/s", "algorithms": ["RS256"]}])},
            r"secret_file \(HMAC secret\) allows only HS256",
        ),
        ({"jwt": _jwt(keys=[{"jwks_url": "file:///j", "algorithms": ["RS256"]}])}, r"must be an http\(s\) URL"),
        (
            {"jwt": _jwt(keys=[{"jwks_file": "/j", "algorithms": ["RS256"], "kid": "a"}])},
            r"kid applies to pem and secret_file",
        ),
        ({"jwt": _jwt(route_scopes=[{"prefix": "/admin"}])}, r"route /admin must require at least one"),
        ({"jwt": _jwt(route_scopes=[{"prefix": "/a", "claims": {"org": 1}}])}, r"mapping of strings to str"),
        (
            {"jwt": _jwt(), "rate_limits": [{"rate": 1, "burst": 1, "key": "tenant"}]},
            r"keyed by tenant needs jwt\.tenant_claim",
        ),
    ],
)
def test_errors_name_the_bad_key(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EdgeConfig.from_mapping(section)


def test_dataclasses_validate_when_built_directly() -> None:
    with pytest.raises(ValueError, match="burst must be >= 1"):
        RateLimitRule(rate=1.0, burst=0)
    with pytest.raises(ValueError, match="rate must be > 0"):
        RateLimitRule(rate=0.0, burst=1)
    with pytest.raises(ValueError, match="max_header_bytes must be >= 256"):
        InputLimits(max_header_bytes=100)
    with pytest.raises(ValueError, match="trusted_proxies must hold IP networks"):
        EdgeConfig(trusted_proxies=("10.0.0.0/8",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="algorithms must list at least one"):
        KeySpec("pem", "/k.pem", ())
