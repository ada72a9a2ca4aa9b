"""The access log: one line per request with its fields, a token bucket under overload, and the count of lines
it held back."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from fleetserve.telemetry import logs
from fleetserve.telemetry.access_log import MAX_BUFFERED_LINES, AccessLog, AccessLogConfig
from tests.support.clock import FakeClock


class Captured:
    """A logger for the level checks and a stream the lines are written to, as JSON."""

    def __init__(self) -> None:
        self.logger = logging.getLogger("fleetserve.test.access")
        self.logger.setLevel(logging.INFO)
        self.stream = io.StringIO()

    def log(self, rate: float, **kwargs: Any) -> AccessLog:
        return AccessLog(rate, logger=self.logger, fmt="json", sink=self.stream.write, **kwargs)


@pytest.fixture
def captured() -> Iterator[Captured]:
    yield Captured()
    logging.getLogger("fleetserve.test.access").setLevel(logging.NOTSET)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_line_names_trace_route_status_latency_replica_attempts_and_bytes(captured: Captured) -> None:
    stream = captured.stream
    captured.log(10).request("POST", "/v2/models/m/infer", 200, 0.01234, trace_id="ab" * 16,
                                         replica="http://127.0.0.1:8000", attempts=2, bytes_in=300, bytes_out=40)
    [line] = lines(stream)
    assert line["trace_id"] == "ab" * 16
    assert {k: line[k] for k in ("method", "path", "status", "latency_ms", "replica", "attempts", "bytes_in",
                                 "bytes_out")} == {
        "method": "POST", "path": "/v2/models/m/infer", "status": 200, "latency_ms": 12.34,
        "replica": "http://127.0.0.1:8000", "attempts": 2, "bytes_in": 300, "bytes_out": 40}
    assert line["message"] == ("POST /v2/models/m/infer 200 12.34ms replica=http://127.0.0.1:8000 attempts=2 "
                               "bytes=300/40")


def test_without_a_given_trace_id_the_current_requests_is_used(captured: Captured) -> None:
    stream = captured.stream
    token = logs.trace_id_var.set("cd" * 16)
    try:
        captured.log(10).request("GET", "/v2", 200, 0.001)
    finally:
        logs.trace_id_var.reset(token)
    assert lines(stream)[0]["trace_id"] == "cd" * 16


def test_over_the_rate_lines_are_counted_not_written_and_the_count_rides_on_the_next_line(
        captured: Captured) -> None:
    stream = captured.stream
    clock = FakeClock(100.0)
    log = captured.log(5, clock=clock)  # 5 lines/s, bursts of 5
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


def test_a_logger_above_info_costs_no_token_and_no_line(captured: Captured) -> None:
    logger, stream = captured.logger, captured.stream
    logger.setLevel(logging.WARNING)
    log = captured.log(1, clock=FakeClock())
    log.request("GET", "/v2", 200, 0.001)
    logger.setLevel(logging.INFO)
    log.request("GET", "/v2", 200, 0.001)
    assert len(lines(stream)) == 1


def test_rate_zero_turns_it_off_and_a_negative_rate_is_refused() -> None:
    assert AccessLog.create(AccessLogConfig(access_log_rate=0)) is None
    assert AccessLog.create(AccessLogConfig()) is not None
    with pytest.raises(ValueError, match="access_log_rate"):
        AccessLogConfig(access_log_rate=-1)


@pytest.mark.parametrize("fmt", logs.FORMATS)
def test_a_line_reads_exactly_as_the_log_formatter_writes_the_record(fmt: str) -> None:
    created = 1_796_310_000.25  # a quarter past a whole second: no rounding at the millisecond
    record = logging.LogRecord("fleetserve.access", logging.INFO, "", 0, "GET /v2 200 1.00ms", None, None)
    record.created, record.msecs = created, 250.0
    record.trace_id = "ab" * 16
    record.fields = {"status": 200, "path": "/v2"}
    formatter = logs.JsonFormatter() if fmt == "json" else logging.Formatter(logs.TEXT_FORMAT)
    line = logs.LineFormatter(fmt, "fleetserve.access").line(created, "ab" * 16, "GET /v2 200 1.00ms",
                                                            {"status": 200, "path": "/v2"})
    assert line == formatter.format(record) + "\n"


async def test_lines_go_out_in_batches_a_second_apart_or_when_a_batch_is_full(captured: Captured) -> None:
    written: list[str] = []
    log = AccessLog(10_000, logger=captured.logger, fmt="text", sink=written.append, flush_interval_s=0.05)
    log.request("GET", "/v2", 200, 0.001)
    log.request("GET", "/v2", 200, 0.001)
    assert written == []  # held until the batch's timer
    await asyncio.sleep(0.2)
    assert len(written) == 1 and written[0].count("\n") == 2
    for _ in range(MAX_BUFFERED_LINES):
        log.request("GET", "/v2", 200, 0.001)
    assert len(written) == 2 and written[1].count("\n") == MAX_BUFFERED_LINES  # a full batch at once
    log.request("GET", "/v2", 200, 0.001)
    log.flush()  # a stopping server writes what is held
    assert len(written) == 3 and written[2].count("\n") == 1
    await asyncio.sleep(0.1)
    assert len(written) == 3  # the flushed batch's timer was cancelled: nothing twice


def test_without_an_event_loop_each_line_is_written_at_once(captured: Captured) -> None:
    log = captured.log(10)
    log.request("GET", "/v2", 200, 0.001)
    assert len(lines(captured.stream)) == 1
