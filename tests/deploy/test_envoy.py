"""The Envoy bootstrap renderer: the gateway's defaults in Envoy's terms, the edge guards as filters, and the
real binary's ``--mode validate`` accepting every variant."""

from __future__ import annotations

import ipaddress
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from fleetserve.cli import main
from fleetserve.deploy.envoy import CLIENT_SIDE_WRR, ENVOY_POLICIES, EnvoyConfig, envoy_bootstrap, render_envoy_config
from fleetserve.deploy.envoy_edge import EnvoyEdgeError, jwks, token_bucket
from fleetserve.deploy.proxy import Backend
from fleetserve.gateway.config import BalancerConfig
from fleetserve.gateway.edge.config import EdgeConfig, RateLimitRule, ShedConfig
from fleetserve.gateway.edge.jwtconfig import JwtConfig, KeySpec, RouteScope

BACKENDS = (Backend("10.0.0.5", 8000), Backend("10.0.0.6", 8000, 3))


def _cluster(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["static_resources"]["clusters"][0]


def _manager(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def _filter(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f["typed_config"] for f in _manager(doc)["http_filters"] if f["name"] == name)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("keys")
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    files = {"rsa.pem": rsa_key, "ec.pem": ec_key}
    for name, key in files.items():
        (folder / name).write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    (folder / "secret").write_bytes(b"s" * 32 + b"\n")
    return {name: folder / name for name in (*files, "secret")}


def test_least_request_cluster_carries_the_gateway_defaults() -> None:
    b = BalancerConfig()
    cluster = _cluster(envoy_bootstrap(EnvoyConfig(BACKENDS)))
    policy = cluster["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["name"] == "envoy.load_balancing_policies.least_request"
    assert policy["typed_config"]["choice_count"] == 2
    check = cluster["health_checks"][0]
    assert check["http_health_check"]["path"] == "/v2/health/ready"
    assert (check["interval"], check["timeout"]) == (f"{b.health_interval_s:g}s", f"{b.health_timeout_s:g}s")
    assert (check["unhealthy_threshold"], check["healthy_threshold"]) == (b.unhealthy_threshold, b.healthy_threshold)
    outlier = cluster["outlier_detection"]
    assert outlier["consecutive_5xx"] == 5 and outlier["base_ejection_time"] == "5s"
    assert outlier["max_ejection_percent"] == 50.0
    budget = cluster["circuit_breakers"]["thresholds"][0]["retry_budget"]
    assert budget == {"budget_percent": {"value": 20.0}, "min_retry_concurrency": 3}
    assert cluster["common_lb_config"]["healthy_panic_threshold"] == {"value": b.panic_threshold_percent}
    weights = [e["load_balancing_weight"] for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert weights == [1, 3]


def test_routes_retry_elsewhere_with_a_per_try_timeout() -> None:
    doc = envoy_bootstrap(EnvoyConfig(BACKENDS, per_try_timeout_s=2.5, timeout_s=20))
    routes = _manager(doc)["route_config"]["virtual_hosts"][0]["routes"]
    catch_all = routes[-1]
    assert catch_all["match"] == {"prefix": "/"}
    retry = catch_all["route"]["retry_policy"]
    assert catch_all["route"]["timeout"] == "20s" and retry["per_try_timeout"] == "2.5s"
    assert "connect-failure" in retry["retry_on"] and retry["retriable_status_codes"] == [503]
    assert retry["retry_host_predicate"][0]["name"] == "envoy.retry_host_predicates.previous_hosts"
    assert [r["match"] for r in routes[:-1]] == [{"path": p} for p in EdgeConfig().exempt_paths]


def test_client_side_wrr_reads_per_response_orca_reports() -> None:
    cluster = _cluster(envoy_bootstrap(EnvoyConfig(BACKENDS, policy=CLIENT_SIDE_WRR, blackout_period_s=2)))
    policy = cluster["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["name"] == "envoy.load_balancing_policies.client_side_weighted_round_robin"
    assert policy["typed_config"]["enable_oob_load_report"] is False
    assert policy["typed_config"]["blackout_period"] == "2s"


@pytest.mark.parametrize(("settings", "message"), [
    ({"backends": ()}, "at least one --backend"),
    ({"policy": "maglev"}, "Envoy policy must be one of"),
    ({"per_try_timeout_s": 40.0}, "must not exceed timeout_s"),
    ({"choice_count": 1}, "choice_count"),
    ({"port": 9901}, "different ports"),
    ({"host": "0.0.0.0; rm"}, "not a valid host"),
])
def test_bad_settings_name_the_problem(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EnvoyConfig(**{"backends": BACKENDS, **settings})


def test_jwt_keys_become_one_jwk_per_allowed_algorithm(keys: dict[str, Path]) -> None:
    config = JwtConfig(keys=(KeySpec("pem", str(keys["rsa.pem"]), ("RS256", "PS256")),
                             KeySpec("pem", str(keys["ec.pem"]), ("ES256",), kid="ec-1"),
                             KeySpec("secret_file", str(keys["secret"]), ("HS256",), kid="h")))
    found = jwks(config)["keys"]
    assert [(k["kty"], k["alg"]) for k in found] == [("RSA", "PS256"), ("RSA", "RS256"), ("EC", "ES256"),
                                                     ("oct", "HS256")]
    assert found[2]["kid"] == "ec-1" and found[3]["kid"] == "h"
    assert all(k["use"] == "sig" for k in found)


def test_jwt_filter_has_a_provider_per_issuer_and_exempts_probes(keys: dict[str, Path]) -> None:
    jwt = JwtConfig(keys=(KeySpec("pem", str(keys["rsa.pem"]), ("RS256",)),), issuers=("a", "b"),
                    audiences=("fleet",), leeway_s=30)
    doc = envoy_bootstrap(EnvoyConfig(BACKENDS, edge=EdgeConfig(jwt=jwt)))
    authn = _filter(doc, "envoy.filters.http.jwt_authn")
    assert sorted(p["issuer"] for p in authn["providers"].values()) == ["a", "b"]
    provider = authn["providers"]["fleetserve_0"]
    assert provider["audiences"] == ["fleet"] and provider["clock_skew_seconds"] == 30
    assert provider["require_expiration"] is True
    assert json.loads(provider["local_jwks"]["inline_string"])["keys"][0]["alg"] == "RS256"
    assert authn["rules"][-1]["requires"] == {"requires_any": {"requirements": [
        {"provider_name": "fleetserve_0"}, {"provider_name": "fleetserve_1"}]}}
    assert {"match": {"path": "/v2/health/ready"}} in authn["rules"]


def test_rate_limits_become_per_address_token_buckets() -> None:
    edge = EdgeConfig(rate_limits=(RateLimitRule(100, 200), RateLimitRule(0.5, 2, prefix="/inference")),
                      shedding=ShedConfig(500, replica_max_inflight=32),
                      trusted_proxies=(ipaddress.ip_network("10.1.0.0/16"),))
    doc = envoy_bootstrap(EnvoyConfig(BACKENDS, edge=edge))
    limit = _filter(doc, "envoy.filters.http.local_ratelimit")
    assert [d["token_bucket"] for d in limit["descriptors"]] == [
        {"max_tokens": 200, "tokens_per_fill": 5, "fill_interval": "0.05s"},
        {"max_tokens": 2, "tokens_per_fill": 1, "fill_interval": "2s"},
    ]
    assert limit["rate_limits"][1]["actions"][0]["header_value_match"]["headers"][0]["string_match"] == {
        "prefix": "/inference"}
    routes = _manager(doc)["route_config"]["virtual_hosts"][0]["routes"]
    assert routes[0]["typed_per_filter_config"]["envoy.filters.http.local_ratelimit"]["disabled"] is True
    assert "typed_per_filter_config" not in routes[-1]
    breakers = _cluster(doc)["circuit_breakers"]
    assert breakers["thresholds"][0]["max_requests"] == 500
    assert breakers["per_host_thresholds"] == [{"priority": "DEFAULT", "max_connections": 32}]
    xff = _manager(doc)["original_ip_detection_extensions"][0]["typed_config"]
    assert xff["xff_trusted_cidrs"]["cidrs"] == [{"address_prefix": "10.1.0.0", "prefix_len": 16}]


@pytest.mark.parametrize(("rate", "expected"), [(100, (5, 50)), (30, (2, 67)), (1, (1, 1000)), (1000, (50, 50))])
def test_token_bucket_rates(rate: float, expected: tuple[int, int]) -> None:
    bucket = token_bucket(rate, 10)
    tokens, interval_ms = expected
    assert (bucket["tokens_per_fill"], bucket["fill_interval"]) == (tokens, f"{interval_ms / 1000:g}s")
    assert abs(tokens / (interval_ms / 1000) - rate) / rate < 0.01


@pytest.mark.parametrize(("edge", "message"), [
    (lambda k: EdgeConfig(jwt=JwtConfig(keys=(KeySpec("pem", str(k["rsa.pem"]), ("RS256",)),),
                                        route_scopes=(RouteScope("/admin", ("admin",)),))), "RBAC"),
    (lambda k: EdgeConfig(jwt=JwtConfig(keys=(KeySpec("pem", str(k["rsa.pem"]), ("RS256",)),)),
                          rate_limits=(RateLimitRule(1, 1, key="subject"),)), "keyed by subject"),
    (lambda k: EdgeConfig(jwt=JwtConfig(keys=(KeySpec("jwks_url", "https://idp.example/jwks", ("RS256",)),))),
     "saved to a file"),
])
def test_guards_envoy_cannot_enforce_are_refused(edge: Any, message: str, keys: dict[str, Path]) -> None:
    with pytest.raises(EnvoyEdgeError, match=message):
        render_envoy_config(EnvoyConfig(BACKENDS, edge=edge(keys)))


def _variants(keys: dict[str, Path]) -> list[EnvoyConfig]:
    jwt = JwtConfig(keys=(KeySpec("pem", str(keys["rsa.pem"]), ("RS256", "PS256")),
                          KeySpec("secret_file", str(keys["secret"]), ("HS256",), kid="h")), issuers=("i1", "i2"))
    full = EdgeConfig(jwt=jwt, rate_limits=(RateLimitRule(50, 100), RateLimitRule(5, 5, prefix="/v2")),
                      shedding=ShedConfig(100, replica_max_inflight=8),
                      trusted_proxies=(ipaddress.ip_network("192.0.2.0/24"),))
    return [EnvoyConfig(BACKENDS, policy=p, edge=e) for p in ENVOY_POLICIES for e in (EdgeConfig(), full)]


def test_envoy_validates_every_variant(keys: dict[str, Path], envoy_bin: str, tmp_path: Path) -> None:
    for i, config in enumerate(_variants(keys)):
        path = tmp_path / f"envoy-{i}.yaml"
        path.write_text(render_envoy_config(config))
        result = subprocess.run([envoy_bin, "--mode", "validate", "-c", str(path), "--log-level", "warn"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"{config.policy}: {result.stdout}{result.stderr}"
        assert yaml.safe_load(path.read_text())["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"


def test_deploy_envoy_command(tmp_path: Path, keys: dict[str, Path], envoy_bin: str,
                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "envoy.yaml"
    rc = main(["deploy", "envoy", "--backend", "http://10.0.0.5:8000", "--backend", "http://10.0.0.6:8000=2",
               "--envoy-policy", CLIENT_SIDE_WRR, "--jwt-key", str(keys["rsa.pem"]), "--rate-limit", "20:40",
               "--port", "9000", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    doc = yaml.safe_load(out.read_text())
    assert _manager(doc)["http_filters"][0]["name"] == "envoy.filters.http.jwt_authn"
    assert doc["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] == 9000
    result = subprocess.run([envoy_bin, "--mode", "validate", "-c", str(out)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("argv", "message"), [
    (["deploy", "envoy"], "at least one --backend"),
    (["deploy", "envoy", "--backend", "http://r:1", "--policy", "least_conn"], "--envoy-policy"),
    (["deploy", "envoy", "--backend", "http://r:1", "--envoy-policy", "ring-hash"], "ring-hash"),
    (["deploy", "envoy", "--backend", "http://r:1", "--jwt-key", "/nonexistent.pem"], "cannot read --jwt-key"),
])
def test_deploy_envoy_mistakes_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
