"""The headers an HTTP request carries to a replica: the client's, less hop-by-hop ones (RFC 9110 §7.6.1) and
those the gateway sets itself, plus W3C trace context (continued or started), ``X-Request-ID``, the verified
caller (``X-Fleetserve-Subject`` / ``-Tenant``, only from the auth guard) and ``X-Forwarded-For``. The
remaining deadline (``X-Fleetserve-Timeout-Ms``) and ``traceparent`` (the attempt's span, when traced) are
added per attempt."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from fleetserve.gateway.edge import identity_headers
from fleetserve.telemetry import logs
from fleetserve.telemetry.tracing import IdGenerator, next_hop, parse_traceparent
from fleetserve.wire import IDENTITY_HEADERS, REQUEST_ID_HEADER, TIMEOUT_HEADER

_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "transfer-encoding", "upgrade", "host", "content-length", "expect",
})
_SET_HERE = frozenset({"traceparent", "tracestate", "x-request-id", "x-forwarded-for", TIMEOUT_HEADER.lower(),
                       *(name.lower() for name in IDENTITY_HEADERS)})
DROP_REQUEST = _HOP_BY_HOP | _SET_HERE
DROP_RESPONSE = _HOP_BY_HOP | {"x-request-id"}


def _connection_tokens(headers: Mapping[str, str]) -> frozenset[str]:
    value = headers.get("Connection")
    if not value:
        return frozenset()
    return frozenset(token.strip().lower() for token in value.split(","))


def forward_headers(request: web.Request, rid: str, ids: IdGenerator,
                    traced: str | None = None) -> tuple[list[tuple[str, str]], str]:
    """The headers to send on for ``request`` (whose request id is ``rid``), and the ``traceparent`` to send
    with them: ``traced`` (the request's span, when tracing is on), else the next hop of the caller's."""
    incoming = request.headers
    drop = DROP_REQUEST | _connection_tokens(incoming) if "Connection" in incoming else DROP_REQUEST
    headers = [(k, v) for k, v in incoming.items() if k.lower() not in drop]
    parent = parse_traceparent(incoming.get("traceparent"))
    if traced is None:
        hop = next_hop(parent, ids)
        logs.trace_id_var.set(hop.trace_id)  # this request's log lines carry its trace id
        traced = hop.header()
    state = incoming.get("tracestate")
    if parent is not None and state:
        headers.append(("tracestate", state))
    headers.append((REQUEST_ID_HEADER, rid))
    headers.extend(identity_headers(request).items())
    peer = request.remote
    if peer:
        prior = incoming.get("X-Forwarded-For")
        headers.append(("X-Forwarded-For", f"{prior}, {peer}" if prior else peer))
    return headers, traced
