"""The ``fleetserve gateway`` options of the edge guards, and the ``edge:`` section of its config file.

The ``edge:`` section (top level of the ``--config`` YAML file; see :class:`EdgeConfig` for its keys) is
the base; the flags add to it: ``--jwt-key`` keys, ``--jwt-issuer``/``--jwt-audience`` values,
``--rate-limit`` a per-client-IP rule and ``--trusted-proxy`` networks, while ``--max-inflight`` and
``--replica-max-inflight`` override the shedding caps. The body limit is the gateway's
``max_body_bytes`` alone (``--max-body-bytes``), so ``edge.limits.max_body_bytes`` is refused.

A ``--jwt-key`` file is a JWK Set when it holds a JSON object, else PEM. Without ``--jwt-algorithm`` a
key allows what its type can verify (RSA: RS*/PS*, EC: the ES* of its curve, Ed25519/Ed448: EdDSA; a
JWK's own ``alg`` narrows it); HMAC secrets are configured in the file (``secret_file``), never here.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from fleetserve.gateway.edge import EdgeConfig, JwtConfig, KeySpec, RateLimitRule, ShedConfig
from fleetserve.gateway.edge.config import parse_networks
from fleetserve.gateway.edge.jwtconfig import ASYMMETRIC_ALGORITHMS, KeySource


def rate_limit(text: str) -> RateLimitRule:
    """``RATE[:BURST]`` requests per second per client IP; the burst defaults to one second's worth."""
    rate_text, _, burst_text = text.partition(":")
    try:
        rate = float(rate_text)
        burst = int(burst_text) if burst_text else max(1, math.ceil(rate))
    except ValueError:
        raise ValueError(f"--rate-limit must be RATE[:BURST] (e.g. 100:200), got {text!r}") from None
    try:
        return RateLimitRule(rate=rate, burst=burst)
    except ValueError as exc:
        raise ValueError(f"--rate-limit {text}: {exc}") from None


def add_edge_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument_group("edge guards (also the edge: section of --config)").add_argument
    add("--jwt-key", action="append", default=[], metavar="FILE",
        help="require a bearer JWT verified by this PEM key/certificate or JWK Set file (repeatable)")
    add("--jwt-algorithm", action="append", default=[], metavar="ALG",
        help="algorithms the --jwt-key keys allow (repeatable; default: what each key's type can verify)")
    add("--jwt-issuer", action="append", default=[], metavar="ISS", help="accepted iss (repeatable)")
    add("--jwt-audience", action="append", default=[], metavar="AUD", help="accepted aud (repeatable)")
    add("--rate-limit", metavar="RATE[:BURST]",
        help="token bucket per client IP: RATE requests/s, bursts of BURST (default: one second's worth)")
    add("--trusted-proxy", action="append", default=[], metavar="CIDR",
        help="believe X-Forwarded-For from peers in this network (repeatable)")
    add("--max-inflight", type=int, metavar="N",
        help="requests in progress at the gateway at most; 503 + Retry-After beyond")
    add("--replica-max-inflight", type=int, metavar="N",
        help="requests in flight per replica at most; a full replica is skipped, 503 when all are full")


def read_edge_section(config_path: str | None) -> dict[str, Any] | None:
    """The ``edge:`` mapping of a YAML config file (None when there is no file or no section)."""
    if not config_path:
        return None
    import yaml

    try:
        data = yaml.safe_load(Path(config_path).read_text())
    except OSError as exc:
        raise ValueError(f"cannot read config file {config_path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"config file {config_path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or data.get("edge") is None:
        return None
    section = data["edge"]
    if not isinstance(section, dict):
        raise ValueError(f"config file {config_path}: edge must be a mapping, got {type(section).__name__}")
    limits = section.get("limits")
    if isinstance(limits, dict) and "max_body_bytes" in limits:
        raise ValueError("edge.limits.max_body_bytes: the body limit is the gateway's max_body_bytes "
                         "(--max-body-bytes, or max_body_bytes: in the config file), one setting for all")
    return section


def key_spec(path: str, algorithms: tuple[str, ...]) -> KeySpec:
    """A ``--jwt-key`` file as a key spec: a JWK Set if it holds a JSON object, else PEM."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read --jwt-key {path}: {exc}") from None
    source: KeySource = "jwks_file" if text.lstrip().startswith("{") else "pem"
    try:
        return KeySpec(source, path, algorithms or _default_algorithms(source, path, text))
    except ValueError as exc:
        raise ValueError(f"--jwt-key {path}: {exc}") from None


def _default_algorithms(source: str, path: str, text: str) -> tuple[str, ...]:
    from fleetserve.gateway.edge.keys import family_algorithms, keys_from_jwks, load_pem

    if source == "pem":
        return tuple(sorted(family_algorithms(load_pem(path, (), None).key)))
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    found = keys_from_jwks(document, ASYMMETRIC_ALGORITHMS, f"jwks_file {path}")
    allowed = sorted({alg for key in found for alg in key.algorithms})
    if not allowed:
        raise ValueError("the JWK Set holds no usable signature key")
    return tuple(allowed)


def _jwt(base: JwtConfig | None, args: argparse.Namespace) -> JwtConfig | None:
    algorithms = tuple(args.jwt_algorithm)
    keys = tuple(key_spec(path, algorithms) for path in args.jwt_key)
    if algorithms and not keys:
        raise ValueError("--jwt-algorithm applies to --jwt-key keys: give at least one --jwt-key")
    issuers, audiences = tuple(args.jwt_issuer), tuple(args.jwt_audience)
    if base is None:
        if not keys:
            if issuers or audiences:
                raise ValueError("--jwt-issuer/--jwt-audience need a --jwt-key (or edge.jwt in the config file)")
            return None
        return JwtConfig(keys=keys, issuers=issuers, audiences=audiences)
    return replace(base, keys=base.keys + keys, issuers=base.issuers + issuers, audiences=base.audiences + audiences)


def _shedding(base: EdgeConfig, args: argparse.Namespace) -> ShedConfig | None:
    shed = base.shedding
    if args.max_inflight is None and args.replica_max_inflight is None:
        return shed
    # Without a global cap of its own, in-flight requests are bounded by connections anyway (one request
    # at a time on each HTTP/1.1 connection): a cap at that number changes nothing.
    max_inflight = base.limits.max_connections if shed is None else shed.max_inflight
    replica = None if shed is None else shed.replica_max_inflight
    try:
        return ShedConfig(
            max_inflight=max_inflight if args.max_inflight is None else args.max_inflight,
            retry_after_s=ShedConfig.retry_after_s if shed is None else shed.retry_after_s,
            replica_max_inflight=replica if args.replica_max_inflight is None else args.replica_max_inflight,
        )
    except ValueError as exc:
        raise ValueError(f"--max-inflight/--replica-max-inflight: {exc}") from None


def edge_from_args(args: argparse.Namespace) -> EdgeConfig:
    """The edge config: the config file's ``edge:`` section, then the flags (ValueError naming the problem)."""
    base = EdgeConfig.from_mapping(read_edge_section(getattr(args, "config", None)))
    try:
        proxies = parse_networks(args.trusted_proxy)
    except ValueError as exc:
        raise ValueError(f"--trusted-proxy: {exc}") from None
    rules = base.rate_limits if args.rate_limit is None else (*base.rate_limits, rate_limit(args.rate_limit))
    return replace(base, jwt=_jwt(base.jwt, args), rate_limits=rules, shedding=_shedding(base, args),
                   trusted_proxies=base.trusted_proxies + proxies)
