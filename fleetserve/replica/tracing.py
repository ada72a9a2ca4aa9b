"""The replica's spans (when tracing is on, :mod:`fleetserve.telemetry.otel`), below the gateway's attempt.

For each inference request whose trace is sampled: the request (``SERVER``, continuing the ``traceparent``
it came with; HTTP semantic-convention name and attributes, or RPC ones for gRPC), and below it, for KServe v2
inference (``/infer`` and ``ModelInfer``; ``/inference`` sends its texts in chunks and has the request span
alone), ``decode``
(reading and decoding the body), ``queue wait`` (in the batcher's queue until its batch went to an engine
instance), ``batch`` (that batch's execution: ``fleetserve.batch.size`` rows, ``fleetserve.batch.bucket``,
``fleetserve.batch.instance``) and ``encode`` (the answer's serialisation). The batcher's two spans are
written after the fact from the times it stamped (:mod:`fleetserve.batching.timing`): the batcher knows no
tracing, and one batch serves several requests, each of which gets its own copy of the batch span.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from fleetserve.batching.timing import TIMING, JobTiming
from fleetserve.telemetry import otel

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

# The request's span (an OpenTelemetry Span) on the aiohttp request, for its handler.
SPAN_KEY: web.RequestKey[Any] = web.RequestKey("fleetserve.span", object)


def server_span(tracing: otel.Tracing, name: str, carrier: Mapping[str, str], attributes: dict[str, Any]) -> Span:
    from opentelemetry.trace import SpanKind

    return tracing.tracer.start_span(name, context=tracing.extract(carrier), kind=SpanKind.SERVER,
                                     attributes=attributes)


class RequestSpans:
    """The stages of one recording request, as children of its span."""

    __slots__ = ("_context", "_tracer")

    def __init__(self, tracer: Tracer, parent: Span) -> None:
        from opentelemetry.trace import set_span_in_context

        self._tracer = tracer
        self._context: Context = set_span_in_context(parent)

    @classmethod
    def of(cls, tracing: otel.Tracing | None, span: Span | None) -> RequestSpans | None:
        """Spans for a request whose span records; None otherwise (tracing off, or not sampled)."""
        if tracing is None or span is None or not span.is_recording():
            return None
        return cls(tracing.tracer, span)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """A span around the block (``decode``, ``encode``)."""
        span = self._tracer.start_span(name, context=self._context)
        try:
            yield
        finally:
            span.end()

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        """Around the call into the model: the batcher stamps its times, written out as two spans after."""
        timing = JobTiming()
        token = TIMING.set(timing)
        try:
            yield
        finally:
            TIMING.reset(token)
            self._batch_spans(timing)

    def _batch_spans(self, timing: JobTiming) -> None:
        if not timing.queued_ns or not timing.dispatched_ns:
            return  # refused, expired or cancelled before it ran: the request's own span says how it ended
        wait = self._tracer.start_span("queue wait", context=self._context, start_time=timing.queued_ns)
        wait.end(end_time=timing.dispatched_ns)
        if timing.finished_ns:
            attributes = {"fleetserve.batch.size": timing.batch_rows, "fleetserve.batch.bucket": timing.seq,
                          "fleetserve.batch.instance": timing.instance}
            batch = self._tracer.start_span("batch", context=self._context, start_time=timing.dispatched_ns,
                                            attributes=attributes)
            batch.end(end_time=timing.finished_ns)
