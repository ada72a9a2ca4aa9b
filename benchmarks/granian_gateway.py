"""What the gateway's default features cost on Granian: the forwarding core behind an RSGI app instead of aiohttp.

Issue 12's CPU goal (gateway CPU per request ≤ 2× Envoy's) is out of reach on the aiohttp public side: its bare
front alone costs 1.4× Envoy (BENCHMARKS.md §4.3). Granian's bare front costs 0.93×. This front answers the
question that decides whether moving the public side is worth it: with every default feature on the hot path,
what does a request cost on Granian? It builds the gateway's own parts from a default ``GatewayConfig`` with
one ``--upstream`` backend — balancer (p2c-peak-ewma), health checks, forwarding core (retries, retry budget,
per-try timeout, hedging), upstream pool, edge guards through their protocol-neutral form (the gRPC
listener's :class:`~fleetserve.gateway.edge.grpc.GrpcGuards`: in-flight cap, adaptive concurrency limit),
body and JSON bounds, request ids and ``traceparent``, request metrics and the access log — and forwards
every request through them. Not here: the admin API, dashboard and ``/metrics`` routes, the connection guard
below HTTP (Granian has its own limits), and 4xx answers for a bad ``X-Fleetserve-Timeout-Ms`` (the default
deadline is used). ``benchmarks/gateway_cpu.py --fronts fleetserve,granian-gateway,bare-granian,envoy`` runs
it beside the real gateway. Granian is not a dependency of fleetserve: ``pip install granian`` to run it.

    python benchmarks/granian_gateway.py --upstream http://127.0.0.1:8000 --port 8080
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, cast

from bare_granian import serve

from fleetserve.gateway.balance import Balancer, RequestContext
from fleetserve.gateway.balance.discovery import Insert
from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.health import run_health_checks
from fleetserve.gateway.balance.observer import Observers
from fleetserve.gateway.config import GatewayConfig
from fleetserve.gateway.edge.guards import EdgeGuards
from fleetserve.gateway.edge.jsonscan import JsonLimitExceeded, check_json_bounds
from fleetserve.gateway.edge.rejection import Rejection
from fleetserve.gateway.forward.core import Exchange, Forwarder, Outcome
from fleetserve.gateway.forward.headers import DROP_REQUEST, DROP_RESPONSE
from fleetserve.gateway.forward.http import HttpExchange, readiness_probe
from fleetserve.gateway.forward.upstream import UpstreamPools, UpstreamResponse
from fleetserve.gateway.metrics import NO_BACKEND, GatewayMetrics
from fleetserve.telemetry.access_log import AccessLog
from fleetserve.telemetry.tracing import IdGenerator, next_hop, parse_traceparent, request_id
from fleetserve.wire import LOAD_REPORT_HEADER, REQUEST_ID_HEADER, RETRY_AFTER, error_body, retry_after

UPSTREAM_ENV = "FLEETSERVE_GRANIAN_UPSTREAM"
_REPORT = LOAD_REPORT_HEADER.lower()
Answer = tuple[int, list[tuple[str, str]], bytes]


class RsgiExchange(HttpExchange):
    """The HTTP adapter of the forwarding core, answering with (status, headers, body) instead of aiohttp's."""

    def answered(self, ep: Endpoint, reply: UpstreamResponse) -> Outcome[Answer]:  # type: ignore[override]
        status = reply.status
        headers = [(k, v) for k, v in reply.headers if k.lower() not in DROP_RESPONSE]
        report = next((v for k, v in headers if k.lower() == _REPORT), None)
        return Outcome(status, (status, headers, reply.body), backend=ep.url, verdict=status,
                       retryable=status == 503, report=report)


