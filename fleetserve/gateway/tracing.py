"""The gateway's spans (when tracing is on, :mod:`fleetserve.telemetry.otel`): one trace per request.

- **The request** (``SERVER``): for HTTP, started by :func:`tracing_middleware`, the outermost middleware,
  so the edge guards' time is inside it, and ended by the access logger once the response's last byte is
  written (:mod:`.access`), so it covers what the client waits for; on Granian (:mod:`.forward.rsgi`), from
  before the edge guards to the answer handed to Granian; for gRPC, around the call. It continues
  the caller's ``traceparent`` (or starts a trace, sampled by the configured ratio). Named and described by
  the HTTP semantic conventions: ``POST /v2/models/{model}/infer``, ``http.request.method``, ``url.path``,
  ``http.route``, ``http.response.status_code``, ``client.address``; gRPC ones by the RPC conventions.
- **The pick** (``INTERNAL``, one per pick, hedges' too): ``fleetserve.balancer.policy``, the chosen replica
  (``fleetserve.replica``, none when no replica could take it) and its outstanding requests at that moment
  (``fleetserve.replica.load``).
- **Each attempt** (``CLIENT``): ``server.address``/``server.port`` of the replica, ``http.request.resend_count``
  on a retry, ``fleetserve.hedge`` on a hedged copy, the status the replica answered (or ``error.type``); its
  span id is the ``traceparent`` parent the replica receives, so the replica's spans hang below it.

A trace the sampler drops still carries its trace id and unsampled flag on to the replicas, which then
record nothing either; past that, an unsampled request creates no span here: :class:`ForwardSpans` exists
only for recording requests.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from fleetserve.gateway.access import SPAN_KEY
from fleetserve.gateway.balance import Balancer, Endpoint, RequestContext
from fleetserve.gateway.balance.load import outstanding
from fleetserve.gateway.routes import proxied
from fleetserve.telemetry import logs, otel

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

    from fleetserve.gateway.forward.core import Outcome

def server_span(tracing: otel.Tracing, name: str, carrier: Mapping[str, str], attributes: dict[str, Any]) -> Span:
    """The request's span, continuing the trace ``carrier``'s headers name; its trace id goes on the log lines."""
    from opentelemetry.trace import SpanKind

    span = tracing.tracer.start_span(name, context=tracing.extract(carrier), kind=SpanKind.SERVER,
                                     attributes=attributes)
    logs.trace_id_var.set(otel.trace_id(span))
    return span


def http_server_span(tracing: otel.Tracing, method: str, path: str, headers: Mapping[str, str],
                     client: str | None) -> Span | None:
    """The span of one proxied HTTP request (either front), continuing the caller's trace; None when the
    sampling decision leaves the request unrecorded."""
    if not tracing.samples(headers.get("traceparent")):
        return None
    route = otel.http_route(path)
    attributes: dict[str, Any] = {"http.request.method": method, "url.path": path, "http.route": route,
                                  "url.scheme": "http"}
    if client:
        attributes["client.address"] = client
    return server_span(tracing, f"{method} {route}", headers, attributes)


def tracing_middleware(tracing: otel.Tracing) -> Middleware:
    """Starts the span of each proxied request; the access logger ends it (or this, if the handler fails)."""

    @web.middleware
    async def trace(request: web.Request, handler: Handler) -> web.StreamResponse:
        span = None
        if proxied(request.path):
            span = http_server_span(tracing, request.method, request.path, request.headers, request.remote)
        if span is None:
            return await handler(request)
        request[SPAN_KEY] = span
        try:
            return await handler(request)
        except BaseException as exc:
            # No response will reach the access logger: the span ends here (a hang-up, a crash).
            span.set_attribute("error.type", type(exc).__qualname__)
            span.end()
            del request[SPAN_KEY]
            raise

    return trace


class ForwardSpans:
    """The pick and attempt spans of one recording request, children of its ``parent`` span."""

    __slots__ = ("_context", "_name", "_policy", "_protocol", "_tracer")

    def __init__(self, tracer: Tracer, parent: Span, policy: str, protocol: str, name: str) -> None:
        from opentelemetry.trace import set_span_in_context

        self._tracer = tracer
        self._context: Context = set_span_in_context(parent)
        self._policy = policy
        self._protocol = protocol  # "http" or "grpc"
        self._name = name  # the attempt spans' name: the HTTP method, or the gRPC service/method

    @classmethod
    def of(cls, tracing: otel.Tracing | None, span: Span | None, policy: str, protocol: str,
           name: str) -> ForwardSpans | None:
        """Spans for a request whose span records; None otherwise (tracing off, or not sampled)."""
        if tracing is None or span is None or not span.is_recording():
            return None
        return cls(tracing.tracer, span, policy, protocol, name)

    def pick(self, balancer: Balancer, ctx: RequestContext, exclude: Collection[Endpoint],
             clock: Callable[[], float]) -> Endpoint | None:
        """``balancer.pick``, and its span: the chosen replica and its outstanding requests then."""
        started = time.time_ns()
        ep = balancer.pick(ctx, exclude)
        load = None
        if ep is not None:
            with contextlib.suppress(KeyError):  # KeyError: removed by discovery meanwhile
                load = outstanding(balancer.load(ep), clock())
        self.picked(started, ep, load)
        return ep

    def picked(self, started_ns: int, ep: Endpoint | None, load: float | None) -> None:
        attributes: dict[str, Any] = {"fleetserve.balancer.policy": self._policy}
        if ep is not None:
            attributes["fleetserve.replica"] = ep.url
        if load is not None:
            attributes["fleetserve.replica.load"] = load
        span = self._tracer.start_span("pick", context=self._context, start_time=started_ns, attributes=attributes)
        span.end()

    def attempt(self, ep: Endpoint, resend_count: int, hedge: bool) -> tuple[Span, str]:
        """The attempt's span, started, and the ``traceparent`` that makes it the replica's parent."""
        from opentelemetry.trace import SpanKind

        host, _, port = ep.url.removeprefix("http://").partition(":")
        attributes: dict[str, Any] = {"server.address": host, "fleetserve.replica": ep.url}
        if self._protocol == "http":
            attributes["http.request.method"] = self._name
            if port:
                attributes["server.port"] = int(port)
        else:
            service, _, method = self._name.rpartition("/")
            attributes.update({"rpc.system": "grpc", "rpc.service": service, "rpc.method": method})
        if resend_count:
            attributes["http.request.resend_count"] = resend_count
        if hedge:
            attributes["fleetserve.hedge"] = True
        span = self._tracer.start_span(self._name, context=self._context, kind=SpanKind.CLIENT,
                                       attributes=attributes)
        return span, otel.traceparent(span)

    def attempt_done(self, span: Span, outcome: Outcome[Any] | None) -> None:
        from opentelemetry.trace import StatusCode

        if outcome is None:
            span.set_attribute("error.type", "cancelled")  # a hedge that lost, or a client that left
        else:
            if self._protocol == "http" and outcome.verdict is not None:
                span.set_attribute("http.response.status_code", outcome.verdict)
            if outcome.status >= 500:
                span.set_attribute("error.type", outcome.failure[:120] or str(outcome.status))
                span.set_status(StatusCode.ERROR)
        span.end()


def traced_pick(spans: ForwardSpans | None, balancer: Balancer, ctx: RequestContext, exclude: Collection[Endpoint],
                clock: Callable[[], float]) -> Endpoint | None:
    """``balancer.pick``, recorded as a span when the request is traced (``spans``)."""
    return balancer.pick(ctx, exclude) if spans is None else spans.pick(balancer, ctx, exclude, clock)
