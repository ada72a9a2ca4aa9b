"""The gateway's edge guards (``EdgeConfig``) as Envoy HTTP filters and connection-manager settings.

- JWT → ``envoy.filters.http.jwt_authn``: every key (PEM, JWK Set file, HMAC secret file) becomes an inline JWK
  Set (``local_jwks``), one JWK per allowed algorithm with ``alg`` set, so Envoy accepts a token only under an
  algorithm the key's allow-list names (RFC 8725 §3.1, as the gateway does); issuers, audiences, clock skew and
  a required ``exp`` carry over. One provider per issuer (Envoy's provider holds one), any of them suffices.
- Rate limits → ``envoy.filters.http.local_ratelimit``: each rule is a descriptor of the path prefix and the
  client address with its own token bucket per address (dynamic descriptors, at most ``max_entries``), the
  ``RateLimit-*`` headers and ``Retry-After`` on a 429, like the gateway.
- Shedding caps become cluster circuit breakers (:mod:`.envoy`); input limits the connection manager's
  header size and count, header timeout and idle timeout; trusted proxies the XFF original-IP detection.

Exempt paths (probes, scrapes) skip both filters. What Envoy's filters cannot express the way the gateway
enforces it — per-route scopes, rate limits keyed by token subject or tenant, JWKS URLs — is refused with a
message naming it, never silently dropped. The filters are documented at
https://www.envoyproxy.io/docs/envoy/latest/configuration/http/http_filters/jwt_authn_filter and
https://www.envoyproxy.io/docs/envoy/latest/configuration/http/http_filters/local_rate_limit_filter.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fleetserve.gateway.edge.config import EdgeConfig, RateLimitRule
from fleetserve.gateway.edge.jwtconfig import JwtConfig, KeySpec

JWT_FILTER = "envoy.filters.http.jwt_authn"
RATE_LIMIT_FILTER = "envoy.filters.http.local_ratelimit"
_RATE_LIMIT_TYPE = "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit"
_RULE_KEY = "fleetserve_rate_limit"
_MIN_FILL_MS = 50  # Envoy's shortest token-bucket fill interval


class EnvoyEdgeError(ValueError):
    """An edge setting Envoy's filters cannot enforce the way the gateway does."""


def _verification_keys(spec: KeySpec) -> list[Any]:
    from fleetserve.gateway.edge.keys import keys_from_jwks, load_pem, load_secret

    if spec.source == "pem":
        return [load_pem(spec.location, spec.algorithms, spec.kid)]
    if spec.source == "secret_file":
        return [load_secret(spec.location, spec.algorithms, spec.kid)]
    if spec.source == "jwks_file":
        try:
            with open(spec.location, encoding="utf-8") as f:
                document = json.load(f)
        except (OSError, ValueError) as exc:
            raise ValueError(f"jwks_file {spec.location}: {exc}") from None
        return keys_from_jwks(document, spec.algorithms, f"jwks_file {spec.location}")
    raise EnvoyEdgeError(f"jwks_url {spec.location}: render with the key set saved to a file (--jwt-key FILE); "
                         "a remote JWKS would need its own Envoy cluster")


def _jwk(key: Any) -> dict[str, Any]:
    # Imported here: rendering a config without JWT (and free_port, through fleetserve.deploy.local) needs
    # no cryptography, which the GPU machine's carried wheels leave out.
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
    from jwt.algorithms import ECAlgorithm, HMACAlgorithm, OKPAlgorithm, RSAAlgorithm

    if isinstance(key, bytes):
        return dict(HMACAlgorithm.to_jwk(key, as_dict=True))
    if isinstance(key, rsa.RSAPublicKey):
        return dict(RSAAlgorithm.to_jwk(key, as_dict=True))
    if isinstance(key, ec.EllipticCurvePublicKey):
        return dict(ECAlgorithm.to_jwk(key, as_dict=True))
    if isinstance(key, ed25519.Ed25519PublicKey):
        return dict(OKPAlgorithm.to_jwk(key, as_dict=True))
    raise EnvoyEdgeError(f"Envoy's jwt_authn cannot verify with a {type(key).__name__}")


def jwks(config: JwtConfig) -> dict[str, Any]:
    """Every configured key as one JWK Set, one entry per (key, allowed algorithm)."""
    keys = []
    for spec in config.keys:
        for found in _verification_keys(spec):
            base = _jwk(found.key)
            if found.kid is not None:
                base["kid"] = found.kid
            keys += [{**base, "alg": alg, "use": "sig"} for alg in sorted(found.algorithms)]
    if not keys:
        raise ValueError("the JWT keys hold no usable signature key")
    return {"keys": keys}


def _jwt_filter(config: JwtConfig, exempt: tuple[str, ...]) -> dict[str, Any]:
    if config.route_scopes:
        raise EnvoyEdgeError("per-route scopes (jwt.route_scopes) need Envoy's RBAC filter; render without them")
    inline = json.dumps(jwks(config), separators=(",", ":"))
    common: dict[str, Any] = {
        "local_jwks": {"inline_string": inline},
        "clock_skew_seconds": math.ceil(config.leeway_s),
        "forward": True,
    }
    if config.audiences:
        common["audiences"] = list(config.audiences)
    if "exp" in config.required_claims:
        common["require_expiration"] = True
    issuers: list[str | None] = list(config.issuers) or [None]
    providers = {f"fleetserve_{i}": {**common, **({"issuer": iss} if iss else {})} for i, iss in enumerate(issuers)}
    names = [{"provider_name": name} for name in providers]
    requires = names[0] if len(names) == 1 else {"requires_any": {"requirements": names}}
    rules: list[dict[str, Any]] = [{"match": {"path": path}} for path in exempt]
    rules.append({"match": {"prefix": "/"}, "requires": requires})
    return {
        "name": JWT_FILTER,
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
                         "providers": providers, "rules": rules},
    }


