"""Logging for every fleetserve process: the current request's W3C trace id on each line, as text or JSON.

The trace id lives in a context variable and a logging filter copies it onto every record
(``%(trace_id)s``). ``text`` is one human-readable line per record; ``json`` is one JSON object per line
(``time`` in RFC 3339 UTC, ``level``, ``logger``, ``trace_id``, ``message``, the record's ``fields`` mapping
when a caller passes ``extra={"fields": {...}}``, and ``exception`` with its traceback), for log pipelines
that parse rather than grep. A process that starts others (gateway workers, ``fleetserve up``'s children)
hands them :func:`settings` so they log alike.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [trace=%(trace_id)s] %(message)s"

trace_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("fleetserve_trace_id", default="-")
_settings = ("info", "text")


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
    """The current request's trace id onto the record, unless the caller gave one (``extra={"trace_id": ...}``:
    a line written after its request's context ended, such as an access-log line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "trace_id", None) is None:
            record.trace_id = trace_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "trace_id": getattr(record, "trace_id", "-"),
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


class LineFormatter:
    """Formats one line exactly as :func:`install`'s formatter for ``fmt`` would format an INFO record of
    ``logger``, from its parts, without a :class:`logging.LogRecord`: for lines written once per request (the
    access log), where building and formatting a record costs several times what the line itself does. The
    time's whole-second part is formatted once per second."""

    __slots__ = ("_json", "_logger", "_second", "_stamp")

    def __init__(self, fmt: str, logger: str) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        self._json = fmt == "json"
        self._logger = logger
        self._second = -1
        self._stamp = ""

    def line(self, created: float, trace_id: str, message: str, fields: Mapping[str, object]) -> str:
        """The line for a record made at ``created`` (epoch seconds), with its newline."""
        second = int(created)
        if second != self._second:
            self._second = second
            if self._json:
                self._stamp = datetime.datetime.fromtimestamp(second, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
            else:
                self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        msecs = int((created - second) * 1000)
        if not self._json:
            return f"{self._stamp},{msecs:03d} INFO {self._logger} [trace={trace_id}] {message}\n"
        entry: dict[str, object] = {"time": f"{self._stamp}.{msecs:03d}+00:00", "level": "info",
                                    "logger": self._logger, "trace_id": trace_id, "message": message}
        entry.update(fields)
        return json.dumps(entry, default=str, separators=(",", ":")) + "\n"


def install(level: str = "info", fmt: str = "text") -> None:
    """Logging with the trace id on each line: fleetserve's own loggers at ``level``, other libraries' at WARNING
    unless ``level`` is debug (ONNX Runtime's optimizer and quantizer narrate every fusion at INFO)."""
    global _settings
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    root = logging.getLogger()
    ours = [h for h in root.handlers if any(isinstance(f, TraceIdFilter) for f in h.filters)]
    if ours:
        handler = ours[0]
    else:
        handler = _StderrHandler()
        handler.addFilter(TraceIdFilter())
        root.handlers[:] = [handler]
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    chosen = logging.getLevelName(level.upper())
    root.setLevel(chosen if chosen <= logging.DEBUG else max(chosen, logging.WARNING))
    logging.getLogger("fleetserve").setLevel(chosen)
    _settings = (level, fmt)


def settings() -> tuple[str, str]:
    """The ``(level, format)`` of the last :func:`install`, for the processes this one starts."""
    return _settings