class GranianGateway:
    """RSGI application: the gateway's request path for one upstream, built when Granian's loop starts."""

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        config = GatewayConfig(backends=(os.environ[UPSTREAM_ENV],))
        self.metrics = metrics = GatewayMetrics()
        self.balancer = balancer = Balancer(config.balancer, observer=Observers(metrics))
        for ep in config.endpoints():
            balancer.apply(Insert(ep))
        self.pools = UpstreamPools(config.upstream)
        guards = EdgeGuards.create(config.edge, metrics.registry)
        self.guards = guards.grpc
        self.limits = config.edge.limits
        self.forwarder = Forwarder(balancer, metrics, config.hedge, guards.observer, max_retries=config.max_retries,
                                   retry_after=retry_after(config.retry_after_s),
                                   overload_retry_after=guards.retry_after,
                                   try_timeout_s=config.per_try_timeout_ms / 1000)
        self.timeout_s = config.request_timeout_ms / 1000.0
        self.ids = IdGenerator()
        self.lines = AccessLog.create(config.access_log)
        self.duration = metrics.request_duration.series()
        self.health = loop.create_task(run_health_checks(balancer, readiness_probe(self.pools), config.balancer))

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        started = time.monotonic()
        path = scope.path
        refusal = self.guards.enter(path)
        if refusal is not None:
            self._refuse(proto, refusal)
            return
        try:
            slot = self.guards.acquire(path)
            if isinstance(slot, Rejection):
                self._refuse(proto, slot)
                return
            status = 500
            try:
                status, backend = await self._forward(scope, proto)
            finally:
                self.guards.release(slot, status < 400)
        finally:
            self.guards.leave(path)
        latency = time.monotonic() - started
        self.metrics.observe_request(backend, status)
        self.duration.observe(latency)
        if self.lines is not None:
            self.lines.request(scope.method, path, status, latency, replica=backend)

    async def _forward(self, scope: Any, proto: Any) -> tuple[int, str]:
        incoming = scope.headers
        limits = self.limits
        body = await proto()
        if len(body) > limits.max_body_bytes:
            return self._error(proto, 413, f"request body exceeds {limits.max_body_bytes} bytes"), NO_BACKEND
        if "json" in (incoming.get("content-type") or ""):
            try:
                check_json_bounds(body, limits.json_max_depth, limits.json_max_elements)
            except JsonLimitExceeded as exc:
                return self._error(proto, 413 if exc.reason == "json_too_many_elements" else 400, str(exc)), NO_BACKEND
        rid = request_id(incoming.get("x-request-id"), self.ids)
        headers = [(k, v) for k, v in incoming.items() if k not in DROP_REQUEST]
        headers.append((REQUEST_ID_HEADER, rid))
        if scope.client:
            headers.append(("X-Forwarded-For", scope.client.rpartition(":")[0] or scope.client))
        traceparent = next_hop(parse_traceparent(incoming.get("traceparent")), self.ids).header()
        target = path = scope.path
        if scope.query_string:
            target = f"{path}?{scope.query_string}"
        exchange = RsgiExchange(self.pools, scope.method, target, headers, body, traceparent)
        ctx = RequestContext(scope.method, path, len(body), incoming, rid)
        forwarder = self.forwarder
        outcome: Outcome[Answer] = await forwarder.forward(ctx, cast(Exchange[Any, Answer], exchange),
                                                           forwarder.clock() + self.timeout_s, self.timeout_s)
        if outcome.answer is None:
            extra = [(REQUEST_ID_HEADER, rid)]
            if outcome.retry_after is not None:
                extra.append((RETRY_AFTER, outcome.retry_after))
            return self._error(proto, outcome.status, outcome.failure, extra), outcome.backend
        status, reply_headers, reply_body = outcome.answer
        reply_headers.append((REQUEST_ID_HEADER, rid))
        proto.response_bytes(status, reply_headers, reply_body)
        return status, outcome.backend

    @staticmethod
    def _error(proto: Any, status: int, message: str, extra: list[tuple[str, str]] | None = None) -> int:
        proto.response_bytes(status, [("content-type", "application/json"), *(extra or [])], error_body(message))
        return status

    def _refuse(self, proto: Any, rejection: Rejection) -> None:
        headers = list((rejection.headers or {}).items())
        self._error(proto, rejection.status, rejection.message, headers)


app = GranianGateway()


if __name__ == "__main__":
    serve("granian_gateway:app", UPSTREAM_ENV, __doc__)
