"""``fleetserve gateway`` edge options and the config file's ``edge:`` section become one EdgeConfig."""

from __future__ import annotations

import ipaddress
import json
import pickle
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from fleetserve import cli
from fleetserve.gateway.command import GatewayOptions
from fleetserve.gateway.config import GatewayConfig
from fleetserve.gateway.edge import EdgeConfig, KeySpec, RateLimitRule

BACKEND = ("--backend", "http://127.0.0.1:8000")


def parse(*argv: str, config: Path | None = None) -> GatewayConfig:
    extra = ("--config", str(config)) if config is not None else ()
    options: GatewayOptions = cli.parse("gateway", [*BACKEND, *extra, *argv], {})[1]
    return options.config()


def public_pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@pytest.fixture(scope="module")
def key_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("keys")
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP384R1())
    (folder / "rsa.pem").write_bytes(public_pem(rsa_key))
    (folder / "ec.pem").write_bytes(public_pem(ec_key))
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key()))
    (folder / "ec.jwks").write_text(json.dumps({"keys": [{**jwk, "kid": "e1"}]}))
    (folder / "secret").write_text("s" * 64)
    return {name: str(folder / name) for name in ("rsa.pem", "ec.pem", "ec.jwks", "secret")}


def test_without_flags_only_the_input_limits_are_on() -> None:
    edge = parse().edge
    assert (edge.jwt, edge.rate_limits, edge.shedding, edge.trusted_proxies) == (None, (), None, ())
    assert edge.limits.max_body_bytes == 16 * 1024 * 1024


def test_max_body_bytes_is_one_setting() -> None:
    assert parse("--max-body-bytes", "4096").edge.limits.max_body_bytes == 4096
    config = GatewayConfig(backends=BACKEND[1:], max_body_bytes=1000)
    assert config.edge.limits.max_body_bytes == 1000
    assert pickle.loads(pickle.dumps(config)) == config


def test_flags_build_the_edge_config(key_files: dict[str, str]) -> None:
    edge = parse("--jwt-key", key_files["rsa.pem"], "--jwt-key", key_files["ec.jwks"], "--jwt-issuer", "iss",
                 "--jwt-audience", "a1", "--jwt-audience", "a2", "--rate-limit", "2.5:10",
                 "--trusted-proxy", "10.0.0.0/8", "--max-inflight", "64", "--replica-max-inflight", "8").edge
    assert edge.jwt is not None
    rsa_spec, jwks_spec = edge.jwt.keys
    assert (rsa_spec.source, set(rsa_spec.algorithms)) == ("pem", {"RS256", "RS384", "RS512", "PS256", "PS384",
                                                                   "PS512"})
    assert (jwks_spec.source, jwks_spec.algorithms) == ("jwks_file", ("ES384",))
    assert (edge.jwt.issuers, edge.jwt.audiences) == (("iss",), ("a1", "a2"))
    assert edge.rate_limits == (RateLimitRule(rate=2.5, burst=10),)
    assert edge.trusted_proxies == (ipaddress.ip_network("10.0.0.0/8"),)
    assert edge.shedding is not None
    assert (edge.shedding.max_inflight, edge.shedding.replica_max_inflight) == (64, 8)


def test_algorithm_flag_narrows_the_keys_and_burst_defaults_to_a_second(key_files: dict[str, str]) -> None:
    edge = parse("--jwt-key", key_files["rsa.pem"], "--jwt-algorithm", "PS256", "--rate-limit", "7.5").edge
    assert edge.jwt is not None and edge.jwt.keys[0].algorithms == ("PS256",)
    assert edge.rate_limits == (RateLimitRule(rate=7.5, burst=8),)


def test_a_replica_cap_alone_leaves_the_global_cap_at_the_connection_limit() -> None:
    shedding = parse("--replica-max-inflight", "3").edge.shedding
    assert shedding is not None
    assert (shedding.max_inflight, shedding.replica_max_inflight) == (EdgeConfig().limits.max_connections, 3)


