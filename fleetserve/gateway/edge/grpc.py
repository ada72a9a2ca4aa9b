"""The edge guards on the gRPC listener (:class:`~.calls.RequestGuards`, the same objects as the HTTP
middlewares): the gRPC side of them. The adaptive limit applies to unary calls, as it applies to HTTP requests;
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

from fleetserve.gateway.edge.clientip import parse_ip
from fleetserve.gateway.edge.rejection import Rejection
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
