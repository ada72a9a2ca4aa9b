"""Tracing's switch, options and sampling decision (the spans themselves: tests/telemetry/test_otel_trace.py)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from fleetserve.gateway.config import GatewayConfig
from fleetserve.replica.config import ReplicaConfig
from fleetserve.telemetry import otel
from fleetserve.telemetry.otel import TracingConfig

pytest.importorskip("opentelemetry.sdk", reason="tracing needs the trace extra (opentelemetry-sdk)")


def test_off_by_default_and_on_with_an_endpoint_or_the_standard_environment() -> None:
    assert not otel.enabled(TracingConfig(), {})
    assert otel.start_tracing(TracingConfig(), "x", {}) is None
    assert otel.enabled(TracingConfig(otlp_endpoint="http://127.0.0.1:4318"), {})
    assert otel.enabled(TracingConfig(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert otel.enabled(TracingConfig(), {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert not otel.enabled(TracingConfig(otlp_endpoint="http://c:4318"), {"OTEL_SDK_DISABLED": "true"})


def test_off_imports_nothing_from_opentelemetry() -> None:
    code = ("import sys, fleetserve.gateway.server, fleetserve.replica.server; "
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_bad_options_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="trace_sample_ratio"):
        TracingConfig(trace_sample_ratio=1.5)
    with pytest.raises(ValueError, match="otlp_endpoint"):
        TracingConfig(otlp_endpoint="collector:4318")


def test_both_processes_take_the_options() -> None:
    tracing = TracingConfig(otlp_endpoint="http://127.0.0.1:4318", trace_sample_ratio=0.5)
    assert GatewayConfig(backends=("http://127.0.0.1:8000",), tracing=tracing).tracing == tracing
    assert ReplicaConfig(tracing=tracing).tracing == tracing


def test_the_endpoint_is_a_base_url_as_in_the_standard_variable() -> None:
    assert otel._endpoint(TracingConfig(otlp_endpoint="http://c:4318/")) == "http://c:4318/v1/traces"
    assert otel._endpoint(TracingConfig(otlp_endpoint="http://c:4318/v1/traces")) == "http://c:4318/v1/traces"
    assert otel._endpoint(TracingConfig()) is None  # the exporter reads OTEL_EXPORTER_OTLP_* itself


def _tracing(ratio: float | None, seed: int = 1) -> otel.Tracing:
    tracing = otel.start_tracing(TracingConfig(otlp_endpoint="http://127.0.0.1:9", trace_sample_ratio=ratio),
                                 "test", {})
    assert tracing is not None
    tracing._random = random.Random(seed).random
    return tracing


SAMPLED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
UNSAMPLED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"


def test_a_callers_sampled_flag_is_followed_and_new_traces_are_sampled_at_the_ratio() -> None:
    for ratio in (0.0, 0.25, 1.0):
        tracing = _tracing(ratio)
        try:
            assert tracing.samples(SAMPLED) and not tracing.samples(UNSAMPLED)
            share = sum(tracing.samples(None) for _ in range(4000)) / 4000
            assert abs(share - ratio) < 0.03, (ratio, share)
            if ratio in (0.0, 1.0):  # an invalid header starts a new trace
                assert tracing.samples("garbage") is (ratio == 1.0)
        finally:
            tracing.shutdown()


def test_without_a_ratio_every_request_gets_a_span_and_the_sdk_sampler_decides() -> None:
    tracing = _tracing(None)
    try:
        assert tracing.samples(None) and tracing.samples(UNSAMPLED)
    finally:
        tracing.shutdown()


@pytest.mark.parametrize(("path", "route"), [
    ("/v2/models/tiny/infer", "/v2/models/{model}/infer"),
    ("/v2/models/tiny/versions/3/infer", "/v2/models/{model}/versions/{version}/infer"),
    ("/v2/models/tiny", "/v2/models/{model}"),
    ("/v2/health/ready", "/v2/health/ready"),
    ("/inference", "/inference"),
    ("/v2/repository/index", "/v2/{path}"),
])
def test_http_route_names_the_variable_parts(path: str, route: str) -> None:
    assert otel.http_route(path) == route