def test_config_file_section_is_the_base_and_flags_add_to_it(tmp_path: Path, key_files: dict[str, str]) -> None:
    config = tmp_path / "fleetserve.yaml"
    config.write_text(json.dumps({"port": 9000, "edge": {
        "jwt": {"keys": [{"secret_file": key_files["secret"], "algorithms": ["HS256"], "kid": "h"}],
                "issuers": ["file-iss"], "tenant_claim": "org"},
        "rate_limits": [{"rate": 100, "burst": 200, "prefix": "/v2", "key": "subject"}],
        "shedding": {"max_inflight": 500, "retry_after_s": 3},
        "limits": {"header_read_timeout_s": 2.5},
        "trusted_proxies": ["192.168.0.0/16"],
    }}))
    edge = parse("--jwt-key", key_files["ec.pem"], "--jwt-issuer", "flag-iss", "--rate-limit", "5:5",
                 "--trusted-proxy", "127.0.0.1", "--replica-max-inflight", "4", config=config).edge
    assert edge.jwt is not None
    assert [spec.source for spec in edge.jwt.keys] == ["secret_file", "pem"]
    assert edge.jwt.keys[1] == KeySpec("pem", key_files["ec.pem"], ("ES384",))
    assert (edge.jwt.issuers, edge.jwt.tenant_claim) == (("file-iss", "flag-iss"), "org")
    assert [(r.prefix, r.key, r.rate) for r in edge.rate_limits] == [("/v2", "subject", 100.0), ("/", "ip", 5.0)]
    assert edge.shedding is not None
    assert (edge.shedding.max_inflight, edge.shedding.retry_after_s, edge.shedding.replica_max_inflight) == (
        500, 3.0, 4)
    assert edge.limits.header_read_timeout_s == 2.5
    assert [str(n) for n in edge.trusted_proxies] == ["192.168.0.0/16", "127.0.0.1/32"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--rate-limit", "fast"), "RATE\\[:BURST\\]"),
        (("--rate-limit", "0"), "rate must be > 0"),
        (("--rate-limit", "5:0"), "burst must be >= 1"),
        (("--jwt-issuer", "iss"), "need a --jwt-key"),
        (("--jwt-algorithm", "RS256"), "give at least one --jwt-key"),
        (("--jwt-key", "/nonexistent/key.pem"), "cannot read --jwt-key"),
        (("--jwt-key", "{rsa.pem}", "--jwt-algorithm", "HS256"), "need a secret_file"),
        (("--jwt-key", "{rsa.pem}", "--jwt-algorithm", "none"), "not supported"),
        (("--jwt-key", "{secret}"), "no PEM public key"),
        (("--max-inflight", "0"), "--max-inflight/--replica-max-inflight: max_inflight must be >= 1"),
        (("--replica-max-inflight", "0"), "replica_max_inflight must be >= 1"),
        (("--trusted-proxy", "localhost"), "--trusted-proxy: 'localhost' is not an IP"),
    ],
)
def test_bad_flags_are_named(argv: tuple[str, ...], message: str, key_files: dict[str, str]) -> None:
    argv = tuple(key_files[arg[1:-1]] if arg.startswith("{") else arg for arg in argv)
    with pytest.raises(ValueError, match=message):
        parse(*argv)


@pytest.mark.parametrize(
    "section, message",
    [
        ({"limits": {"max_body_bytes": 10}}, "one setting"),
        ({"shedding": {"max_inflight": 0}}, "edge.shedding: max_inflight must be >= 1"),
        ({"rate_limit": []}, "unknown key"),
        (["not", "a", "mapping"], "edge must be a mapping"),
    ],
)
def test_bad_config_file_sections_are_named(tmp_path: Path, section: object, message: str) -> None:
    config = tmp_path / "fleetserve.yaml"
    config.write_text(json.dumps({"edge": section}))
    with pytest.raises(ValueError, match=message):
        parse(config=config)


def test_every_guard_combines_with_a_grpc_listener(key_files: dict[str, str]) -> None:
    config = parse("--grpc-port", "9001", "--jwt-key", key_files["rsa.pem"], "--rate-limit", "10",
                   "--max-inflight", "10")
    assert config.grpc_port == 9001
    assert config.edge.jwt is not None and config.edge.rate_limits and config.edge.shedding is not None
