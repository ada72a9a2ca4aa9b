"""The headers an HTTP request carries to a replica: the client's, less hop-by-hop ones (RFC 9110 §7.6.1) and
those the gateway sets itself, plus W3C trace context (continued or started), ``X-Request-ID``, the verified
caller (``X-Fleetserve-Subject`` / ``-Tenant``, only from the auth guard) and ``X-Forwarded-For``. The
remaining deadline (``X-Fleetserve-Timeout-Ms``) and ``traceparent`` (the attempt's span, when traced) are
added per attempt."""

from __future__ import annotations

from collections.abc import Mapping

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


def _connection_tokens(value: str) -> frozenset[str]:
    return frozenset(token.strip().lower() for token in value.split(","))


def forward_headers(incoming: Mapping[str, str], rid: str, ids: IdGenerator, traced: str | None,
                    identity: Mapping[str, str], peer: str | None) -> tuple[list[tuple[str, str]], str]:
    """The headers to send on for a request with headers ``incoming`` (looked up by lowercase name), request
    id ``rid``, verified caller ``identity`` (its headers; empty when anonymous) and client address ``peer``,
    and the ``traceparent`` to send with them: ``traced`` (the request's span, when tracing is on), else the
    next hop of the caller's."""
    connection = incoming.get("connection")
    drop = DROP_REQUEST | _connection_tokens(connection) if connection else DROP_REQUEST
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
    headers.extend(identity.items())
    if peer:
        prior = incoming.get("x-forwarded-for")
        headers.append(("X-Forwarded-For", f"{prior}, {peer}" if prior else peer))
    return headers, traced
