"""The gateway's per-request observability work, in-process: what recording one request's latencies costs,
what its access-log line costs, and what its spans cost.

Per proxied request the gateway records one upstream attempt (``observe_attempt``: a labelled latency
histogram) and, once the response is written, the end-to-end latency (aiohttp's access-logger hook,
:mod:`fleetserve.gateway.access`, which also makes aiohttp read the loop clock twice). This times each piece
against ``prometheus_client.Histogram`` with the same 28 buckets, as CPU time of this process (other work
on a shared box does not count), best of ``--repeat`` runs of ``--n`` calls with latencies drawn around
10 ms (where a linear bucket scan goes half way).

The access log: one line written (text format, to a null stream), and one over the rate limit (counted, not
written). Tracing (needs the ``trace`` extra): the sampling decision of a request that is not sampled
(``--trace-sample-ratio 0``, with and without a caller's ``traceparent``), and the three spans of a sampled
request (request, pick, attempt, with their attributes) created, ended and encoded to OTLP protobuf by the
SDK's own encoder in this thread; the batch processor's queue and the HTTP post to the collector are left out.

    .venv/bin/python benchmarks/gateway_observe.py [--n 200000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import time
import timeit
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from prometheus_client import CollectorRegistry, Histogram

from fleetserve.gateway.access import LOGGER, access_logger
from fleetserve.gateway.metrics import LATENCY_BUCKETS, GatewayMetrics
from fleetserve.telemetry import logs
from fleetserve.telemetry.access_log import AccessLog

BACKEND = "http://10.0.0.1:8000"


def best_us(fn: Callable[[], object], n: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=n, repeat=repeat, timer=time.process_time)) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(1)
    values = [rng.lognormvariate(-4.6, 0.6) for _ in range(1024)]
    i = iter(range(1 << 62))

    def value() -> float:
        return values[next(i) & 1023]

    baseline = best_us(value, args.n, args.repeat)
    client = Histogram("x_seconds", "x", ["backend"], buckets=LATENCY_BUCKETS, registry=CollectorRegistry())
    child = client.labels(BACKEND)
    metrics = GatewayMetrics()
    metrics.observe_attempt(BACKEND, 0.01)
    recorder = access_logger(metrics, None)(LOGGER, "")
    request = make_mocked_request("POST", "/v2/models/m/infer")
    admin = make_mocked_request("GET", "/metrics")
    response = web.Response()
    loop = asyncio.new_event_loop()
    rows = [
        ("prometheus_client Histogram child .observe (28 buckets)", best_us(lambda: child.observe(value()), args.n,
                                                                            args.repeat) - baseline),
        ("GatewayMetrics.observe_attempt (LatencyHistogram)", best_us(lambda: metrics.observe_attempt(BACKEND, value()),
                                                                      args.n, args.repeat) - baseline),
        ("end-to-end hook: access logger on a proxied path", best_us(lambda: recorder.log(request, response, value()),
                                                                     args.n, args.repeat) - baseline),
        ("end-to-end hook: access logger on an admin path", best_us(lambda: recorder.log(admin, response, value()),
                                                                    args.n, args.repeat) - baseline),
        ("aiohttp's two loop.time() reads with a logger set", best_us(lambda: (loop.time(), loop.time()), args.n,
                                                                      args.repeat)),
    ]
    loop.close()
    rows += access_log_rows(args.n, args.repeat)
    rows += tracing_rows(max(1, args.n // 20), args.repeat)
    print("| per request | µs |\n|---|---|")
    for name, us in rows:
        print(f"| {name} | {us:.2f} |")


def access_log_rows(n: int, repeat: int) -> list[tuple[str, float]]:
    handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115 (closed with the process)
    handler.addFilter(logs.TraceIdFilter())
    handler.setFormatter(logging.Formatter(logs.TEXT_FORMAT))
    logger = logging.getLogger("fleetserve.bench.access")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    written = AccessLog(1e12, logger=logger)
    held = AccessLog(1e-9, logger=logger)
    held.request("POST", "/v2/models/m/infer", 200, 0.01)  # its one token spent

    def line(log: AccessLog) -> None:
        log.request("POST", "/v2/models/m/infer", 200, 0.0123, replica=BACKEND, attempts=1, bytes_in=5000,
                    bytes_out=200)

    return [("access-log line written (text, to /dev/null)", best_us(lambda: line(written), n // 10, repeat)),
            ("access-log line over the rate limit (counted only)", best_us(lambda: line(held), n, repeat))]


def tracing_rows(n: int, repeat: int) -> list[tuple[str, float]]:
    try:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    except ImportError:
        return []
    from fleetserve.gateway.balance import Endpoint
    from fleetserve.gateway.forward.core import Outcome
    from fleetserve.gateway.tracing import ForwardSpans, server_span
    from fleetserve.telemetry import otel

    class Encoding(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            encode_spans(spans).SerializeToString()
            return SpanExportResult.SUCCESS

    zero = otel.start_tracing(otel.TracingConfig("http://127.0.0.1:9", 0.0), "bench", {})
    full = otel.start_tracing(otel.TracingConfig("http://127.0.0.1:9", 1.0), "bench", {})
    assert zero is not None and full is not None
    # The SDK's batch processor as the gateway has it, exporting to an encoder instead of a collector; its queue
    # holds every span of a run, so none is dropped uncounted (its thread's CPU counts: process time).
    full.provider._active_span_processor._span_processors = ()
    batches = BatchSpanProcessor(Encoding(), max_queue_size=3 * n + 1024)
    full.provider.add_span_processor(batches)
    ep = Endpoint.parse(BACKEND)
    header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
    answered: Outcome[Any] = Outcome(200, verdict=200)

    def sampled_request() -> None:
        span = server_span(full, "POST /v2/models/{model}/infer", {}, {
            "http.request.method": "POST", "url.path": "/v2/models/m/infer", "http.route": "/v2/models/{model}/infer",
            "url.scheme": "http", "client.address": "127.0.0.1"})
        spans = ForwardSpans.of(full, span, "p2c-peak-ewma", "http", "POST")
        assert spans is not None
        spans.picked(time.time_ns(), ep, 0.0)
        spans.attempt_done(spans.attempt(ep, 0, False), answered)
        otel.end_server_span(span, 200)

    def traced_us() -> float:
        started = time.process_time()
        for _ in range(n):
            sampled_request()
        batches.force_flush()
        return (time.process_time() - started) / n * 1e6

    rows = [("tracing at ratio 0: sampling decision, no traceparent", best_us(lambda: zero.samples(None), n * 20,
                                                                             repeat)),
            ("tracing at ratio 0: sampling decision, caller's unsampled traceparent",
             best_us(lambda: zero.samples(header), n * 20, repeat)),
            ("tracing at ratio 1: the 3 gateway spans, created, batched and OTLP-encoded",
             min(traced_us() for _ in range(repeat)))]
    zero.shutdown()
    full.shutdown()
    return rows


if __name__ == "__main__":
    main()
