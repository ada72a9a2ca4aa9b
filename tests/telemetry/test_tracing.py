"""W3C traceparent parsing and propagation, and X-Request-ID handling."""

from __future__ import annotations

import random

import pytest

from fleetserve.telemetry.tracing import IdGenerator, TraceParent, next_hop, parse_traceparent, request_id

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_parse_valid_header() -> None:
    parsed = parse_traceparent(VALID)
    assert parsed == TraceParent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1)
    assert parsed.sampled
    assert parsed.header() == VALID
    assert parse_traceparent(f"  {VALID} ") == parsed


@pytest.mark.parametrize(
    "value",
    [
        None, "", "00", VALID.upper(), VALID + "-", VALID[:-1],
        "ff" + VALID[2:],  # version ff is forbidden
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero parent id
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz",
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
    ],
)
def test_invalid_headers_are_rejected(value: str | None) -> None:
    assert parse_traceparent(value) is None


def test_future_versions_are_read_as_version_00() -> None:
    parsed = parse_traceparent("cc" + VALID[2:] + "-what-comes-next")
    assert parsed is not None and parsed.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert parse_traceparent("cc" + VALID[2:]) is not None


def test_next_hop_keeps_trace_and_sampled_flag_with_a_new_span() -> None:
    ids = IdGenerator(random.Random(1))
    parent = TraceParent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 0xFF)
    hop = next_hop(parent, ids)
    assert hop.trace_id == parent.trace_id
    assert hop.parent_id != parent.parent_id and len(hop.parent_id) == 16
    assert hop.flags == 1  # unknown flag bits are not passed on
    assert parse_traceparent(hop.header()) == hop


def test_new_trace_when_none_came_in() -> None:
    hop = next_hop(None, IdGenerator(random.Random(2)))
    assert parse_traceparent(hop.header()) == hop
    assert not hop.sampled


def test_ids_are_repeatable_with_a_seeded_rng_and_never_zero() -> None:
    first, second = IdGenerator(random.Random(5)), IdGenerator(random.Random(5))
    assert [first.trace_id(), first.span_id()] == [second.trace_id(), second.span_id()]

    class Zeros(random.Random):
        calls = 0

        def getrandbits(self, k: int) -> int:
            self.calls += 1
            return 0 if self.calls == 1 else 1

    assert IdGenerator(Zeros()).span_id() == "0000000000000001"


def test_request_id_is_kept_when_sane() -> None:
    ids = IdGenerator(random.Random(3))
    assert request_id("req-42_a.b:c", ids) == "req-42_a.b:c"
    for bad in (None, "", "has space", "x" * 129, "bad\u00e9"):
        generated = request_id(bad, ids)
        assert len(generated) == 32 and generated != bad
