"""The ``fleetserve gateway`` options of the edge guards, and the ``edge:`` section of its config file.

The ``edge:`` section (top level of the ``--config`` YAML file; see :class:`EdgeConfig` for its keys) is
the base; the flags add to it: ``--jwt-key`` keys, ``--jwt-issuer``/``--jwt-audience`` values,
``--rate-limit`` a per-client-IP rule and ``--trusted-proxy`` networks, while ``--max-inflight`` and
``--replica-max-inflight`` override the shedding caps. The adaptive concurrency limit
(``--adaptive-concurrency`` and its ``--adaptive-*`` options) is set by options alone. The body limit is the
gateway's ``max_body_bytes`` alone (``--max-body-bytes``), so ``edge.limits.max_body_bytes`` is refused.

A ``--jwt-key`` file is a JWK Set when it holds a JSON object, else PEM. Without ``--jwt-algorithm`` a
key allows what its type can verify (RSA: RS*/PS*, EC: the ES* of its curve, Ed25519/Ed448: EdDSA; a
JWK's own ``alg`` narrows it); HMAC secrets are configured in the file (``secret_file``), never here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fleetserve.gateway.edge import EdgeConfig, JwtConfig, KeySpec, RateLimitRule, ShedConfig
from fleetserve.gateway.edge.config import AdaptiveConcurrencyConfig, parse_networks
from fleetserve.gateway.edge.jwtconfig import ASYMMETRIC_ALGORITHMS, KeySource
from fleetserve.options import option, section


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


def _mapping_errors(section: Any) -> dict[str, Any] | None:
    """The config file's ``edge:`` mapping, checked for what only the gateway's own options may set."""
    if section is None:
        return None
    if not isinstance(section, dict):
        raise ValueError(f"edge must be a mapping, got {type(section).__name__}")
    limits = section.get("limits")
    if isinstance(limits, dict) and "max_body_bytes" in limits:
        raise ValueError("edge.limits.max_body_bytes: the body limit is the gateway's max_body_bytes "
                         "(--max-body-bytes, or max_body_bytes: in the config file), one setting for all")
    return section


@dataclass(frozen=True)
class EdgeOptions:
    """The edge guards' options; :meth:`build` lays them over the config file's ``edge:`` section."""

    jwt_key: tuple[str, ...] = option((), "require a bearer JWT verified by this PEM key/certificate or JWK Set "
                                      "file (repeatable)", metavar="FILE")
    jwt_algorithm: tuple[str, ...] = option((), "algorithms the --jwt-key keys allow (repeatable)", metavar="ALG",
                                            default_text="what each key's type can verify")
    jwt_issuer: tuple[str, ...] = option((), "accepted iss (repeatable)", metavar="ISS", default_text="any")
    jwt_audience: tuple[str, ...] = option((), "accepted aud (repeatable)", metavar="AUD", default_text="any")
    rate_limit: RateLimitRule | None = option(None, "token bucket per client IP: RATE requests/s, bursts of BURST "
                                              "(default burst: one second's worth)", parse=rate_limit,
                                              metavar="RATE[:BURST]", default_text="no limit")
    trusted_proxy: tuple[str, ...] = option((), "believe X-Forwarded-For from peers in this network (repeatable)",
                                            metavar="CIDR")
    max_inflight: int | None = option(None, "requests in progress at the gateway at most; 503 + Retry-After "
                                      "beyond", metavar="N", default_text="no cap")
    replica_max_inflight: int | None = option(None, "requests in flight per replica at most; a full replica is "
                                              "skipped, 503 when all are full", metavar="N", default_text="no cap")
    edge: dict[str, Any] | None = option(None, "the guards' full settings (see EdgeConfig)", file_only=True)
    adaptive: AdaptiveConcurrencyConfig = section(AdaptiveConcurrencyConfig, "adaptive concurrency limit")

    def build(self) -> EdgeConfig:
        """The edge config: the file's ``edge:`` section, then the flags (ValueError naming the problem)."""
        base = EdgeConfig.from_mapping(_mapping_errors(self.edge))
        try:
            proxies = parse_networks(list(self.trusted_proxy))
        except ValueError as exc:
            raise ValueError(f"--trusted-proxy: {exc}") from None
        rules = base.rate_limits if self.rate_limit is None else (*base.rate_limits, self.rate_limit)
        return replace(base, jwt=self._jwt(base.jwt), rate_limits=rules, shedding=self._shedding(base),
                       trusted_proxies=base.trusted_proxies + proxies, adaptive=self.adaptive)

    def _jwt(self, base: JwtConfig | None) -> JwtConfig | None:
        algorithms = self.jwt_algorithm
        keys = tuple(key_spec(path, algorithms) for path in self.jwt_key)
        if algorithms and not keys:
            raise ValueError("--jwt-algorithm applies to --jwt-key keys: give at least one --jwt-key")
        issuers, audiences = self.jwt_issuer, self.jwt_audience
        if base is None:
            if not keys:
                if issuers or audiences:
                    raise ValueError("--jwt-issuer/--jwt-audience need a --jwt-key (or edge.jwt in the config file)")
                return None
            return JwtConfig(keys=keys, issuers=issuers, audiences=audiences)
        return replace(base, keys=base.keys + keys, issuers=base.issuers + issuers,
                       audiences=base.audiences + audiences)

    def _shedding(self, base: EdgeConfig) -> ShedConfig | None:
        shed = base.shedding
        if self.max_inflight is None and self.replica_max_inflight is None:
            return shed
        # Without a global cap of its own, in-flight requests are bounded by connections anyway (one request
        # at a time on each HTTP/1.1 connection): a cap at that number changes nothing.
        max_inflight = base.limits.max_connections if shed is None else shed.max_inflight
        replica = None if shed is None else shed.replica_max_inflight
        try:
            return ShedConfig(
                max_inflight=max_inflight if self.max_inflight is None else self.max_inflight,
                retry_after_s=ShedConfig.retry_after_s if shed is None else shed.retry_after_s,
                replica_max_inflight=replica if self.replica_max_inflight is None else self.replica_max_inflight,
            )
        except ValueError as exc:
            raise ValueError(f"--max-inflight/--replica-max-inflight: {exc}") from None


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
