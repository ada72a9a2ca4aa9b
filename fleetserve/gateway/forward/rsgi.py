"""The gateway's public HTTP port on Granian (``--server granian``, the default): an RSGI application.

Granian (https://github.com/emmett-framework/granian) parses and writes HTTP in Rust, outside the interpreter.
This application gives every request what the aiohttp front gives it, in the order of :mod:`..edge.stack`,
through the guards the aiohttp middlewares use (:class:`~fleetserve.gateway.edge.calls.RequestGuards`):

1. head limits (431, 413: :mod:`fleetserve.gateway.edge.granian_input`);
2. the in-flight cap, JWT verification and rate limits (the client address from the peer, and from
   ``X-Forwarded-For`` as far as trusted proxies vouch), the adaptive concurrency limit;
3. the body, read within its deadline and bounded, its JSON scanned (408, 413, 400: ``granian_input`` too).

Then the proxied routes (:mod:`fleetserve.gateway.routes`) go through the forwarding core (:mod:`.core`) with
the deadline, headers, request id and trace context of :mod:`.http`, and the spans of :mod:`..tracing`. Every
other path — the admin API, ``/metrics``, the dashboard, 404s and 405s — goes to the gateway's own
aiohttp application, built without guards, on a loopback port only this process knows: those routes are
written once, and the loopback hop costs only requests that are not inference. A client that hangs up cancels
its request's task, and with it the attempt in flight, whose upstream connection closes so that the replica
drops the queued work (as aiohttp's ``handler_cancellation`` does on the other front).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, cast

from fleetserve.gateway.balance import RequestContext
from fleetserve.gateway.edge.calls import RequestGuards
from fleetserve.gateway.edge.config import InputLimits
from fleetserve.gateway.edge.granian_input import Refused, check_head, read_body
from fleetserve.gateway.edge.identity import Identity, headers_of
from fleetserve.gateway.edge.metrics import RejectionObserver
from fleetserve.gateway.edge.rejection import Rejection
from fleetserve.gateway.forward.core import Exchange, Forwarder, Outcome
from fleetserve.gateway.forward.headers import DROP_REQUEST, DROP_RESPONSE, forward_headers
from fleetserve.gateway.forward.http import UpstreamExchange, timeout_of
from fleetserve.gateway.forward.upstream import UpstreamPool, UpstreamPools
from fleetserve.gateway.metrics import NO_BACKEND, GatewayMetrics
from fleetserve.gateway.routes import PROXIED_METHODS, proxied
from fleetserve.gateway.tracing import ForwardSpans, http_server_span
from fleetserve.telemetry import otel
from fleetserve.telemetry.access_log import AccessLog
from fleetserve.telemetry.tracing import IdGenerator, request_id
from fleetserve.wire import REQUEST_ID_HEADER, RETRY_AFTER, TIMEOUT_HEADER, error_body

if TYPE_CHECKING:
    from opentelemetry.trace import Span

Answer = tuple[int, list[tuple[str, str]], bytes]
_JSON = [("content-type", "application/json")]
_CLOSE = ("connection", "close")


class RsgiExchange(UpstreamExchange[Answer]):
    """The exchange of the Granian front: an answer is (status, headers, body)."""

    __slots__ = ()

    def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> Answer:
        return status, headers, body


class _Reply:
    """One request's answer, given once through Granian; what it was (status, sizes, replica and attempts) stays
    here for the metrics, the span and the access log."""

    __slots__ = ("attempts", "backend", "proto", "received", "sent", "status")

    def __init__(self, proto: Any) -> None:
        self.proto = proto
        self.status = 500  # until answered: a request that raises counts as failed for the guards
        self.backend: str | None = None  # set once the forwarding core ran (as aiohttp's access log has it)
        self.attempts = self.received = self.sent = 0

    def send(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.proto.response_bytes(status, headers, body)
        self.status, self.sent = status, len(body)


def _target(scope: Any) -> str:
    return f"{scope.path}?{scope.query_string}" if scope.query_string else scope.path


def _peer(scope: Any) -> str | None:
    """The client's address without its port (Granian gives ``host:port``, ``[v6]:port``)."""
    client = scope.client
    return client.rpartition(":")[0].strip("[]") if client else None


