"""Tracing with the OpenTelemetry SDK: spans exported over OTLP/HTTP (protobuf), off by default.

Tracing is on when a collector is named: ``--otlp-endpoint URL`` (a base URL such as
``http://127.0.0.1:4318``; ``/v1/traces`` is added as ``OTEL_EXPORTER_OTLP_ENDPOINT`` would) or the
standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` environment variables;
``OTEL_SDK_DISABLED=true`` turns it off whatever else is set. The SDK reads the other ``OTEL_*``
variables itself (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER[_ARG]``,
``OTEL_EXPORTER_OTLP_HEADERS``, ``..._TIMEOUT``, ``..._COMPRESSION``, ``OTEL_BSP_*``). ``--trace-sample-ratio``
samples that share of new traces (a caller's sampled flag is followed, so a trace is recorded whole or not
at all; see :meth:`Tracing.samples`); without it the SDK's sampler setting applies (default: every trace).

Off, nothing is imported from OpenTelemetry and the request paths hold ``None`` where a tracer would be:
the cost is one ``is None`` test per place a span could start. A request not sampled creates no span. On,
spans leave through the SDK's ``BatchSpanProcessor`` (a bounded queue, exported from a background thread;
spans beyond the queue are dropped, never waited for). The SDK is the ``trace`` extra
(``pip install fleetserve[trace]``).

Span names and attributes follow the OpenTelemetry semantic conventions for HTTP and RPC spans
(https://opentelemetry.io/docs/specs/semconv/http/http-spans/, .../rpc/grpc/); fleetserve's own attributes
are under ``fleetserve.``.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetserve.errors import UsageError
from fleetserve.options import option
from fleetserve.telemetry.tracing import parse_traceparent

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

_TRACES_PATH = "/v1/traces"
# KServe v2 paths with their variable parts named, for ``http.route`` (low cardinality, as the convention asks).
_MODEL_PATH = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?")


@dataclass(frozen=True)
class TracingConfig:
    otlp_endpoint: str | None = option(
        None, "OTLP/HTTP collector to send traces to, e.g. http://127.0.0.1:4318", metavar="URL",
        default_text="OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, else tracing off")
    trace_sample_ratio: float | None = option(
        None, "share of new traces recorded, 0..1; a caller's sampled flag is followed", metavar="RATIO",
        default_text="OTEL_TRACES_SAMPLER, else every trace")

    def __post_init__(self) -> None:
        ratio = self.trace_sample_ratio
        if ratio is not None and not 0.0 <= ratio <= 1.0:
            raise ValueError(f"trace_sample_ratio must be in 0..1, got {ratio}")
        endpoint = self.otlp_endpoint
        if endpoint is not None and not re.match(r"^https?://[^/\s]+", endpoint):
            raise ValueError(f"otlp_endpoint must be an http:// or https:// URL, got {endpoint!r}")


def _endpoint(config: TracingConfig) -> str | None:
    """The traces URL to export to (None: the exporter reads the environment)."""
    if config.otlp_endpoint is None:
        return None
    base = config.otlp_endpoint.rstrip("/")
    return base if base.endswith(_TRACES_PATH) else base + _TRACES_PATH


def enabled(config: TracingConfig, env: Mapping[str, str] | None = None) -> bool:
    """Whether ``config`` and the environment turn tracing on."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(config.otlp_endpoint or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


class Tracing:
    """A tracer provider of one process, the tracer fleetserve's spans come from, and the sampling decision.

    With ``--trace-sample-ratio`` the decision is made here, before any span exists (:meth:`samples`): a request
    whose caller sent a valid ``traceparent`` follows its sampled flag, a new trace is sampled with probability
    ``ratio``, and one not sampled costs a header parse and creates no span; the request then passes the
    caller's trace context on unsampled (or starts one), as with tracing off, so the next hop records nothing
    either. The SDK's sampler then only follows that decision (``ParentBased(ALWAYS_ON)``).
    """

    def __init__(self, provider: TracerProvider, ratio: float | None = None,
                 rng: random.Random | None = None) -> None:
        from opentelemetry import propagate

        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("fleetserve")
        # Loaded now: the propagators are found through entry points, which takes milliseconds on first use.
        self.extract = propagate.extract
        self._ratio = ratio
        self._random = (rng or random.Random()).random

    def samples(self, traceparent_header: str | None) -> bool:
        """Whether to record the request that came with this ``traceparent`` (None: it had none). Without
        ``--trace-sample-ratio`` every request gets a span and the SDK's configured sampler decides."""
        ratio = self._ratio
        if ratio is None:
            return True
        parent = parse_traceparent(traceparent_header)
        if parent is not None:
            return parent.sampled
        return ratio >= 1.0 or self._random() < ratio

    def shutdown(self) -> None:
        """Export what is queued (bounded by the exporter's timeout) and stop the export thread."""
        self.provider.shutdown()


def start_tracing(config: TracingConfig, service: str, env: Mapping[str, str] | None = None) -> Tracing | None:
    """The process's tracing, or None when it is off (see the module docstring)."""
    env = os.environ if env is None else env
    if not enabled(config, env):
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
    except ImportError as exc:
        raise UsageError(f"tracing needs the OpenTelemetry SDK: pip install 'fleetserve[trace]' ({exc})") from exc
    named = "OTEL_SERVICE_NAME" in env or "service.name" in OTELResourceDetector().detect().attributes
    resource = Resource.create({} if named else {"service.name": service})
    ratio = config.trace_sample_ratio
    sampler = None if ratio is None else ParentBased(ALWAYS_ON)  # the ratio is applied by Tracing.samples
    provider = TracerProvider(resource=resource, sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=_endpoint(config))))
    return Tracing(provider, ratio)


def http_route(path: str) -> str:
    """The route template of a KServe v2 path (``/v2/models/{model}/infer``), for ``http.route``."""
    match = _MODEL_PATH.match(path)
    if match is None:
        return path if path in ("/v2", "/inference") or path.startswith("/v2/health/") else "/v2/{path}"
    versions = "/versions/{version}" if match.group(1) else ""
    return "/v2/models/{model}" + versions + path[match.end():]


def traceparent(span: Span) -> str:
    """The W3C ``traceparent`` that makes ``span`` the parent of the next hop's spans."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def trace_id(span: Span) -> str:
    """``span``'s trace id as 32 hex digits (what the log lines carry)."""
    return f"{span.get_span_context().trace_id:032x}"


def end_server_span(span: Span, status: int, *, grpc_code: int | None = None) -> None:
    """End a request's span with the status the client got (HTTP, or ``grpc_code`` for a gRPC call)."""
    from opentelemetry.trace import StatusCode

    if grpc_code is None:
        span.set_attribute("http.response.status_code", status)
    else:
        span.set_attribute("rpc.grpc.status_code", grpc_code)
    if status >= 500:
        span.set_attribute("error.type", str(status))
        span.set_status(StatusCode.ERROR)
    span.end()
