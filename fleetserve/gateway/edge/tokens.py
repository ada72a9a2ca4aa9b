"""JWT verification (RFC 7519 with the RFC 8725 hardening) and the cache of verified tokens.

:class:`TokenVerifier` checks, in order: size and shape, the header's ``alg`` (``none`` and
unsupported ones refused outright), a key that allows that ``alg`` (see :mod:`.keyset`), the
signature, issuer, audience and required claims (PyJWT), and the time claims ``exp``/``nbf``/``iat``
against an injected wall clock with ``leeway_s``. Every failure is an :class:`AuthError` whose text
names the cause.

Verified tokens are kept in :class:`TokenCache`, an LRU keyed by the raw token string, each entry
expiring when the token does (at most ``cache_max_ttl_s`` later, so a key removed from a JWK Set
stops working within that time): a client reusing its token pays one signature check, not one per
request. Only successes are cached, so a cache hit is exactly as strong as a fresh verification.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import jwt

from fleetserve.gateway.edge.identity import Identity
from fleetserve.gateway.edge.jwtconfig import SUPPORTED_ALGORITHMS, JwtConfig
from fleetserve.gateway.edge.keys import VerificationKey
from fleetserve.gateway.edge.keyset import KeyLookupError, KeySet

_MAX_KID_CHARS = 256


class AuthError(Exception):
    """The token is not acceptable; ``str(exc)`` says why, in words fit for the client."""


class TokenCache:
    """Verified identities by raw token, least recently used first, each with an expiry time."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[Identity, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, token: str, now: float) -> Identity | None:
        entry = self._entries.get(token)
        if entry is None:
            return None
        if now > entry[1]:
            del self._entries[token]
            return None
        self._entries.move_to_end(token)
        return entry[0]

    def put(self, token: str, identity: Identity, expires_at: float) -> None:
        self._entries[token] = (identity, expires_at)
        self._entries.move_to_end(token)
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


def _number(claims: Mapping[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AuthError(f"claim '{name}' must be a number (seconds since the epoch)")
    return float(value)


class TokenVerifier:
    """Turns a raw bearer token into an :class:`Identity` or an :class:`AuthError`."""

    def __init__(self, config: JwtConfig, keys: KeySet, wall_clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._keys = keys
        self._now = wall_clock
        self.cache = TokenCache(config.cache_size)
        required = set(config.required_claims) | {config.subject_claim}
        if config.issuers:
            required.add("iss")
        if config.audiences:
            required.add("aud")
        self._options: dict[str, Any] = {
            "verify_signature": True,
            "verify_exp": False,  # time claims are checked below, against the injected clock
            "verify_nbf": False,
            "verify_iat": False,
            "verify_iss": bool(config.issuers),
            "verify_aud": bool(config.audiences),
            "require": sorted(required),
        }
        self._issuers = list(config.issuers) or None
        self._audiences = list(config.audiences) or None

    async def verify(self, token: str) -> Identity:
        now = self._now()
        cached = self.cache.get(token, now)
        if cached is not None:
            return cached
        config = self._config
        if len(token) > config.max_token_bytes:
            raise AuthError(f"token is longer than {config.max_token_bytes} bytes")
        alg, kid = self._header(token)
        try:
            keys = await self._keys.select(kid, alg)
        except KeyLookupError as exc:
            raise AuthError(str(exc)) from None
        claims = self._decode(token, alg, keys)
        exp = self._check_times(claims, now)
        identity = self._identity(claims)
        expires_at = now + config.cache_max_ttl_s
        if exp is not None:
            expires_at = min(expires_at, exp + config.leeway_s)
        self.cache.put(token, identity, expires_at)
        return identity

    @staticmethod
    def _header(token: str) -> tuple[str, str | None]:
        try:
            header = jwt.get_unverified_header(token)
        except Exception:  # hostile input: whatever the parser raises is the client's fault, never a 500
            raise AuthError("malformed token") from None
        alg = header.get("alg")
        if not isinstance(alg, str):
            raise AuthError("malformed token: header has no 'alg'")
        if alg.lower() == "none":
            raise AuthError("unsigned tokens (alg none) are not accepted")
        if alg not in SUPPORTED_ALGORITHMS:
            raise AuthError(f"unsupported algorithm {alg[:32]!r}")
        kid = header.get("kid")
        if kid is not None and (not isinstance(kid, str) or len(kid) > _MAX_KID_CHARS):
            raise AuthError("malformed token: 'kid' must be a short string")
        return alg, kid

    def _decode(self, token: str, alg: str, keys: list[VerificationKey]) -> dict[str, Any]:
        for key in keys:
            try:
                return jwt.decode(
                    token,
                    key=key.key,
                    algorithms=[alg],
                    options=self._options,  # type: ignore[arg-type]
                    audience=self._audiences,
                    issuer=self._issuers,
                )
            except jwt.InvalidSignatureError:
                continue
            except jwt.MissingRequiredClaimError as exc:
                raise AuthError(f"token lacks the required claim '{exc.claim}'") from None
            except jwt.InvalidAudienceError:
                raise AuthError("wrong audience") from None
            except jwt.InvalidIssuerError:
                raise AuthError("wrong issuer") from None
            except jwt.DecodeError:
                raise AuthError("malformed token") from None
            except jwt.PyJWTError as exc:
                raise AuthError(f"invalid token: {exc}") from None
            except Exception:  # hostile input: whatever the parser raises is the client's fault, never a 500
                raise AuthError("malformed token") from None
        raise AuthError("bad signature")

    def _check_times(self, claims: Mapping[str, Any], now: float) -> float | None:
        leeway = self._config.leeway_s
        exp = _number(claims, "exp")
        if exp is not None and now > exp + leeway:
            raise AuthError("token expired")
        nbf = _number(claims, "nbf")
        if nbf is not None and now + leeway < nbf:
            raise AuthError("token not yet valid (nbf)")
        iat = _number(claims, "iat")
        if iat is not None and now + leeway < iat:
            raise AuthError("token issued in the future (iat)")
        return exp

    def _identity(self, claims: dict[str, Any]) -> Identity:
        config = self._config
        subject = claims.get(config.subject_claim)
        if not isinstance(subject, str) or not subject:
            raise AuthError(f"claim '{config.subject_claim}' must be a non-empty string")
        tenant = None
        if config.tenant_claim is not None:
            tenant = claims.get(config.tenant_claim)
            if tenant is not None and not isinstance(tenant, str):
                raise AuthError(f"claim '{config.tenant_claim}' must be a string")
        raw_scopes = claims.get(config.scope_claim)
        if raw_scopes is None:
            scopes: frozenset[str] = frozenset()
        elif isinstance(raw_scopes, str):
            scopes = frozenset(raw_scopes.split())
        elif isinstance(raw_scopes, list) and all(isinstance(s, str) for s in raw_scopes):
            scopes = frozenset(raw_scopes)
        else:
            raise AuthError(f"claim '{config.scope_claim}' must be a string or a list of strings")
        return Identity(subject, tenant, scopes, MappingProxyType(claims))