class RsgiFront:
    """The RSGI application: the edge guards, then the forwarding core or the loopback admin application."""

    def __init__(self, forwarder: Forwarder, pools: UpstreamPools, metrics: GatewayMetrics, guards: RequestGuards,
                 observer: RejectionObserver, limits: InputLimits, ids: IdGenerator, lines: AccessLog | None,
                 local: UpstreamPool, *, default_timeout_s: float, max_timeout_ms: int,
                 tracing: otel.Tracing | None = None, policy: str = "") -> None:
        self._forwarder = forwarder
        self._pools = pools
        self._metrics = metrics
        self._duration = metrics.request_duration.series()
        self._guards = guards
        self._observer = observer
        self._limits = limits
        self._ids = ids
        self._lines = lines
        self._local = local
        self._default_timeout_s = default_timeout_s
        self._max_timeout_ms = max_timeout_ms
        self._tracing = tracing
        self._policy = policy  # the balancer's, for the pick spans

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        started = time.monotonic()
        task = asyncio.current_task()
        assert task is not None

        def hung_up(_: object) -> None:
            task.cancel()

        # Granian's disconnect future takes callbacks itself: no task per request to watch it.
        watch = proto.client_disconnect()
        watch.add_done_callback(hung_up)
        path = scope.path
        recorded = proxied(path)  # timed, traced and logged, as on aiohttp; forwarded for the proxied methods
        forwarded = recorded and scope.method in PROXIED_METHODS
        span = None
        if recorded and self._tracing is not None:
            span = http_server_span(self._tracing, scope.method, path, scope.headers, _peer(scope))
        reply = _Reply(proto)
        try:
            await self._guarded(scope, reply, path, forwarded, task, span)
        except BaseException as exc:
            if span is not None:  # no answer: a hang-up (or a crash)
                span.set_attribute("error.type", type(exc).__qualname__)
                span.end()
            if not isinstance(exc, asyncio.CancelledError) or not watch.done() or watch.cancelled():
                raise
            return  # the client is gone: nothing to answer, no latency to record (as on aiohttp)
        finally:
            watch.remove_done_callback(hung_up)
            watch.cancel()
        if not recorded:
            return
        if span is not None:
            otel.end_server_span(span, reply.status)
        latency = time.monotonic() - started
        self._duration.observe(latency)
        if self._lines is not None:
            self._lines.request(scope.method, path, reply.status, latency, replica=reply.backend,
                                attempts=reply.attempts, bytes_in=reply.received, bytes_out=reply.sent)

    async def _guarded(self, scope: Any, reply: _Reply, path: str, forwarded: bool, task: asyncio.Task[Any],
                       span: Span | None) -> None:
        """Run the guards around the request and answer it (``reply`` keeps what the answer was)."""
        headers = scope.headers
        target = _target(scope)
        try:
            check_head(scope.method, target, headers, self._limits)
        except Refused as refused:
            return self._refused(reply, refused)
        guards = self._guards
        rejection = guards.enter(path)
        if rejection is not None:
            return self._reject(reply, rejection)
        try:
            identity: Identity | None = None
            if guards.checking:
                forwarded_for = [v for k, v in headers.items() if k == "x-forwarded-for"]
                admitted = await guards.admit(path, headers, forwarded_for, scope.client)
                if isinstance(admitted, Rejection):
                    return self._reject(reply, admitted)
                identity = admitted
            slot = guards.acquire(path)
            if isinstance(slot, Rejection):
                return self._reject(reply, slot)
            try:
                try:
                    body = await read_body(reply.proto, headers, self._limits, task)
                except Refused as refused:
                    return self._refused(reply, refused)
                reply.received = len(body)
                if forwarded:
                    return await self._forward(scope, target, reply, headers, body, identity, span)
                return await self._local_route(scope, target, reply, headers, body)
            finally:
                guards.release(slot, reply.status < 400)
        finally:
            guards.leave(path)

    async def _forward(self, scope: Any, target: str, reply: _Reply, headers: Any, body: bytes,
                       identity: Identity | None, span: Span | None) -> None:
        """Forward through the core and answer."""
        metrics = self._metrics
        rid = request_id(headers.get("x-request-id"), self._ids)
        try:
            timeout_s = timeout_of(headers.get(TIMEOUT_HEADER.lower()), self._default_timeout_s,
                                   self._max_timeout_ms)
        except ValueError as exc:
            metrics.observe_request(NO_BACKEND, 400)
            return self._error(reply, 400, str(exc), [(REQUEST_ID_HEADER, rid)])
        outgoing, traceparent = forward_headers(headers, rid, self._ids,
                                                None if span is None else otel.traceparent(span),
                                                {} if identity is None else headers_of(identity), _peer(scope))
        exchange = RsgiExchange(self._pools, scope.method, target, outgoing, body, traceparent)
        ctx = RequestContext(scope.method, scope.path, len(body), headers, rid)
        forwarder = self._forwarder
        metrics.inflight.inc()
        try:
            spans = ForwardSpans.of(self._tracing, span, self._policy, "http", scope.method)
            outcome: Outcome[Answer] = await forwarder.forward(
                ctx, cast("Exchange[Any, Answer]", exchange), forwarder.clock() + timeout_s, timeout_s, spans)
        finally:
            metrics.inflight.dec()
        metrics.observe_request(outcome.backend, outcome.status)
        reply.backend, reply.attempts = outcome.backend, exchange.sends
        if outcome.answer is None:
            extra = [(REQUEST_ID_HEADER, rid)]
            if outcome.retry_after is not None:
                extra.append((RETRY_AFTER, outcome.retry_after))
            return self._error(reply, outcome.status, outcome.failure, extra)
        status, reply_headers, reply_body = outcome.answer
        reply_headers.append((REQUEST_ID_HEADER, rid))
        reply.send(status, reply_headers, reply_body)

    async def _local_route(self, scope: Any, target: str, reply: _Reply, headers: Any, body: bytes) -> None:
        """A path the gateway serves itself, answered by its aiohttp application over loopback."""
        outgoing = [(k, v) for k, v in headers.items() if k not in DROP_REQUEST or k == "x-request-id"]
        local = await self._local.request(scope.method, target, outgoing, body)
        reply.send(int(local.status), [(k, v) for k, v in local.headers if k.lower() not in DROP_RESPONSE
                                       or k.lower() == "x-request-id"], local.body)

    def _refused(self, reply: _Reply, refused: Refused) -> None:
        self._observer.rejected(refused.reason)
        self._error(reply, refused.status, str(refused), [_CLOSE] if refused.close else None)

    def _reject(self, reply: _Reply, rejection: Rejection) -> None:
        self._error(reply, rejection.status, rejection.message, list((rejection.headers or {}).items()))

    @staticmethod
    def _error(reply: _Reply, status: int, message: str, extra: list[tuple[str, str]] | None = None) -> None:
        reply.send(status, [*_JSON, *(extra or ())], error_body(message))
