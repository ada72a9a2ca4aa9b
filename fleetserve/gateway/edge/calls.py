"""The edge guards applied one request at a time, outside any web framework: the same shedding cap, JWT
verification, rate limits and adaptive concurrency limit as the aiohttp middlewares, for the listeners that
are not aiohttp (the gRPC listener, :mod:`.grpc`; the Granian front, :mod:`fleetserve.gateway.forward.rsgi`).

The guards are the very objects behind the HTTP middlewares (:class:`~.guards.EdgeGuards`), so the gateway
has one in-flight count, one token cache, one set of rate-limit buckets and one adaptive limit whichever
listener a request came through. A request's path (for gRPC its method, ``/inference.GRPCInferenceService/
ModelInfer``) is what route scopes, rate-limit prefixes and ``exempt_paths`` match.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from aiohttp.typedefs import Middleware

from fleetserve.gateway.edge.adaptive import Token
from fleetserve.gateway.edge.adaptive_guard import AdaptiveConcurrencyMiddleware
from fleetserve.gateway.edge.identity import Identity
from fleetserve.gateway.edge.ratelimit import RateLimitMiddleware
from fleetserve.gateway.edge.rejection import Rejection
from fleetserve.gateway.edge.shed import LoadShedMiddleware

if TYPE_CHECKING:
    from fleetserve.gateway.edge.auth import JwtAuthMiddleware


class RequestGuards:
    """The configured guards, applied to one call at a time: :meth:`enter`, then :meth:`admit`, then for a
    unary call :meth:`acquire`; :meth:`release` what ``acquire`` gave, and :meth:`leave` once the call is over
    whenever ``enter`` let it in."""

    def __init__(self, middlewares: Sequence[Middleware]) -> None:
        self._shed = next((m for m in middlewares if isinstance(m, LoadShedMiddleware)), None)
        # The auth module (PyJWT, cryptography) is imported only when JWT is configured (:mod:`.stack`).
        auth = sys.modules.get("fleetserve.gateway.edge.auth")
        self._auth: JwtAuthMiddleware | None = None if auth is None else next(
            (m for m in middlewares if isinstance(m, auth.JwtAuthMiddleware)), None)
        self._rate = next((m for m in middlewares if isinstance(m, RateLimitMiddleware)), None)
        self._adaptive = next((m for m in middlewares if isinstance(m, AdaptiveConcurrencyMiddleware)), None)

    @property
    def checking(self) -> bool:
        """Whether :meth:`admit` has anything to check (JWT or rate limits configured)."""
        return self._auth is not None or self._rate is not None

    def enter(self, method: str) -> Rejection | None:
        """Count the call against the gateway's in-flight cap, or refuse it there."""
        shed = self._shed
        if shed is None or method in shed.exempt:
            return None
        return shed.enter()

    def leave(self, method: str) -> None:
        shed = self._shed
        if shed is not None and method not in shed.exempt:
            shed.leave()

    async def admit(self, method: str, metadata: Mapping[str, str], forwarded: Sequence[str],
                    address: str | None) -> Identity | Rejection | None:
        """The verified caller (None: anonymous), or the refusal of the first guard that says no.

        ``metadata`` is the request's text headers or metadata (lowercase keys), ``forwarded`` its
        ``x-forwarded-for`` values, ``address`` the peer's IP address (``[v6]:port`` and ``v4:port`` forms too).
        """
        identity: Identity | None = None
        auth = self._auth
        if auth is not None and method not in auth.exempt:
            result = await auth.authenticate(method, metadata.get("authorization"))
            if isinstance(result, Rejection):
                return result
            identity = result
        rate = self._rate
        if rate is not None and method not in rate.exempt:
            client = rate.client_address
            rejection = rate.admit(method, identity, lambda: client.resolve(address, forwarded))
            if rejection is not None:
                return rejection
        return identity

    def acquire(self, method: str) -> Token | Rejection | None:
        """A slot under the adaptive concurrency limit (None: no limit applies to this call), or its refusal."""
        adaptive = self._adaptive
        if adaptive is None or method in adaptive.exempt:
            return None
        return adaptive.acquire()

    def release(self, slot: Token | None, ok: bool) -> None:
        """Give back what :meth:`acquire` gave; ``ok``: the call was answered below 400 (a latency sample)."""
        if slot is not None:
            assert self._adaptive is not None
            self._adaptive.release(slot, ok)
