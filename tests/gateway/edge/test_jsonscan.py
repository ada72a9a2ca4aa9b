"""The JSON pre-scan: exact depth, value-count bound, strings ignored, fast on large bodies."""

from __future__ import annotations

import json
import time

import pytest

from fleetserve.gateway.edge.jsonscan import JsonLimitExceeded, check_json_bounds, max_depth


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth


@pytest.mark.parametrize("depth", [1, 5, 31, 32])
def test_depth_at_the_limit_passes_and_one_less_is_refused(depth: int) -> None:
    body = _nested(depth)
    assert max_depth(body) == depth
    check_json_bounds(body, depth_limit=depth, element_limit=1000)
    with pytest.raises(JsonLimitExceeded, match=f"nests {depth} levels deep; the limit is {depth - 1}"):
        check_json_bounds(body, depth_limit=depth - 1, element_limit=1000)


def test_a_bare_scalar_has_depth_zero() -> None:
    assert max_depth(b"1") == 0
    check_json_bounds(b"1", depth_limit=0, element_limit=1)


@pytest.mark.parametrize("depth", [33, 100, 10_000])
def test_depth_beyond_limit_is_refused(depth: int) -> None:
    with pytest.raises(JsonLimitExceeded, match=f"nests {depth} levels") as info:
        check_json_bounds(_nested(depth), depth_limit=32, element_limit=100_000)
    assert info.value.reason == "json_too_deep"


def test_depth_is_the_maximum_not_the_count_of_brackets() -> None:
    body = json.dumps([[[1]] * 50, {"a": [{"b": [2]}]}]).encode()
    assert max_depth(body) == 5  # [ { [ { [
    check_json_bounds(body, depth_limit=5, element_limit=10_000)
    with pytest.raises(JsonLimitExceeded):
        check_json_bounds(body, depth_limit=4, element_limit=10_000)


def test_brackets_and_commas_inside_strings_do_not_count() -> None:
    text = '[[[[ ,,,, }}}} \\" still a string ' * 100
    body = json.dumps({"inputs": [{"data": [text, text]}]}).encode()
    # Counted raw, the body is far past both bounds: only blanking the strings lets it through.
    assert body.count(b"[") > 4 and body.count(b",") > 10
    check_json_bounds(body, depth_limit=4, element_limit=10)
    outside = json.dumps({"inputs": [{"data": [[[[[1, 2]]]]]}]}).encode()
    with pytest.raises(JsonLimitExceeded, match="nests 8 levels"):
        check_json_bounds(outside, depth_limit=4, element_limit=10)


def test_element_count_bound() -> None:
    body = json.dumps({"data": list(range(1000))}).encode()
    check_json_bounds(body, depth_limit=8, element_limit=1002)
    with pytest.raises(JsonLimitExceeded, match="the limit is 500") as info:
        check_json_bounds(body, depth_limit=8, element_limit=500)
    assert info.value.reason == "json_too_many_elements"


def test_many_empty_containers_count_as_elements() -> None:
    with pytest.raises(JsonLimitExceeded) as info:
        check_json_bounds(b"[" + b"[]," * 5000 + b"[]]", depth_limit=8, element_limit=1000)
    assert info.value.reason == "json_too_many_elements"


@pytest.mark.parametrize("body", [b'{"a": "unterminated', b"]]]][[", b"[1,,]"])
def test_malformed_json_within_bounds_is_left_to_the_parser(body: bytes) -> None:
    check_json_bounds(body, depth_limit=4, element_limit=10)
    with pytest.raises(json.JSONDecodeError):
        json.loads(body)


def test_malformed_json_beyond_the_bounds_is_still_refused() -> None:
    with pytest.raises(JsonLimitExceeded, match="nests 6 levels"):
        check_json_bounds(b"[[[[[[", depth_limit=4, element_limit=10)


def test_large_body_is_scanned_quickly() -> None:
    row = "[" + ",".join(["0.123"] * 512) + "]"
    body = ("[" + ",".join([row] * 2000) + "]").encode()  # ~6 MB, a million numbers
    assert len(body) > 5_000_000
    start = time.perf_counter()
    check_json_bounds(body, depth_limit=4, element_limit=2_000_000)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"scan of {len(body)} bytes took {elapsed:.2f} s"
