"""gRPC forwarding: KServe v2 ``inference.GRPCInferenceService/*`` calls balanced one by one.

An L4 balancer spreads HTTP/2 *connections*, and a gRPC client keeps one connection for all its calls, so one busy
client would pin one replica. Here every unary call is a request of its own: a generic handler receives it as raw
bytes (identity (de)serializers, no protobuf decoding), the edge guards admit it
(:mod:`fleetserve.gateway.edge.calls`: shedding, JWT from the ``authorization`` metadata, rate limits), and the
forwarding core (:mod:`.core`) carries it over one long-lived channel per replica (:mod:`.channels`) with
everything HTTP requests get: per-replica caps, retries within the retry budget (a call that reached no replica
retried without it), hedging of ``ModelInfer``, and the client's deadline (``grpc-timeout``, else the configured
default) bounding the whole, what is left of it going to the replica as its call's deadline. A replica's
``UNAVAILABLE`` is retried like an HTTP 503; a client that cancels its call cancels the call to the replica.

The bidirectional ``ModelStreamInfer`` is admitted by the same guards and pinned to one replica per stream:
a stream is not a request-sized unit of load, so it is placed by the policy but neither tracked by the
balancer nor retried.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
import grpc.aio

from fleetserve.gateway.balance import Balancer, Endpoint, RequestContext
from fleetserve.gateway.edge.calls import RequestGuards
from fleetserve.gateway.edge.grpc import grpc_status, peer_address
from fleetserve.gateway.edge.identity import Identity, headers_of
from fleetserve.gateway.edge.rejection import Rejection
from fleetserve.gateway.forward.channels import GrpcChannels
from fleetserve.gateway.forward.core import Forwarder, Outcome
from fleetserve.gateway.metrics import NO_BACKEND, GatewayMetrics
from fleetserve.gateway.tracing import ForwardSpans, server_span
from fleetserve.telemetry import otel
from fleetserve.telemetry.access_log import AccessLog
from fleetserve.telemetry.tracing import IdGenerator, next_hop, parse_traceparent, request_id
from fleetserve.wire import (
    GRPC_HTTP_STATUS,
    HTTP_GRPC_STATUS,
    IDENTITY_HEADERS,
    LOAD_REPORT_HEADER,
    RETRY_AFTER,
    TIMEOUT_HEADER,
)

SERVICE_PREFIX = "/inference.GRPCInferenceService/"
STREAM_METHODS = frozenset({SERVICE_PREFIX + "ModelStreamInfer"})
_DROP_METADATA = frozenset({"user-agent", "content-type", "te", "host", "traceparent", "tracestate", "x-request-id",
                            TIMEOUT_HEADER.lower(), *(name.lower() for name in IDENTITY_HEADERS)})
# The gRPC core's words for a call that found no connection: it reached no replica.
_NOT_CONNECTED = "failed to connect to all addresses"
_MAX_HANDLERS = 64

if TYPE_CHECKING:
    from opentelemetry.trace import Span

Metadata = list[tuple[str, str | bytes]]
Reply = tuple[bytes, Any]  # the response message and the replica's trailing metadata


def _load_report(metadata: Any) -> str | None:
    """The ``endpoint-load-metrics`` value among a call's metadata, if any."""
    for key, value in metadata or ():
        if key == LOAD_REPORT_HEADER and isinstance(value, str):
            return value
    return None


class GrpcExchange:
    """One unary call as the forwarding core carries it."""

    __slots__ = ("_channels", "_metadata", "_method", "_request", "_traceparent", "sends")

    def __init__(self, channels: GrpcChannels, method: str, request: bytes, metadata: Metadata,
                 traceparent: str) -> None:
        self._channels = channels
        self._method = method
        self._request = request
        self._metadata = metadata
        self._traceparent = traceparent
        self.sends = 0  # attempts, hedges included, for the access log

    def send(self, ep: Endpoint, timeout_s: float, traceparent: str | None) -> Awaitable[Reply]:
        self.sends += 1
        return self._call(ep, timeout_s, traceparent or self._traceparent)

    async def _call(self, ep: Endpoint, timeout_s: float, traceparent: str) -> Reply:
        call = self._channels.unary(ep, self._method)(self._request, timeout=max(0.001, timeout_s),
                                                      metadata=[*self._metadata, ("traceparent", traceparent)])
        response: bytes = await call
        return response, await call.trailing_metadata()

    def answered(self, ep: Endpoint, reply: Reply) -> Outcome[Reply | grpc.aio.AioRpcError]:
        return Outcome(200, reply, backend=ep.url, verdict=200, report=_load_report(reply[1]))

    def failed(self, ep: Endpoint, error: Exception) -> Outcome[Reply | grpc.aio.AioRpcError]:
        if not isinstance(error, grpc.aio.AioRpcError):
            raise error
        code = error.code()
        details = error.details() or code.name
        report = _load_report(error.trailing_metadata())
        if code is grpc.StatusCode.UNAVAILABLE and details.startswith(_NOT_CONNECTED):
            return Outcome(503, failure=details, backend=ep.url, connect_error=True, retryable=True, sent=False)
        status = GRPC_HTTP_STATUS.get(code.name, 500)
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return Outcome(504, failure=details, backend=ep.url, verdict=504, report=report)
        return Outcome(status, error, failure=details, backend=ep.url, verdict=status,
                       retryable=code is grpc.StatusCode.UNAVAILABLE, report=report)