def token_bucket(rate: float, burst: int) -> dict[str, Any]:
    """Envoy's bucket for ``rate`` tokens/s up to ``burst``: the fewest whole tokens per fill that keep the
    fill interval at Envoy's 50 ms floor or above (the rate is off by at most half a millisecond per fill)."""
    tokens = max(1, math.ceil(rate * _MIN_FILL_MS / 1000))
    interval_ms = max(_MIN_FILL_MS, round(tokens * 1000 / rate))
    return {"max_tokens": burst, "tokens_per_fill": tokens, "fill_interval": f"{interval_ms / 1000:g}s"}


def _rate_limit_config(rules: tuple[RateLimitRule, ...]) -> dict[str, Any]:
    for rule in rules:
        if rule.key != "ip":
            raise EnvoyEdgeError(f"rate limit on {rule.prefix} keyed by {rule.key}: Envoy's local_ratelimit "
                                 "keys by client address here; render with key: ip")
    on = {"default_value": {"numerator": 100, "denominator": "HUNDRED"}}
    return {
        "@type": _RATE_LIMIT_TYPE,
        "stat_prefix": "fleetserve_rate_limit",
        "filter_enabled": {**on, "runtime_key": "fleetserve_rate_limit_enabled"},
        "filter_enforced": {**on, "runtime_key": "fleetserve_rate_limit_enforced"},
        "always_consume_default_token_bucket": False,
        "max_dynamic_descriptors": max(r.max_entries for r in rules),
        "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
        "response_headers_to_add": [{"append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                                     "header": {"key": "retry-after", "value": "1"}}],
        "descriptors": [{"entries": [{"key": _RULE_KEY, "value": str(i)}, {"key": "remote_address"}],
                         "token_bucket": token_bucket(rule.rate, rule.burst)} for i, rule in enumerate(rules)],
        "rate_limits": [{"actions": [
            {"header_value_match": {"descriptor_key": _RULE_KEY, "descriptor_value": str(i),
                                    "headers": [{"name": ":path", "string_match": {"prefix": rule.prefix}}]}},
            {"remote_address": {}},
        ]} for i, rule in enumerate(rules)],
    }


def edge_filters(edge: EdgeConfig) -> list[dict[str, Any]]:
    """The HTTP filters before the router: JWT first (a request without a valid token is refused before it
    takes a rate-limit token, as in the gateway), then rate limits."""
    filters = []
    if edge.jwt is not None:
        filters.append(_jwt_filter(edge.jwt, edge.exempt_paths))
    if edge.rate_limits:
        filters.append({"name": RATE_LIMIT_FILTER, "typed_config": _rate_limit_config(edge.rate_limits)})
    return filters


def exempt_route_config(edge: EdgeConfig) -> dict[str, Any]:
    """Route settings of an exempt path: the rate limit filter off (JWT's own rules already skip it)."""
    if not edge.rate_limits:
        return {}
    off = {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "disabled": True}
    return {"typed_per_filter_config": {RATE_LIMIT_FILTER: off}}


def listener_limits(edge: EdgeConfig) -> dict[str, Any]:
    """Connection-manager settings for the input limits and the client address the rate limits key on."""
    limits = edge.limits
    settings: dict[str, Any] = {
        "max_request_headers_kb": max(1, math.ceil(limits.max_header_bytes / 1024)),
        "request_headers_timeout": f"{limits.header_read_timeout_s:g}s",
        "common_http_protocol_options": {"idle_timeout": f"{limits.keepalive_timeout_s:g}s",
                                         "max_headers_count": limits.max_headers},
    }
    if edge.trusted_proxies:
        xff = {"@type": "type.googleapis.com/envoy.extensions.http.original_ip_detection.xff.v3.XffConfig",
               "xff_trusted_cidrs": {"cidrs": [{"address_prefix": str(net.network_address),
                                                "prefix_len": net.prefixlen} for net in edge.trusted_proxies]}}
        settings["original_ip_detection_extensions"] = [{"name": "envoy.extensions.http.original_ip_detection.xff",
                                                         "typed_config": xff}]
    else:
        # The peer's address is the client's: an X-Forwarded-For it sent is not believed.
        settings["use_remote_address"] = True
    return settings


def overload_manager(edge: EdgeConfig) -> dict[str, Any]:
    """The bootstrap's connection cap: the input limits' ``max_connections`` (new connections beyond it are
    closed at once, the gateway answers them 503)."""
    monitor = {"@type": "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3."
                        "DownstreamConnectionsConfig",
               "max_active_downstream_connections": edge.limits.max_connections}
    return {"resource_monitors": [{"name": "envoy.resource_monitors.global_downstream_max_connections",
                                   "typed_config": monitor}]}
