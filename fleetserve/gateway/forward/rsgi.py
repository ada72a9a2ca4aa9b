"""The gateway's public HTTP port on Granian (``--server granian``): an RSGI application.

Granian (https://github.com/emmett-framework/granian) parses and writes HTTP in Rust, outside the interpreter.
This application gives every request what the aiohttp front gives it, in the order of :mod:`..edge.stack`,
through the guards the aiohttp middlewares use (:class:`~fleetserve.gateway.edge.calls.RequestGuards`):

1. head limits: a head over ``max_header_bytes`` or ``max_headers`` lines is a 431, a declared body over
   ``max_body_bytes`` a 413;
2. the in-flight cap, JWT verification and rate limits (the client address from the peer, and from
   ``X-Forwarded-For`` as far as trusted proxies vouch), the adaptive concurrency limit;
3. the body, read within ``body_read_timeout_s`` (408), bounded also when chunked (413), a JSON body's depth
   and value count scanned (400/413).

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
from fleetserve.gateway.edge.identity import Identity, headers_of
from fleetserve.gateway.edge.jsonscan import JsonLimitExceeded, check_json_bounds
from fleetserve.gateway.edge.limits import head_size, is_json
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


class _Refused(Exception):
    """A request the input limits refuse, with its answer."""

    def __init__(self, status: int, reason: str, message: str, close: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.close = close  # the body was not (completely) read: the connection cannot carry another request


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
        forwarded = scope.method in PROXIED_METHODS and proxied(path)
        span = None
        if forwarded and self._tracing is not None:
            span = http_server_span(self._tracing, scope.method, path, dict(scope.headers.items()), _peer(scope))
        try:
            status, backend, attempts, size, sent = await self._guarded(scope, proto, path, forwarded, task, span)
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
        if not forwarded:
            return
        if span is not None:
            otel.end_server_span(span, status)
        latency = time.monotonic() - started
        self._duration.observe(latency)
        if self._lines is not None:
            self._lines.request(scope.method, path, status, latency, replica=backend, attempts=attempts, bytes_in=size,
                                bytes_out=sent)

    async def _guarded(self, scope: Any, proto: Any, path: str, forwarded: bool, task: asyncio.Task[Any],
                       span: Span | None) -> tuple[int, str, int, int, int]:
        """Run the guards around the request; its status, the replica that answered, attempts, and the sizes of
        the request's body and of the answer's."""
        headers = scope.headers
        try:
            self._check_head(scope, headers)
        except _Refused as refused:
            return self._refused(proto, refused), NO_BACKEND, 0, 0, 0
        guards = self._guards
        rejection = guards.enter(path)
        if rejection is not None:
            return self._reject(proto, rejection), NO_BACKEND, 0, 0, 0
        try:
            identity: Identity | None = None
            if guards.checking:
                forwarded_for = [v for k, v in headers.items() if k == "x-forwarded-for"]
                admitted = await guards.admit(path, headers, forwarded_for, scope.client)
                if isinstance(admitted, Rejection):
                    return self._reject(proto, admitted), NO_BACKEND, 0, 0, 0
                identity = admitted
            slot = guards.acquire(path)
            if isinstance(slot, Rejection):
                return self._reject(proto, slot), NO_BACKEND, 0, 0, 0
            status = 500
            try:
                try:
                    body = await self._body(proto, headers, task)
                except _Refused as refused:
                    status = self._refused(proto, refused)
                    return status, NO_BACKEND, 0, 0, 0
                if forwarded:
                    status, backend, attempts, sent = await self._forward(scope, proto, headers, body, identity, span)
                    return status, backend, attempts, len(body), sent
                status = await self._local_route(scope, proto, headers, body)
                return status, NO_BACKEND, 0, len(body), 0
            finally:
                guards.release(slot, status < 400)
        finally:
            guards.leave(path)

    def _check_head(self, scope: Any, headers: Any) -> None:
        limits = self._limits
        items = headers.items()
        size = head_size(scope.method, _target(scope), items)
        if size > limits.max_header_bytes or len(items) > limits.max_headers:
            raise _Refused(431, "headers_too_large", f"request head is {size} bytes in {len(items)} lines; the "
                           f"limits are {limits.max_header_bytes} bytes and {limits.max_headers} lines")
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
            raise _Refused(413, "body_too_large",
                           f"request body is {declared} bytes; the limit is {limits.max_body_bytes}")

    async def _body(self, proto: Any, headers: Any, task: asyncio.Task[Any]) -> bytes:
        """The whole body within the read deadline and the size cap, its JSON bounded."""
        limits = self._limits
        if headers.get("content-length") in (None, "0") and "transfer-encoding" not in headers:
            return b""
        late = False

        def expire() -> None:
            nonlocal late
            late = True
            task.cancel()

        # A bare timer rather than asyncio.timeout(): the same deadline for half the CPU (3.4 against 7.7 µs).
        timer = asyncio.get_running_loop().call_later(limits.body_read_timeout_s, expire)
        try:
            if "transfer-encoding" in headers:
                body = await self._chunked(proto, limits.max_body_bytes)
            else:
                body = await proto()
        except asyncio.CancelledError:
            if not late:
                raise
            task.uncancel()
            raise _Refused(408, "body_timeout",
                           f"request body not received within {limits.body_read_timeout_s:g} s") from None
        finally:
            timer.cancel()
        if is_json(headers.get("content-type")):
            try:
                check_json_bounds(body, limits.json_max_depth, limits.json_max_elements)
            except JsonLimitExceeded as exc:
                raise _Refused(413 if exc.reason == "json_too_many_elements" else 400, exc.reason, str(exc),
                               close=False) from None
        return body

    @staticmethod
    async def _chunked(proto: Any, cap: int) -> bytes:
        parts: list[bytes] = []
        size = 0
        async for chunk in proto:
            size += len(chunk)
            if size > cap:
                raise _Refused(413, "body_too_large", f"request body exceeds {cap} bytes")
            parts.append(chunk)
        return b"".join(parts)

    async def _forward(self, scope: Any, proto: Any, headers: Any, body: bytes, identity: Identity | None,
                       span: Span | None) -> tuple[int, str, int, int]:
        """Forward through the core and answer; the status, the replica that answered, the attempts and the
        answer's size."""
        metrics = self._metrics
        rid = request_id(headers.get("x-request-id"), self._ids)
        try:
            timeout_s = timeout_of(headers.get(TIMEOUT_HEADER.lower()), self._default_timeout_s,
                                   self._max_timeout_ms)
        except ValueError as exc:
            metrics.observe_request(NO_BACKEND, 400)
            return self._error(proto, 400, str(exc), [(REQUEST_ID_HEADER, rid)]), NO_BACKEND, 0, 0
        outgoing, traceparent = forward_headers(headers, rid, self._ids,
                                                None if span is None else otel.traceparent(span),
                                                {} if identity is None else headers_of(identity), _peer(scope))
        path = scope.path
        exchange = RsgiExchange(self._pools, scope.method, _target(scope), outgoing, body, traceparent)
        ctx = RequestContext(scope.method, path, len(body), headers, rid)
        forwarder = self._forwarder
        metrics.inflight.inc()
        try:
            spans = ForwardSpans.of(self._tracing, span, self._policy, "http", scope.method)
            outcome: Outcome[Answer] = await forwarder.forward(
                ctx, cast(Exchange[Any, Answer], exchange), forwarder.clock() + timeout_s, timeout_s, spans)
        finally:
            metrics.inflight.dec()
        metrics.observe_request(outcome.backend, outcome.status)
        if outcome.answer is None:
            extra = [(REQUEST_ID_HEADER, rid)]
            if outcome.retry_after is not None:
                extra.append((RETRY_AFTER, outcome.retry_after))
            return self._error(proto, outcome.status, outcome.failure, extra), outcome.backend, exchange.sends, 0
        status, reply_headers, reply_body = outcome.answer
        reply_headers.append((REQUEST_ID_HEADER, rid))
        proto.response_bytes(status, reply_headers, reply_body)
        return status, outcome.backend, exchange.sends, len(reply_body)

    async def _local_route(self, scope: Any, proto: Any, headers: Any, body: bytes) -> int:
        """A path the gateway serves itself, answered by its aiohttp application over loopback."""
        outgoing = [(k, v) for k, v in headers.items() if k not in DROP_REQUEST or k == "x-request-id"]
        reply = await self._local.request(scope.method, _target(scope), outgoing, body)
        proto.response_bytes(reply.status, [(k, v) for k, v in reply.headers if k.lower() not in DROP_RESPONSE
                                            or k.lower() == "x-request-id"], reply.body)
        return int(reply.status)

    def _refused(self, proto: Any, refused: _Refused) -> int:
        self._observer.rejected(refused.reason)
        return self._error(proto, refused.status, str(refused), [_CLOSE] if refused.close else None)

    def _reject(self, proto: Any, rejection: Rejection) -> int:
        return self._error(proto, rejection.status, rejection.message, list((rejection.headers or {}).items()))

    @staticmethod
    def _error(proto: Any, status: int, message: str, extra: list[tuple[str, str]] | None = None) -> int:
        proto.response_bytes(status, [*_JSON, *(extra or ())], error_body(message))
        return status
