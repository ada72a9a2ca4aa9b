"""Per-request balancing of KServe v2 gRPC (``inference.GRPCInferenceService/*``) across replicas.

An L4 balancer spreads HTTP/2 *connections*, and a gRPC client keeps one connection for all its
calls, so one busy client would pin one replica. Here every call is balanced by the same
:class:`Balancer` as HTTP traffic: a generic handler receives each call as raw bytes (no protobuf
decoding; identity (de)serializers), picks a replica, and forwards the bytes over one long-lived
channel per replica. Unary methods are forwarded call by call; the bidirectional
``ModelStreamInfer`` is pinned to one replica per stream.

A call failing with UNAVAILABLE (replica down or overloaded) is retried once on another replica
within the retry budget, as over HTTP. A replica's gRPC address is its endpoint label
``grpc_port`` if present, else its HTTP port + ``backend_grpc_port_offset`` (8000 -> 8001).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, NoReturn

import grpc
import grpc.aio

from fleetserve.gateway.balance import Balancer, RequestContext
from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.config import GatewayConfig
from fleetserve.gateway.metrics import NO_BACKEND, GatewayMetrics
from fleetserve.telemetry.tracing import IdGenerator, next_hop, parse_traceparent, request_id
from fleetserve.wire import LOAD_REPORT_HEADER

SERVICE_PREFIX = "/inference.GRPCInferenceService/"
STREAM_METHODS = frozenset({SERVICE_PREFIX + "ModelStreamInfer"})
# The HTTP status each gRPC code corresponds to, so the balancer and the metrics see one vocabulary.
HTTP_STATUS = {
    grpc.StatusCode.OK: 200, grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409, grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400, grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499, grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
_DROP_METADATA = frozenset({"user-agent", "content-type", "te", "host", "traceparent", "tracestate",
                            "x-request-id"})
# Reconnect to a restarted replica within a second (gRPC's default backoff grows to two minutes).
_CHANNEL_OPTIONS = [("grpc.max_reconnect_backoff_ms", 1000), ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.enable_retries", 0)]

Metadata = list[tuple[str, str | bytes]]


def grpc_target(ep: Endpoint, port_offset: int) -> str:
    port = int(ep.labels.get("grpc_port", ep.port + port_offset))
    host = f"[{ep.host}]" if ":" in ep.host else ep.host
    return f"{host}:{port}"


class GrpcProxy(grpc.GenericRpcHandler):
    """The generic handler; add it to a ``grpc.aio`` server (see :func:`start_grpc_server`)."""

    def __init__(self, config: GatewayConfig, balancer: Balancer, metrics: GatewayMetrics, *,
                 ids: IdGenerator | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._balancer = balancer
        self._metrics = metrics
        self._ids = ids if ids is not None else IdGenerator()
        self._clock = clock
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        size = config.max_body_bytes
        self._options = [*_CHANNEL_OPTIONS, ("grpc.max_receive_message_length", size),
                         ("grpc.max_send_message_length", size)]

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
            self._handlers[method] = handler
        return handler

    def _channel(self, ep: Endpoint) -> grpc.aio.Channel:
        channel = self._channels.get(ep.url)
        if channel is None:
            target = grpc_target(ep, self._config.backend_grpc_port_offset)
            channel = self._channels[ep.url] = grpc.aio.insecure_channel(target, options=self._options)
        return channel

    async def retain(self, urls: Iterable[str]) -> None:
        """Close the channels of replicas that left the fleet."""
        keep = set(urls)
        for url in [u for u in self._channels if u not in keep]:
            await self._channels.pop(url).close()

    async def close(self) -> None:
        await self.retain(())

    def _forward_metadata(self, context: grpc.aio.ServicerContext
                          ) -> tuple[Metadata, dict[str, str], str]:
        """What to send on (trace and request id set), the client's text metadata, the request id."""
        incoming = [(k, v) for k, v in (context.invocation_metadata() or ()) if not k.startswith(":")]
        text = {k: v for k, v in incoming if isinstance(v, str)}
        rid = request_id(text.get("x-request-id"), self._ids)
        parent = parse_traceparent(text.get("traceparent"))
        metadata: Metadata = [(k, v) for k, v in incoming if k not in _DROP_METADATA and not k.startswith("grpc-")]
        metadata += [("x-request-id", rid), ("traceparent", next_hop(parent, self._ids).header())]
        if parent is not None and "tracestate" in text:
            metadata.append(("tracestate", text["tracestate"]))
        return metadata, text, rid

    def _timeout_s(self, context: grpc.aio.ServicerContext) -> float:
        remaining = context.time_remaining()
        return self._config.request_timeout_ms / 1000.0 if remaining is None else float(remaining)

    def _unary_behaviour(self, method: str) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]:
        async def behaviour(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            metadata, text, rid = self._forward_metadata(context)
            ctx = RequestContext("POST", method, len(request), text, rid)
            deadline = self._clock() + self._timeout_s(context)
            budget = self._balancer.retry_budget
            tried: list[Endpoint] = []
            failure: tuple[str, grpc.aio.AioRpcError] | None = None
            self._metrics.inflight.inc()
            try:
                for attempt in range(self._config.max_retries + 1):
                    ep = self._balancer.pick(ctx, exclude=tried)
                    if ep is None:
                        break
                    if attempt:
                        if not budget.try_acquire():
                            self._metrics.retry_budget_exhausted.inc()
                            break
                        self._metrics.retries.inc()
                    try:
                        response = await self._call(ep, method, request, metadata, deadline, context)
                        self._metrics.observe_request(ep.url, 200)
                        return response
                    except grpc.aio.AioRpcError as err:
                        failure = (ep.url, err)
                        if err.code() != grpc.StatusCode.UNAVAILABLE:
                            break
                        tried.append(ep)
                    finally:
                        if attempt:
                            budget.release()
            finally:
                self._metrics.inflight.dec()
            if failure is None:
                self._metrics.observe_request(NO_BACKEND, 503)
                await _abort(context, grpc.StatusCode.UNAVAILABLE, "no healthy replica is available")
            backend, last = failure
            self._metrics.observe_request(backend, HTTP_STATUS.get(last.code(), 500))
            await _abort(context, last.code(), last.details() or "", last.trailing_metadata() or ())

        return behaviour

    async def _call(self, ep: Endpoint, method: str, request: bytes, metadata: Metadata, deadline: float,
                    context: grpc.aio.ServicerContext) -> bytes:
        ticket = self._balancer.start(ep)
        started = self._clock()
        code: grpc.StatusCode | None = None
        report: str | None = None
        try:
            call = self._channel(ep).unary_unary(method)(
                request, timeout=max(0.001, deadline - started), metadata=metadata)
            try:
                response: bytes = await call
            except grpc.aio.AioRpcError as err:
                code = err.code()
                report = _load_report(err.trailing_metadata())
                raise
            code = grpc.StatusCode.OK
            trailing = await call.trailing_metadata()
            report = _load_report(trailing)
            context.set_trailing_metadata(tuple(trailing or ()))
            return response
        finally:
            latency = self._clock() - started
            ticket.finish(status=None if code is None else HTTP_STATUS.get(code, 500), latency_s=latency,
                          report=report)
            self._metrics.observe_attempt(ep.url, latency)

    def _stream_behaviour(self, method: str) -> Callable[[AsyncIterator[bytes], grpc.aio.ServicerContext],
                                                         AsyncIterator[bytes]]:
        # A stream is not a request-sized unit of load (its length says nothing about the replica's
        # speed), so it is placed by the policy but not tracked as a request by the balancer.
        async def behaviour(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
                            ) -> AsyncIterator[bytes]:
            metadata, text, rid = self._forward_metadata(context)
            ep = self._balancer.pick(RequestContext("POST", method, 0, text, rid))
            if ep is None:
                self._metrics.observe_request(NO_BACKEND, 503)
                await _abort(context, grpc.StatusCode.UNAVAILABLE, "no healthy replica is available")
            call = self._channel(ep).stream_stream(method)(requests, metadata=metadata,
                                                          timeout=context.time_remaining())
            try:
                async for reply in call:
                    yield reply
            except grpc.aio.AioRpcError as err:
                self._metrics.observe_request(ep.url, HTTP_STATUS.get(err.code(), 500))
                await _abort(context, err.code(), err.details() or "")
            self._metrics.observe_request(ep.url, 200)

        return behaviour


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str,
                 trailing: Iterable[tuple[str, str | bytes]] = ()) -> NoReturn:
    await context.abort(code, details, tuple(trailing))
    raise AssertionError("grpc.aio ServicerContext.abort() returned instead of raising")


def _load_report(metadata: Any) -> str | None:
    """The ``endpoint-load-metrics`` value among a call's metadata, if any."""
    for key, value in metadata or ():
        if key == LOAD_REPORT_HEADER and isinstance(value, str):
            return value
    return None


async def start_grpc_server(proxy: GrpcProxy, host: str, port: int, *, reuse_port: bool = False
                            ) -> tuple[grpc.aio.Server, int]:
    """Start a ``grpc.aio`` server with ``proxy`` on ``host:port``; returns it and the bound port."""
    size = proxy._config.max_body_bytes
    server = grpc.aio.server(handlers=[proxy], options=[
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        ("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", size)])
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpcio reports a failed bind this way (older versions return 0)
        raise OSError(f"gRPC cannot listen on {address}: {exc}") from None
    if bound == 0:
        raise OSError(f"gRPC cannot listen on {address}")
    await server.start()
    return server, bound
