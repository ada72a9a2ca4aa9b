"""One access-log line per request (gateway and replica), rate-limited so that logging never becomes the bottleneck.

Each line names the request's trace id, method and path, status, latency, bytes in and out, and at the gateway the
replica that answered and the number of attempts (retries and hedges included). In ``--log-format json``
these are fields of the line's object (``path``, ``status``, ``latency_ms``, ...); in text, ``key=value`` pairs.

A token bucket (rate ``access_log_rate`` lines a second, as many in a burst) bounds the lines written: under
overload the lines beyond it are not formatted or written at all, only counted, and the next line written
carries that count (``suppressed``). The bucket is the textbook one (Tanenbaum, *Computer Networks*, §5.4.2);
the caller's event loop is its only user, so it needs no lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from fleetserve.options import option

LOGGER = logging.getLogger("fleetserve.access")
_FORMAT = "%s %s %d %.2fms%s bytes=%d/%d"


@dataclass(frozen=True)
class AccessLogConfig:
    access_log_rate: float = option(1000.0, "access-log lines a second at most, in bursts of as many; lines over "
                                    "it are counted and the count logged with the next line (0: no access log)")

    def __post_init__(self) -> None:
        if not self.access_log_rate >= 0:
            raise ValueError(f"access_log_rate must be >= 0, got {self.access_log_rate}")


class AccessLog:
    """Writes request lines to ``logger`` at INFO, at most ``rate`` a second (see the module docstring)."""

    __slots__ = ("_burst", "_clock", "_last", "_logger", "_rate", "_suppressed", "_tokens")

    def __init__(self, rate: float, *, logger: logging.Logger = LOGGER,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        self._rate = rate
        self._burst = max(1.0, rate)
        self._tokens = self._burst
        self._clock = clock
        self._last = clock()
        self._logger = logger
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
        """Log one request, unless the bucket is empty (then it is only counted)."""
        if not self._logger.isEnabledFor(logging.INFO) or not self._admit():
            return
        fields: dict[str, object] = {"method": method, "path": path, "status": status,
                                     "latency_ms": round(latency_s * 1000, 3), "bytes_in": bytes_in,
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
        given: dict[str, object] = {"fields": fields}
        if trace_id is not None:
            given["trace_id"] = trace_id
        # makeRecord + handle is what Logger.info does, less its walk up the stack for the caller's file and line,
        # which an access line does not need (a fifth of its cost).
        logger = self._logger
        logger.handle(logger.makeRecord(logger.name, logging.INFO, "", 0, _FORMAT,
                                        (method, path, status, latency_s * 1000, extra, bytes_in, bytes_out), None,
                                        extra=given))
