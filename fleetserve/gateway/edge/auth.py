"""Bearer-token (JWT) authentication and per-route scope checks for the gateway.

The answers follow RFC 6750 §3: a request without a bearer token gets 401 with a bare
``WWW-Authenticate: Bearer`` challenge; a token that fails verification gets 401 with
``error="invalid_token"`` and an ``error_description`` naming the cause (expired, wrong audience,
bad signature, unknown key, malformed...); a valid token lacking a scope or claim a route requires
gets 403 with ``error="insufficient_scope"``. Every route prefix in ``route_scopes`` that matches
the path applies. The verified identity is stored at ``request[IDENTITY_KEY]`` for the rate limiter
and the proxy (see :mod:`.identity`). Paths in ``exempt_paths`` (probes, metrics) are not checked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from aiohttp import web
from aiohttp.typedefs import Handler

from fleetserve.gateway.edge.identity import IDENTITY_KEY, Identity
from fleetserve.gateway.edge.jwtconfig import JwtConfig, RouteScope
from fleetserve.gateway.edge.keyset import JwksFetcher, KeySet, fetch_jwks
from fleetserve.gateway.edge.metrics import NullObserver, RejectionObserver
from fleetserve.gateway.edge.rejection import Rejection
from fleetserve.gateway.edge.tokens import AuthError, TokenVerifier

# RFC 6750 §3: error_description and scope are quoted-strings limited to these characters.
_QUOTABLE = frozenset(chr(c) for c in range(0x20, 0x7F)) - {'"', "\\"}


def _quoted(text: str) -> str:
    return "".join(ch if ch in _QUOTABLE else "?" for ch in text[:200])


def challenge(error: str | None = None, description: str | None = None, scope: str | None = None) -> str:
    """A ``WWW-Authenticate`` value for the Bearer scheme."""
    params = []
    if error is not None:
        params.append(f'error="{error}"')
    if scope is not None:
        params.append(f'scope="{_quoted(scope)}"')
    if description is not None:
        params.append(f'error_description="{_quoted(description)}"')
    return "Bearer " + ", ".join(params) if params else "Bearer"


def missing_grants(identity: Identity, routes: Sequence[RouteScope]) -> tuple[list[str], list[str]]:
    """Scopes and claims the matching routes require that ``identity`` lacks."""
    scopes = [s for route in routes for s in route.scopes if s not in identity.scopes]
    claims = [name for route in routes for name, value in route.claims if identity.claims.get(name) != value]
    return scopes, claims


class JwtAuthMiddleware:
    """Authenticates every request outside ``exempt_paths`` with a bearer JWT."""

    __middleware_version__ = 1

    def __init__(
        self,
        config: JwtConfig,
        verifier: TokenVerifier,
        exempt_paths: Sequence[str] = (),
        observer: RejectionObserver | None = None,
    ) -> None:
        self.verifier = verifier
        self._routes = config.route_scopes
        self.exempt = frozenset(exempt_paths)
        self._observer = observer or NullObserver()

    @classmethod
    def create(
        cls,
        config: JwtConfig,
        exempt_paths: Sequence[str] = (),
        observer: RejectionObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        fetch: JwksFetcher = fetch_jwks,
    ) -> JwtAuthMiddleware:
        """Loads the configured key files (ValueError if one is unusable) and builds the middleware."""
        keys = KeySet.from_config(config, fetch=fetch, clock=clock)
        return cls(config, TokenVerifier(config, keys, wall_clock), exempt_paths, observer)

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in self.exempt:
            return await handler(request)
        result = await self.authenticate(path, request.headers.get("Authorization"))
        if isinstance(result, Rejection):
            return result.response()
        request[IDENTITY_KEY] = result
        return await handler(request)

    async def authenticate(self, path: str, authorization: str | None) -> Identity | Rejection:
        """The verified caller of a request to ``path`` with this ``Authorization`` value, or why not."""
        if authorization is None:
            return self._unauthorized("missing_token", "missing bearer token (Authorization: Bearer ...)")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return self._unauthorized("missing_token", "the Authorization scheme must be Bearer")
        token = token.strip()
        if not token:
            return self._unauthorized("invalid_token", "empty bearer token")
        try:
            identity = await self.verifier.verify(token)
        except AuthError as exc:
            return self._unauthorized("invalid_token", str(exc))
        routes = [r for r in self._routes if path.startswith(r.prefix)]
        if routes:
            scopes, claims = missing_grants(identity, routes)
            if scopes or claims:
                return self._forbidden(scopes, claims)
        return identity

    def _unauthorized(self, reason: str, description: str) -> Rejection:
        self._observer.rejected(reason)
        header = challenge() if reason == "missing_token" else challenge("invalid_token", description)
        return Rejection(401, reason, description, {"WWW-Authenticate": header})

    def _forbidden(self, scopes: list[str], claims: list[str]) -> Rejection:
        self._observer.rejected("insufficient_scope")
        parts = []
        if scopes:
            parts.append(f"scope {' '.join(scopes)}")
        if claims:
            parts.append(f"claim {', '.join(claims)}")
        description = f"token lacks required {' and '.join(parts)}"
        header = challenge("insufficient_scope", description, " ".join(scopes) if scopes else None)
        return Rejection(403, "insufficient_scope", description, {"WWW-Authenticate": header})
