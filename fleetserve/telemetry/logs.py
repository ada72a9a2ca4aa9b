"""Trace-id correlation for log lines: the current request's W3C trace id lives in a context variable and a
logging filter copies it onto every record (``%(trace_id)s`` in the format)."""

from __future__ import annotations

import contextvars
import logging
import sys
from typing import Any

LEVELS = ("debug", "info", "warning", "error")

trace_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("fleetserve_trace_id", default="-")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each record, not the one seen at start-up (test
    runners and embedding programs swap it; a handler bound to a closed stream reports errors instead)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        del value


class TraceIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.trace_id = trace_id_var.get()
        return True


def install(level: str = "info") -> None:
    """Logging with the trace id on each line: fleetserve's own loggers at ``level``, other libraries' at WARNING
    unless ``level`` is debug (ONNX Runtime's optimizer and quantizer narrate every fusion at INFO)."""
    root = logging.getLogger()
    if not any(isinstance(f, TraceIdFilter) for h in root.handlers for f in h.filters):
        handler = _StderrHandler()
        handler.addFilter(TraceIdFilter())
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [trace=%(trace_id)s] %(message)s"))
        root.handlers[:] = [handler]
    chosen = logging.getLevelName(level.upper())
    root.setLevel(chosen if chosen <= logging.DEBUG else max(chosen, logging.WARNING))
    logging.getLogger("fleetserve").setLevel(chosen)
