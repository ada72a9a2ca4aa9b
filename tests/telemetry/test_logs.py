"""Log lines as text or JSON, with the request's trace id; child processes log like their parent."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator

import pytest

from fleetserve.telemetry import logs
from tests.support.procs import gateway, replica


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level, settings = list(root.handlers), root.level, logs.settings()
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logs.install(*settings)
    root.handlers[:] = handlers


def test_json_lines_carry_trace_id_fields_and_exceptions() -> None:
    formatter = logs.JsonFormatter()
    record = logging.LogRecord("fleetserve.x", logging.WARNING, __file__, 1, "took %d ms", (12,), None)
    record.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    record.fields = {"route": "/inference", "status": 200}
    entry = json.loads(formatter.format(record))
    assert entry["level"] == "warning" and entry["logger"] == "fleetserve.x" and entry["message"] == "took 12 ms"
    assert entry["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert entry["route"] == "/inference" and entry["status"] == 200
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", entry["time"])
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        failed = logging.LogRecord("fleetserve.x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert "RuntimeError: boom" in json.loads(formatter.format(failed))["exception"]


def test_install_switches_the_format_and_refuses_unknown_ones(restore_logging: None,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    logs.install("info", "json")
    token = logs.trace_id_var.set("0af7651916cd43dd8448eb211c80319c")
    try:
        logging.getLogger("fleetserve.test").info("hello %s", "there")
    finally:
        logs.trace_id_var.reset(token)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert json.loads(line)["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert logs.settings() == ("info", "json")
    with pytest.raises(ValueError, match="log format"):
        logs.install("info", "yaml")


def _json_records(output: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def _listening(output: str) -> int:
    return sum("listening on" in str(r["message"]) for r in _json_records(output))


def test_replica_and_gateway_workers_log_json_when_asked() -> None:
    text_line = re.compile(r"^\d{4}-\d\d-\d\d \S+ (?:INFO|WARNING|ERROR) ", re.M)
    with replica("tiny", "--log-format", "json", grpc=False) as served, \
            gateway([served.url], "--log-format", "json", "--workers", "2") as front:
        # Each worker logs at the parent's level, so both log their INFO "listening" line.
        deadline = time.monotonic() + 30
        while _listening(front.output()) < 2:
            assert time.monotonic() < deadline, front.output()
            time.sleep(0.05)
    for output in (served.output(), front.output()):
        assert not text_line.search(output), output
    assert any(r["logger"] == "fleetserve.replica.server" for r in _json_records(served.output()))
