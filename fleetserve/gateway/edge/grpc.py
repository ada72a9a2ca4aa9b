"""The edge guards on the gRPC listener: the same shedding cap, JWT verification, rate limits and adaptive
concurrency limit as HTTP.

The guards are the very objects behind the HTTP middlewares (:class:`~.guards.EdgeGuards`), so the gateway
has one in-flight count, one token cache, one set of rate-limit buckets and one adaptive limit whichever
listener a request came through. The adaptive limit applies to unary calls, as it applies to HTTP requests;
a ``ModelStreamInfer`` stream is not limited by it (a stream's lifetime is the client's, not a latency
sample, and its requests are pinned to one replica). A call's path is its method
(``/inference.GRPCInferenceService/ModelInfer``), which route scopes, rate-limit prefixes and ``exempt_paths``
match like any HTTP path; the bearer token comes from the ``authorization`` metadata, the client address from
the peer (and ``x-forwarded-for`` from trusted proxies). A refusal becomes the gRPC status of its HTTP one
(``wire.HTTP_GRPC_STATUS``: 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 429 RESOURCE_EXHAUSTED, 503
UNAVAILABLE), its headers (``retry-after``, ``ratelimit-*``, ``www-authenticate``) trailing metadata. Message
sizes are bounded by the gRPC server itself (:mod:`.listen`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aiohttp.typedefs import Middleware

from fleetserve.gateway.edge.adaptive import Token
from fleetserve.gateway.edge.adaptive_guard import AdaptiveConcurrencyMiddleware
from fleetserve.gateway.edge.auth import JwtAuthMiddleware
from fleetserve.gateway.edge.clientip import parse_ip
from fleetserve.gateway.edge.identity import Identity
from fleetserve.gateway.edge.ratelimit import RateLimitMiddleware
from fleetserve.gateway.edge.rejection import Rejection
from fleetserve.gateway.edge.shed import LoadShedMiddleware
from fleetserve.wire import HTTP_GRPC_STATUS


def peer_address(peer: str | None) -> str | None:
    """The IP address in a gRPC peer string (``ipv4:10.0.0.5:41234``, ``ipv6:[::1]:41234``), else the string."""
    if not peer:
        return None
    kind, _, address = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    parsed = parse_ip(address)
    return peer if parsed is None else str(parsed)


def grpc_status(rejection: Rejection) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The gRPC status code name and trailing metadata of a refusal."""
    trailer = tuple((name.lower(), value) for name, value in (rejection.headers or {}).items())
    return HTTP_GRPC_STATUS.get(rejection.status, "UNKNOWN"), trailer


class GrpcGuards:
    """The configured guards, applied to one call at a time: :meth:`enter`, then :meth:`admit`, then for a
    unary call :meth:`acquire`; :meth:`release` what ``acquire`` gave, and :meth:`leave` once the call is over
    whenever ``enter`` let it in."""

    def __init__(self, middlewares: Sequence[Middleware]) -> None:
        self._shed = next((m for m in middlewares if isinstance(m, LoadShedMiddleware)), None)
        self._auth = next((m for m in middlewares if isinstance(m, JwtAuthMiddleware)), None)
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
                    peer: str | None) -> Identity | Rejection | None:
        """The verified caller (None: anonymous), or the refusal of the first guard that says no.

        ``metadata`` is the call's text metadata (lowercase keys), ``forwarded`` its ``x-forwarded-for``
        values, ``peer`` the gRPC peer string (``context.peer()``).
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
            rejection = rate.admit(method, identity, lambda: client.resolve(peer_address(peer), forwarded))
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
