"""The forwarding core's spans: a pick span per pick and an attempt span per attempt (retries and hedges
included), each attempt carrying its own span to the replica as the ``traceparent`` parent."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from fleetserve.gateway.balance import Balancer, BalancerConfig, Endpoint, Insert
from fleetserve.gateway.forward.core import Forwarder
from fleetserve.gateway.forward.hedge import HedgeConfig
from fleetserve.gateway.metrics import GatewayMetrics
from fleetserve.gateway.tracing import ForwardSpans
from fleetserve.telemetry import otel
from fleetserve.telemetry.tracing import parse_traceparent
from tests.gateway.forward.test_core import CTX, Clock, Rejections, Script

pytest.importorskip("opentelemetry.sdk", reason="tracing needs the trace extra (opentelemetry-sdk)")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class TracedScript(Script):
    """A script that also keeps the ``traceparent`` each attempt was sent with."""

    def __init__(self, **by_host: str) -> None:
        super().__init__(**by_host)
        self.parents: list[str | None] = []

    def send(self, ep: Endpoint, timeout_s: float, traceparent: str | None):  # type: ignore[no-untyped-def]
        self.parents.append(traceparent)
        return super().send(ep, timeout_s, traceparent)


@pytest.fixture
def exported() -> Iterator[tuple[otel.Tracing, InMemorySpanExporter]]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield otel.Tracing(provider), memory
    provider.shutdown()


def forwarder(hedge: HedgeConfig | None = None) -> tuple[Forwarder, Clock, str, str]:
    """A core in front of replicas a and b, and the hosts its next two picks go to (round-robin)."""
    clock = Clock()
    metrics = GatewayMetrics()
    balancer = Balancer(BalancerConfig(policy="round-robin"), clock=clock, rng=random.Random(1), observer=metrics)
    for host in ("a", "b"):
        balancer.apply(Insert(Endpoint.from_url(f"http://{host}:8000")))
    second = balancer.pick(CTX)
    assert second is not None
    first = "a" if second.host == "b" else "b"
    return Forwarder(balancer, metrics, hedge or HedgeConfig(), Rejections(), max_retries=1, retry_after="1",
                     overload_retry_after="7", clock=clock), clock, first, second.host


def by_start(memory: InMemorySpanExporter) -> list[ReadableSpan]:
    return sorted(memory.get_finished_spans(), key=lambda s: s.start_time or 0)


async def test_a_retry_is_a_second_pick_and_attempt_with_its_resend_count(exported) -> None:
    tracing, memory = exported
    core, clock, first, second = forwarder()
    root = tracing.tracer.start_span("request")
    spans = ForwardSpans.of(tracing, root, "round-robin", "http", "POST")
    script = TracedScript(**{first: "busy", second: "ok"})
    outcome = await core.forward(CTX, script, clock.now + 1.0, 1.0, spans)
    root.end()
    assert (outcome.status, len(script.sent)) == (200, 2)
    pick_a, attempt_a, pick_b, attempt_b = [s for s in by_start(memory) if s.name != "request"]
    assert [s.name for s in (pick_a, attempt_a, pick_b, attempt_b)] == ["pick", "POST", "pick", "POST"]
    assert pick_a.attributes["fleetserve.replica"] == f"http://{first}:8000"
    assert pick_a.attributes["fleetserve.balancer.policy"] == "round-robin"
    assert attempt_a.attributes["http.response.status_code"] == 503 and "http.request.resend_count" not in (
        attempt_a.attributes)
    assert attempt_b.attributes["http.response.status_code"] == 200
    assert attempt_b.attributes["http.request.resend_count"] == 1
    assert all(s.parent is not None and s.parent.span_id == root.get_span_context().span_id
               for s in (pick_a, attempt_a, pick_b, attempt_b))
    # Each attempt told its replica that its own span is the parent.
    sent = [parse_traceparent(p) for p in script.parents]
    assert [p.parent_id if p else None for p in sent] == [f"{attempt_a.context.span_id:016x}",
                                                          f"{attempt_b.context.span_id:016x}"]


async def test_a_hedge_is_an_attempt_marked_hedge_and_the_loser_is_marked_cancelled(exported) -> None:
    tracing, memory = exported
    core, clock, first, second = forwarder(HedgeConfig(percentile=50, min_samples=1, window=8, min_delay_ms=1,
                                        max_extra_percent=100))
    core._hedger.observe(CTX.method, CTX.path, 0.001)
    root = tracing.tracer.start_span("request")
    spans = ForwardSpans.of(tracing, root, "round-robin", "http", "POST")
    script = TracedScript(**{first: "hang", second: "ok"})
    outcome = await core.forward(CTX, script, clock.now + 1.0, 1.0, spans)
    root.end()
    assert (outcome.status, len(script.sent)) == (200, 2)
    attempts = {s.attributes["fleetserve.replica"]: s for s in memory.get_finished_spans() if s.name == "POST"}
    assert attempts[f"http://{second}:8000"].attributes["fleetserve.hedge"] is True
    assert "fleetserve.hedge" not in attempts[f"http://{first}:8000"].attributes
    assert attempts[f"http://{first}:8000"].attributes["error.type"] == "cancelled"
    assert [s.name for s in memory.get_finished_spans()].count("pick") == 2


async def test_an_untraced_request_creates_no_span_and_sends_the_request_context_unchanged(exported) -> None:
    tracing, memory = exported
    core, clock, _, _ = forwarder()
    unsampled = tracing.tracer.start_span("request", context=tracing.extract(
        {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}))
    assert ForwardSpans.of(tracing, unsampled, "round-robin", "http", "POST") is None
    assert ForwardSpans.of(None, unsampled, "round-robin", "http", "POST") is None
    script = TracedScript(a="ok", b="ok")
    await core.forward(CTX, script, clock.now + 1.0, 1.0, None)
    assert script.parents == [None] and memory.get_finished_spans() == ()
