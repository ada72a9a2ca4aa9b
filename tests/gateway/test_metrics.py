"""GatewayMetrics as the balancer's observer: backend state counts, ejections, forgetting removed ones."""

from __future__ import annotations

from fleetserve.gateway.balance import REMOVED
from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.metrics import NO_BACKEND, GatewayMetrics

A = Endpoint.from_url("http://10.0.0.1:8000")
B = Endpoint.from_url("http://10.0.0.2:8000")


def states(metrics: GatewayMetrics) -> dict[str, float]:
    return {s: metrics.registry.get_sample_value("fleetserve_gateway_backends", {"state": s}) or 0.0
            for s in ("unknown", "healthy", "unhealthy", "ejected")}


def test_each_instance_has_its_own_registry() -> None:
    first, second = GatewayMetrics(), GatewayMetrics()
    first.retries.inc()
    assert first.registry.get_sample_value("fleetserve_gateway_retries_total") == 1.0
    assert second.registry.get_sample_value("fleetserve_gateway_retries_total") == 0.0


def test_backend_states_follow_observer_calls() -> None:
    metrics = GatewayMetrics()
    metrics.on_state_change(A, "unknown")
    metrics.on_state_change(B, "healthy")
    assert states(metrics) == {"unknown": 1, "healthy": 1, "unhealthy": 0, "ejected": 0}
    metrics.on_state_change(A, "healthy")
    metrics.on_eject(B)
    assert states(metrics) == {"unknown": 0, "healthy": 1, "unhealthy": 0, "ejected": 1}
    assert metrics.registry.get_sample_value("fleetserve_gateway_ejections_total", {"backend": B.url}) == 1
    metrics.on_readmit(B)
    metrics.on_state_change(A, "unhealthy")
    assert states(metrics) == {"unknown": 0, "healthy": 1, "unhealthy": 1, "ejected": 0}


def test_removed_backends_leave_the_scrape() -> None:
    metrics = GatewayMetrics()
    metrics.on_state_change(A, "healthy")
    metrics.observe_request(A.url, 200)
    metrics.observe_request(A.url, 503)
    metrics.observe_request(NO_BACKEND, 503)
    metrics.observe_attempt(A.url, 0.01)
    metrics.on_eject(A)
    assert A.url in metrics.render().decode()
    metrics.on_state_change(A, REMOVED)
    text = metrics.render().decode()
    assert A.url not in text
    assert 'fleetserve_gateway_requests_total{backend="none",code="503"} 1.0' in text
    assert states(metrics) == {"unknown": 0, "healthy": 0, "unhealthy": 0, "ejected": 0}


def test_a_new_backends_ejection_counter_starts_at_zero() -> None:
    """Prometheus' increase() sees the first ejection only if the series existed at 0 before it."""
    metrics = GatewayMetrics()
    metrics.on_state_change(A, "unknown")
    assert metrics.registry.get_sample_value("fleetserve_gateway_ejections_total", {"backend": A.url}) == 0.0
    metrics.on_eject(A)
    metrics.on_state_change(A, "healthy")
    assert metrics.registry.get_sample_value("fleetserve_gateway_ejections_total", {"backend": A.url}) == 1.0


def test_process_metrics_and_end_to_end_histogram_are_exposed() -> None:
    metrics = GatewayMetrics()
    metrics.request_duration.series().observe(0.012)
    text = metrics.render().decode()
    assert "process_cpu_seconds_total" in text and "process_resident_memory_bytes" in text
    assert 'fleetserve_gateway_request_duration_seconds_bucket{le="0.0125"} 1.0' in text
    assert 'fleetserve_gateway_request_duration_seconds_bucket{le="0.01"} 0.0' in text
