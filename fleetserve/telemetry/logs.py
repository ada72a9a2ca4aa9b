"""Trace-id correlation for log lines: the current request's W3C trace id lives in a context variable and a
logging filter copies it onto every record (``%(trace_id)s`` in the format)."""

from __future__ import annotations

import contextvars
import logging

LEVELS = ("debug", "info", "warning", "error")

trace_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("fleetserve_trace_id", default="-")


class TraceIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.trace_id = trace_id_var.get()
        return True


def install(level: str = "INFO") -> None:
    """Root logging with the trace id on each line (idempotent)."""
    root = logging.getLogger()
    if any(isinstance(f, TraceIdFilter) for h in root.handlers for f in h.filters):
        return
    handler = logging.StreamHandler()
    handler.addFilter(TraceIdFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [trace=%(trace_id)s] %(message)s"))
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
