"""A small OTLP/HTTP trace receiver for tests: what fleetserve exports, decoded from the protobufs.

No OpenTelemetry Collector can be installed from the registries this project reaches (PyPI, Debian, npm), so
the tests receive spans here: ``POST /v1/traces`` with an ``ExportTraceServiceRequest`` body (protobuf,
optionally gzip), decoded with the OpenTelemetry project's own generated classes (``opentelemetry-proto``),
answered with an empty ``ExportTraceServiceResponse`` as the OTLP specification asks
(https://opentelemetry.io/docs/specs/otlp/#otlphttp). It runs on a thread, so a test can drive real
processes synchronously and read the spans as they arrive.
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tests.support.httpthread import serving


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    kind: int  # SpanKind of the OTLP proto: 1 internal, 2 server, 3 client
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def _value(any_value: Any) -> Any:
    field = any_value.WhichOneof("value")
    return None if field is None else getattr(any_value, field)


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def _receive(self, body: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        request = ExportTraceServiceRequest.FromString(body)
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(ReceivedSpan(
                        str(resource.get("service.name", "")), span.name, span.kind, span.trace_id.hex(),
                        span.span_id.hex(), span.parent_span_id.hex(), span.start_time_unix_nano,
                        span.end_time_unix_nano, {a.key: _value(a.value) for a in span.attributes}))
        with self._lock:
            self.spans.extend(spans)
            self.requests += 1


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[OtlpReceiver, str]]:
    """A receiver listening on 127.0.0.1 and its base URL (what ``--otlp-endpoint`` takes)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    receiver = OtlpReceiver()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                self.send_error(404 if self.path != "/v1/traces" else 415)
                return
            receiver._receive(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        yield receiver, url
