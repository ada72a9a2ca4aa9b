"""The replica<->gateway contract: error bodies, Retry-After, datatypes, ``URL[=WEIGHT]``."""

import json

import numpy as np
import pytest

from fleetserve import wire


def test_error_response_is_the_json_error_body() -> None:
    response = wire.error_response(503, 'queue "full"', {"Retry-After": "2"})
    assert response.status == 503 and response.content_type == "application/json"
    assert response.body is not None and json.loads(bytes(response.body)) == {"error": 'queue "full"'}
    assert response.headers["Retry-After"] == "2"
    assert json.loads(wire.error_body("naïve\nline")) == {"error": "naïve\nline"}


@pytest.mark.parametrize(("seconds", "header"), [(0.0, "1"), (0.2, "1"), (1.0, "1"), (1.01, "2"), (30, "30")])
def test_retry_after_is_whole_seconds_rounded_up(seconds: float, header: str) -> None:
    assert wire.retry_after(seconds) == header


def test_datatypes_are_little_endian_numpy_codes() -> None:
    assert np.dtype(wire.DATATYPES["FP32"]) == np.dtype("<f4")
    assert np.dtype(wire.DATATYPES["INT64"]).itemsize == 8
    assert wire.DATATYPES["BYTES"] == "O"
    assert len(wire.DATATYPES) == 13


@pytest.mark.parametrize(("spec", "parsed"), [
    ("http://a:1", ("http://a:1", 1.0)),
    (" http://a:1=2 ", ("http://a:1", 2.0)),
    ("http://a:1=0.25", ("http://a:1", 0.25)),
])
def test_weighted_urls_parse_to_float_weights(spec: str, parsed: tuple[str, float]) -> None:
    assert wire.parse_weighted(spec) == parsed
    assert wire.parse_weighted(wire.format_weighted(*parsed)) == parsed
    assert wire.format_weighted("http://a:1", 1.0) == "http://a:1"


@pytest.mark.parametrize(("spec", "message"), [
    ("http://a:1=x", "weight 'x' is not a number"),
    ("http://a:1=0", "positive number up to 1000000, got 0.0"),
    ("http://a:1=-1", "positive number"),
    ("http://a:1=nan", "positive number"),
    ("http://a:1=1e9", "positive number"),
])
def test_bad_weights_name_the_problem(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        wire.parse_weighted(spec)


def test_load_report_round_trips_through_the_orca_text_form() -> None:
    text = wire.encode_load_report(6, 2, 0.5, 120.0, {wire.GPU_UTILIZATION: 0.73, wire.GPU_THROTTLED: 1.0})
    assert text == ("TEXT application_utilization=0.5,rps_fractional=120,named_metrics.queue_depth=6,"
                    "named_metrics.inflight=2,named_metrics.gpu_utilization=0.73,named_metrics.gpu_throttled=1")
    assert wire.parse_load_report(text) == wire.LoadReport(0.5, 6, 2, 0.73, True)
    assert wire.encode_load_report(0, 0) == ("TEXT application_utilization=0,rps_fractional=0,"
                                             "named_metrics.queue_depth=0,named_metrics.inflight=0")


def test_load_report_parser_reads_what_envoy_reads() -> None:
    # Envoy's own test input (orca_parser_test.cc), with ':' as well as '=' between a name and its value.
    for sep in "=:":
        text = (f"TEXT cpu_utilization{sep}0.7,application_utilization{sep}0.8,mem_utilization{sep}0.9,"
                f"rps_fractional{sep}1000,eps{sep}2,named_metrics.foo{sep}123,named_metrics.queue_depth{sep}4")
        assert wire.parse_load_report(text) == wire.LoadReport(application_utilization=0.8, queue_depth=4)


@pytest.mark.parametrize("text", [
    None, "", "BIN CgQIARAB", "JSON {\"application_utilization\": 0.5}", "application_utilization=0.5",
    "TEXT named_metrics.queue_depth=nan", "TEXT named_metrics.queue_depth=inf", "TEXT named_metrics.queue_depth=",
    "TEXT named_metrics.queue_depth=1,named_metrics.queue_depth=2", "TEXT =3", "TEXT queue_depth",
])
def test_invalid_or_foreign_reports_are_ignored_whole(text: str | None) -> None:
    assert wire.parse_load_report(text) is None


def test_reported_values_are_clamped() -> None:
    report = wire.parse_load_report("TEXT named_metrics.queue_depth=1e12,named_metrics.inflight=-3,"
                                    "named_metrics.gpu_utilization=7,application_utilization=-1")
    assert report == wire.LoadReport(0.0, 1_000_000, 0, 1.0, False)


def test_a_report_without_gpu_metrics_says_no_gpu_rather_than_an_idle_one() -> None:
    cpu = wire.parse_load_report(wire.encode_load_report(2, 1))
    gpu = wire.parse_load_report(wire.encode_load_report(2, 1, gpu={"gpu_utilization": 0.0}))
    assert cpu is not None and cpu.gpu_utilization is None
    assert gpu is not None and gpu.gpu_utilization == 0.0
