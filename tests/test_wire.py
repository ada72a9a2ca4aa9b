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
    ("http://a:1=0", "positive number up to 10000, got 0.0"),
    ("http://a:1=-1", "positive number"),
    ("http://a:1=nan", "positive number"),
    ("http://a:1=1e9", "positive number"),
])
def test_bad_weights_name_the_problem(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        wire.parse_weighted(spec)
