"""One access-log line per request (gateway and replica), rate-limited so that logging never becomes the bottleneck.

Each line names the request's trace id, method and path, status, latency, bytes in and out, and at the gateway the
replica that answered and the number of attempts (retries and hedges included). In ``--log-format json``
these are fields of the line's object (``path``, ``status``, ``latency_ms``, ...); in text, ``key=value`` pairs.

A token bucket (rate ``access_log_rate`` lines a second, as many in a burst) bounds the lines written: under
overload the lines beyond it are not formatted or written at all, only counted, and the next line written
carries that count (``suppressed``). The bucket is the textbook one (Tanenbaum, *Computer Networks*, §5.4.2);
the caller's event loop is its only user, so it needs no lock.

Lines are formatted as the process's log format formats an INFO record of ``fleetserve.access``
(:class:`~fleetserve.telemetry.logs.LineFormatter`, no :class:`logging.LogRecord` per line) and written in
batches, as NGINX's ``access_log ... buffer= flush=`` and Envoy's file access log (flushed every second) do:
a batch goes out when it holds ``MAX_BUFFERED_LINES`` lines, ``flush_interval_s`` after its first line (a timer
on the running event loop), and when the server stops (:meth:`AccessLog.flush`). Through ``logging``, with a
record, a formatter and a flushed write per line, a line cost a saturated gateway 80–160 µs of CPU
(BENCHMARKS.md §7.1).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from fleetserve.options import option
from fleetserve.telemetry import logs

LOGGER = logging.getLogger("fleetserve.access")
MAX_BUFFERED_LINES = 64
FLUSH_INTERVAL_S = 1.0


def write_stderr(text: str) -> None:
    """Write to whatever ``sys.stderr`` is now (test runners swap it), at once."""
    stream = sys.stderr
    stream.write(text)
    stream.flush()


@dataclass(frozen=True)
class AccessLogConfig:
    access_log_rate: float = option(1000.0, "access-log lines a second at most, in bursts of as many; lines over "
                                    "it are counted and the count logged with the next line (0: no access log)")

    def __post_init__(self) -> None:
        if not self.access_log_rate >= 0:
            raise ValueError(f"access_log_rate must be >= 0, got {self.access_log_rate}")


class AccessLog:
    """Request lines at INFO on ``logger``'s level, at most ``rate`` a second, formatted in ``fmt`` (default: the
    installed log format) and written to ``sink`` in batches (see the module docstring)."""

    __slots__ = ("_buffer", "_burst", "_clock", "_flush_interval_s", "_format", "_last", "_logger", "_rate",
                 "_sink", "_suppressed", "_timer", "_tokens", "_wall_clock")

    def __init__(self, rate: float, *, logger: logging.Logger = LOGGER, fmt: str | None = None,
                 sink: Callable[[str], None] = write_stderr, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, flush_interval_s: float = FLUSH_INTERVAL_S) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        self._rate = rate
        self._burst = max(1.0, rate)
        self._tokens = self._burst
        self._clock = clock
        self._wall_clock = wall_clock
        self._last = clock()
        self._logger = logger
        self._format = logs.LineFormatter(fmt or logs.settings()[1], logger.name)
        self._sink = sink
        self._flush_interval_s = flush_interval_s
        self._buffer: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._suppressed = 0

    @classmethod
    def create(cls, config: AccessLogConfig) -> AccessLog | None:
        """The access log ``config`` asks for; None when it is off (rate 0)."""
        return cls(config.access_log_rate) if config.access_log_rate > 0 else None

    @property
    def suppressed(self) -> int:
        """Lines counted but not written since the last line written."""
        return self._suppressed

    def _admit(self) -> bool:
        now = self._clock()
        tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if tokens < 1.0:
            self._tokens = tokens
            self._suppressed += 1
            return False
        self._tokens = tokens - 1.0
        return True

    def request(self, method: str, path: str, status: int, latency_s: float, *, trace_id: str | None = None,
                replica: str | None = None, attempts: int | None = None, bytes_in: int = 0,
                bytes_out: int = 0) -> None:
        """Log one request, unless the bucket is empty (then it is only counted). ``trace_id`` defaults to the
        current request's."""
        if not self._logger.isEnabledFor(logging.INFO) or not self._admit():
            return
        latency_ms = latency_s * 1000
        fields: dict[str, object] = {"method": method, "path": path, "status": status,
                                     "latency_ms": round(latency_ms, 3), "bytes_in": bytes_in,
                                     "bytes_out": bytes_out}
        extra = ""
        if replica is not None:
            fields["replica"] = replica
            extra += f" replica={replica}"
        if attempts is not None:
            fields["attempts"] = attempts
            extra += f" attempts={attempts}"
        if self._suppressed:
            fields["suppressed"] = self._suppressed
            extra += f" suppressed={self._suppressed}"
            self._suppressed = 0
        message = f"{method} {path} {status} {latency_ms:.2f}ms{extra} bytes={bytes_in}/{bytes_out}"
        line = self._format.line(self._wall_clock(), trace_id or logs.trace_id_var.get(), message, fields)
        buffer = self._buffer
        buffer.append(line)
        if len(buffer) >= MAX_BUFFERED_LINES:
            self.flush()
        elif len(buffer) == 1:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no event loop to flush later on: write it now
                self.flush()
            else:
                self._timer = loop.call_later(self._flush_interval_s, self.flush)

    def flush(self) -> None:
        """Write the lines held back (a server calls this when it stops)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._buffer:
            text = "".join(self._buffer)
            self._buffer.clear()
            self._sink(text)