class GrpcForwarding(grpc.GenericRpcHandler):
    """The generic handler of the gRPC listener (:func:`fleetserve.gateway.edge.listen.start_grpc_server`)."""

    def __init__(self, forwarder: Forwarder, balancer: Balancer, guards: RequestGuards, metrics: GatewayMetrics,
                 channels: GrpcChannels, *, default_timeout_s: float, max_timeout_s: float,
                 ids: IdGenerator | None = None, tracing: otel.Tracing | None = None,
                 access: AccessLog | None = None) -> None:
        self._forwarder = forwarder
        self._balancer = balancer
        self._guards = guards
        self._metrics = metrics
        self._channels = channels
        self._default_timeout_s = default_timeout_s
        self._max_timeout_s = max_timeout_s
        self._ids = ids if ids is not None else IdGenerator()
        self._tracing = tracing
        self._access = access
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method: str = details.method
        if not method.startswith(SERVICE_PREFIX):
            return None
        handler = self._handlers.get(method)
        if handler is None:
            if method in STREAM_METHODS:
                handler = grpc.stream_stream_rpc_method_handler(self._stream_behaviour(method))
            else:
                handler = grpc.unary_unary_rpc_method_handler(self._unary_behaviour(method))
            if len(self._handlers) < _MAX_HANDLERS:
                self._handlers[method] = handler
        return handler

    def _metadata(self, context: grpc.aio.ServicerContext, traced: str | None
                  ) -> tuple[Metadata, dict[str, str], list[str], str, str]:
        """What to send on (request id set, identity stripped), the client's text metadata, its
        ``x-forwarded-for`` values, the request id, and the ``traceparent`` to send: ``traced`` (the call's
        span, when tracing is on), else the next hop of the caller's."""
        incoming = [(k, v) for k, v in (context.invocation_metadata() or ()) if not k.startswith(":")]
        text = {k: v for k, v in incoming if isinstance(v, str)}
        forwarded = [v for k, v in incoming if k == "x-forwarded-for" and isinstance(v, str)]
        rid = request_id(text.get("x-request-id"), self._ids)
        parent = parse_traceparent(text.get("traceparent"))
        metadata: Metadata = [(k, v) for k, v in incoming if k not in _DROP_METADATA and not k.startswith("grpc-")]
        metadata.append(("x-request-id", rid))
        if traced is None:
            traced = next_hop(parent, self._ids).header()
        if parent is not None and "tracestate" in text:
            metadata.append(("tracestate", text["tracestate"]))
        return metadata, text, forwarded, rid, traced

    async def _admit(self, method: str, context: grpc.aio.ServicerContext, traced: str | None = None
                     ) -> tuple[Metadata, dict[str, str], str, str]:
        """Run the guards on a call the in-flight cap let in: its metadata to send, text metadata, id and
        ``traceparent``."""
        metadata, text, forwarded, rid, traceparent = self._metadata(context, traced)
        if not self._guards.checking:
            return metadata, text, rid, traceparent
        admitted = await self._guards.admit(method, text, forwarded, peer_address(context.peer()))
        if isinstance(admitted, Rejection):
            await _refuse(context, admitted)
        if isinstance(admitted, Identity):
            metadata += [(name.lower(), value) for name, value in headers_of(admitted).items()]
        return metadata, text, rid, traceparent

    def _server_span(self, method: str, context: grpc.aio.ServicerContext) -> Span | None:
        assert self._tracing is not None
        carrier = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        if not self._tracing.samples(carrier.get("traceparent")):
            return None
        service, _, name = method[1:].rpartition("/")
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}
        return server_span(self._tracing, method[1:], carrier, attributes)

    def _timeout_s(self, context: grpc.aio.ServicerContext) -> float:
        remaining = context.time_remaining()
        return self._default_timeout_s if remaining is None else min(float(remaining), self._max_timeout_s)

    def _unary_behaviour(self, method: str) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
        async def behaviour(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            rejection = self._guards.enter(method)
            if rejection is not None:
                await _refuse(context, rejection)
            metrics = self._metrics
            metrics.inflight.inc()
            started = time.perf_counter()
            span = None if self._tracing is None else self._server_span(method, context)
            outcome: Outcome[Any] | None = None
            slot = None
            try:
                metadata, text, rid, traceparent = await self._admit(
                    method, context, None if span is None else otel.traceparent(span))
                slot = self._guards.acquire(method)
                if isinstance(slot, Rejection):
                    await _refuse(context, slot)
                ctx = RequestContext("POST", method, len(request), text, rid)
                timeout_s = self._timeout_s(context)
                deadline = self._forwarder.clock() + timeout_s
                exchange = GrpcExchange(self._channels, method, request, metadata, traceparent)
                spans = ForwardSpans.of(self._tracing, span, self._balancer.config.policy, "grpc", method[1:])
                outcome = await self._forwarder.forward(ctx, exchange, deadline, timeout_s, spans)
            finally:
                metrics.inflight.dec()
                if not isinstance(slot, Rejection):
                    self._guards.release(slot, outcome is not None and outcome.status < 400)
                self._guards.leave(method)
                if span is not None:
                    _end_span(span, outcome, context)
            metrics.observe_request(outcome.backend, outcome.status)
            if self._access is not None:
                answered = len(outcome.answer[0]) if isinstance(outcome.answer, tuple) else 0
                self._access.request("POST", method, outcome.status, time.perf_counter() - started,
                                     replica=outcome.backend, attempts=exchange.sends, bytes_in=len(request),
                                     bytes_out=answered)
            return await _reply(context, outcome)

        return behaviour

    def _stream_behaviour(self, method: str) -> Callable[[AsyncIterator[bytes], grpc.aio.ServicerContext],
                                                         AsyncIterator[bytes]]:
        async def behaviour(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
                            ) -> AsyncIterator[bytes]:
            rejection = self._guards.enter(method)
            if rejection is not None:
                await _refuse(context, rejection)
            try:
                metadata, text, rid, traceparent = await self._admit(method, context)
                metadata.append(("traceparent", traceparent))
                ep = self._balancer.pick(RequestContext("POST", method, 0, text, rid))
                if ep is None:
                    self._metrics.observe_request(NO_BACKEND, 503)
                    await _abort(context, grpc.StatusCode.UNAVAILABLE, "no healthy replica is available")
                call = self._channels.channel(ep).stream_stream(method)(requests, metadata=metadata,
                                                                        timeout=context.time_remaining())
                try:
                    async for reply in call:
                        yield reply
                except grpc.aio.AioRpcError as err:
                    self._metrics.observe_request(ep.url, GRPC_HTTP_STATUS.get(err.code().name, 500))
                    await _abort(context, err.code(), err.details() or "")
                self._metrics.observe_request(ep.url, 200)
            finally:
                self._guards.leave(method)

        return behaviour


def _end_span(span: Span, outcome: Outcome[Reply | grpc.aio.AioRpcError] | None,
              context: grpc.aio.ServicerContext) -> None:
    """End a call's span with the status its client gets: ``outcome``'s; without one, the code the call was
    aborted with (a guard refused it), else CANCELLED (the client went away)."""
    if outcome is None:
        code = context.code() or grpc.StatusCode.CANCELLED
        status = GRPC_HTTP_STATUS.get(code.name, 499)
    else:
        status = outcome.status
        if isinstance(outcome.answer, tuple):
            code = grpc.StatusCode.OK
        elif outcome.answer is not None:
            code = outcome.answer.code()
        else:
            code = grpc.StatusCode[HTTP_GRPC_STATUS.get(outcome.status, "UNKNOWN")]
    otel.end_server_span(span, status, grpc_code=int(code.value[0]))


async def _reply(context: grpc.aio.ServicerContext, outcome: Outcome[Reply | grpc.aio.AioRpcError]) -> bytes:
    """Give the client what the outcome says: the replica's answer or error, else the gateway's own status."""
    answer = outcome.answer
    if isinstance(answer, tuple):
        response, trailing = answer
        context.set_trailing_metadata(tuple(trailing or ()))
        return response
    if answer is not None:
        await _abort(context, answer.code(), answer.details() or "", answer.trailing_metadata() or ())
    trailer = () if outcome.retry_after is None else ((RETRY_AFTER.lower(), outcome.retry_after),)
    code = grpc.StatusCode[HTTP_GRPC_STATUS.get(outcome.status, "UNKNOWN")]
    await _abort(context, code, outcome.failure, trailer)


async def _refuse(context: grpc.aio.ServicerContext, rejection: Rejection) -> NoReturn:
    code, trailer = grpc_status(rejection)
    await _abort(context, grpc.StatusCode[code], rejection.message, trailer)


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str,
                 trailing: Iterable[tuple[str, str | bytes]] = ()) -> NoReturn:
    await context.abort(code, details, tuple(trailing))
    raise AssertionError("grpc.aio ServicerContext.abort() returned instead of raising")
