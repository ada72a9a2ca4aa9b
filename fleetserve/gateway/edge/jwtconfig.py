"""Validated configuration of JWT bearer authentication (the ``edge.jwt`` section).

Algorithms are allowed per key, never globally: an HMAC secret can only be configured as a
``secret_file`` and allows only HS*, and a PEM key never allows HS*; so the classic confusions (alg
``none``, an HS256 token "signed" with an RSA public key) cannot be configured, let alone accepted
(RFC 8725 §2.1 and §3.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from fleetserve.gateway.edge._mapping import Section

HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")
ASYMMETRIC_ALGORITHMS = (
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA",
)  # fmt: skip
SUPPORTED_ALGORITHMS = HMAC_ALGORITHMS + ASYMMETRIC_ALGORITHMS

KeySource = Literal["pem", "jwks_file", "jwks_url", "secret_file"]
KEY_SOURCES: tuple[KeySource, ...] = ("pem", "jwks_file", "jwks_url", "secret_file")


@dataclass(frozen=True)
class KeySpec:
    """Where one key (or key set) comes from and which algorithms it may verify.

    ``kid`` names a ``pem`` or ``secret_file`` key so tokens can select it; JWKS keys carry their own.
    """

    source: KeySource
    location: str
    algorithms: tuple[str, ...]
    kid: str | None = None

    def __post_init__(self) -> None:
        if self.source not in KEY_SOURCES:
            raise ValueError(f"key source must be one of {', '.join(KEY_SOURCES)}, got {self.source!r}")
        if not isinstance(self.location, str) or not self.location:
            raise ValueError(f"{self.source} must name a file or URL")
        object.__setattr__(self, "algorithms", tuple(self.algorithms))
        if not self.algorithms:
            raise ValueError("algorithms must list at least one algorithm (there is no default)")
        for alg in self.algorithms:
            if alg not in SUPPORTED_ALGORITHMS:
                raise ValueError(f"algorithm {alg!r} is not supported; use {', '.join(SUPPORTED_ALGORITHMS)}")
        hmac = [a for a in self.algorithms if a in HMAC_ALGORITHMS]
        if self.source == "secret_file" and len(hmac) != len(self.algorithms):
            raise ValueError("a secret_file (HMAC secret) allows only HS256/HS384/HS512")
        if self.source != "secret_file" and hmac:
            raise ValueError(f"{', '.join(hmac)} need a secret_file; a {self.source} key is asymmetric")
        if self.kid is not None and self.source not in ("pem", "secret_file"):
            raise ValueError("kid applies to pem and secret_file keys; JWKS keys carry their own kid")
        if self.source == "jwks_url":
            url = urlsplit(self.location)
            if url.scheme not in ("http", "https") or not url.netloc:
                raise ValueError(f"jwks_url must be an http(s) URL, got {self.location!r}")

    @classmethod
    def from_section(cls, s: Section) -> KeySpec:
        given = [src for src in KEY_SOURCES if s.has(src)]
        if len(given) != 1:
            raise ValueError(f"{s.path} must set exactly one of {', '.join(KEY_SOURCES)}, got {given or 'none'}")
        source = given[0]
        if not s.has("algorithms"):
            raise ValueError(f"{s.where('algorithms')} is required (the per-key algorithm allow-list)")
        for other in KEY_SOURCES:
            if other != source:
                s.optional_string(other)
        return s.build(
            cls,
            source=source,
            location=s.string(source, ""),
            algorithms=s.strings("algorithms", ()),
            kid=s.optional_string("kid"),
        )


@dataclass(frozen=True)
class RouteScope:
    """Paths starting with ``prefix`` need every scope in ``scopes`` and every ``claims`` value (403)."""

    prefix: str
    scopes: tuple[str, ...] = ()
    claims: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not self.prefix.startswith("/"):
            raise ValueError(f"prefix must be a path starting with '/', got {self.prefix!r}")
        object.__setattr__(self, "scopes", tuple(self.scopes))
        object.__setattr__(self, "claims", tuple(self.claims))
        if not self.scopes and not self.claims:
            raise ValueError(f"route {self.prefix} must require at least one scope or claim")

    @classmethod
    def from_section(cls, s: Section) -> RouteScope:
        return s.build(
            cls, prefix=s.string("prefix", ""), scopes=s.strings("scopes", ()), claims=s.string_map("claims")
        )


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class JwtConfig:
    """Bearer-token authentication.

    - ``issuers`` / ``audiences``: accepted ``iss`` / ``aud`` values (empty: not checked).
    - ``leeway_s``: clock skew tolerated on ``exp``, ``nbf`` and ``iat``.
    - ``required_claims``: claims a token must carry; ``exp``/``nbf``/``iat`` are validated when
      present either way, and the subject claim is always required.
    - ``subject_claim`` / ``tenant_claim`` / ``scope_claim``: where the identity is read from; scopes
      are a space-separated string or a list of strings.
    - ``cache_size`` / ``cache_max_ttl_s``: verified tokens are remembered (until their ``exp``, at most
      ``cache_max_ttl_s``) so signatures are not checked on every request.
    - ``jwks_refresh_interval_s``: age after which a JWKS URL is fetched again;
      ``jwks_min_refresh_interval_s``: least time between two fetches, also when a token names an
      unknown ``kid`` (so unknown kids cannot be used to hammer the key server).
    """

    keys: tuple[KeySpec, ...]
    issuers: tuple[str, ...] = ()
    audiences: tuple[str, ...] = ()
    leeway_s: float = 60.0
    required_claims: tuple[str, ...] = ("exp", "iat")
    subject_claim: str = "sub"
    tenant_claim: str | None = None
    scope_claim: str = "scope"
    route_scopes: tuple[RouteScope, ...] = ()
    cache_size: int = 10_000
    cache_max_ttl_s: float = 300.0
    jwks_refresh_interval_s: float = 300.0
    jwks_min_refresh_interval_s: float = 30.0
    jwks_fetch_timeout_s: float = 5.0
    max_token_bytes: int = 8192

    def __post_init__(self) -> None:
        for name in ("keys", "issuers", "audiences", "required_claims", "route_scopes"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.keys:
            raise ValueError("keys must list at least one key source")
        if (
            isinstance(self.leeway_s, bool)
            or not isinstance(self.leeway_s, int | float)
            or not (0 <= self.leeway_s < math.inf)
        ):
            raise ValueError(f"leeway_s must be a finite number >= 0, got {self.leeway_s!r}")
        for name in ("cache_max_ttl_s", "jwks_refresh_interval_s", "jwks_min_refresh_interval_s"):
            _positive(name, getattr(self, name))
        _positive("jwks_fetch_timeout_s", self.jwks_fetch_timeout_s)
        for name in ("cache_size", "max_token_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("subject_claim", "scope_claim"):
            if not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty claim name")
        if self.tenant_claim == "":
            raise ValueError("tenant_claim must be a claim name or unset")

    @classmethod
    def from_section(cls, s: Section) -> JwtConfig:
        d = cls  # dataclass defaults are class attributes
        return s.build(
            cls,
            keys=tuple(KeySpec.from_section(k) for k in s.sections("keys")),
            issuers=s.strings("issuers", ()),
            audiences=s.strings("audiences", ()),
            leeway_s=s.number("leeway_s", d.leeway_s),
            required_claims=s.strings("required_claims", d.required_claims),
            subject_claim=s.string("subject_claim", d.subject_claim),
            tenant_claim=s.optional_string("tenant_claim"),
            scope_claim=s.string("scope_claim", d.scope_claim),
            route_scopes=tuple(RouteScope.from_section(r) for r in s.sections("route_scopes")),
            cache_size=s.integer("cache_size", d.cache_size),
            cache_max_ttl_s=s.number("cache_max_ttl_s", d.cache_max_ttl_s),
            jwks_refresh_interval_s=s.number("jwks_refresh_interval_s", d.jwks_refresh_interval_s),
            jwks_min_refresh_interval_s=s.number("jwks_min_refresh_interval_s", d.jwks_min_refresh_interval_s),
            jwks_fetch_timeout_s=s.number("jwks_fetch_timeout_s", d.jwks_fetch_timeout_s),
            max_token_bytes=s.integer("max_token_bytes", d.max_token_bytes),
        )
