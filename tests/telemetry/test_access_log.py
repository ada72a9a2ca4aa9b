"""The access log: one line per request with its fields, a token bucket under overload, and the count of lines
it held back."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from fleetserve.telemetry import logs
from fleetserve.telemetry.access_log import AccessLog, AccessLogConfig
from tests.support.clock import FakeClock


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(logs.TraceIdFilter())
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("fleetserve.test.access")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, stream
    logger.handlers.clear()


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_line_names_trace_route_status_latency_replica_attempts_and_bytes(captured) -> None:
    logger, stream = captured
    AccessLog(10, logger=logger).request("POST", "/v2/models/m/infer", 200, 0.01234, trace_id="ab" * 16,
                                         replica="http://127.0.0.1:8000", attempts=2, bytes_in=300, bytes_out=40)
    [line] = lines(stream)
    assert line["trace_id"] == "ab" * 16
    assert {k: line[k] for k in ("method", "path", "status", "latency_ms", "replica", "attempts", "bytes_in",
                                 "bytes_out")} == {
        "method": "POST", "path": "/v2/models/m/infer", "status": 200, "latency_ms": 12.34,
        "replica": "http://127.0.0.1:8000", "attempts": 2, "bytes_in": 300, "bytes_out": 40}
    assert line["message"] == ("POST /v2/models/m/infer 200 12.34ms replica=http://127.0.0.1:8000 attempts=2 "
                               "bytes=300/40")


def test_without_a_given_trace_id_the_current_requests_is_used(captured) -> None:
    logger, stream = captured
    token = logs.trace_id_var.set("cd" * 16)
    try:
        AccessLog(10, logger=logger).request("GET", "/v2", 200, 0.001)
    finally:
        logs.trace_id_var.reset(token)
    assert lines(stream)[0]["trace_id"] == "cd" * 16


def test_over_the_rate_lines_are_counted_not_written_and_the_count_rides_on_the_next_line(captured) -> None:
    logger, stream = captured
    clock = FakeClock(100.0)
    log = AccessLog(5, logger=logger, clock=clock)  # 5 lines/s, bursts of 5
    for _ in range(12):
        log.request("POST", "/v2/models/m/infer", 503, 0.001)
    assert len(lines(stream)) == 5 and log.suppressed == 7
    clock.advance(0.2)  # one token back
    log.request("POST", "/v2/models/m/infer", 200, 0.001)
    written = lines(stream)
    assert len(written) == 6 and written[-1]["suppressed"] == 7 and log.suppressed == 0
    assert "suppressed" not in written[0]
    log.request("POST", "/v2/models/m/infer", 200, 0.001)
    assert len(lines(stream)) == 6 and log.suppressed == 1


def test_a_logger_above_info_costs_no_token_and_no_line(captured) -> None:
    logger, stream = captured
    logger.setLevel(logging.WARNING)
    log = AccessLog(1, logger=logger, clock=FakeClock())
    log.request("GET", "/v2", 200, 0.001)
    logger.setLevel(logging.INFO)
    log.request("GET", "/v2", 200, 0.001)
    assert len(lines(stream)) == 1


def test_rate_zero_turns_it_off_and_a_negative_rate_is_refused() -> None:
    assert AccessLog.create(AccessLogConfig(access_log_rate=0)) is None
    assert AccessLog.create(AccessLogConfig()) is not None
    with pytest.raises(ValueError, match="access_log_rate"):
        AccessLogConfig(access_log_rate=-1)
