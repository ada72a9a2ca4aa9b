"""The deadline a caller forwards with a request, as the replica reads it.

The gateway sends what is left of a request's deadline in ``X-Fleetserve-Timeout-Ms`` (milliseconds,
``fleetserve.wire.TIMEOUT_HEADER``);
the replica turns it into an absolute deadline on ``time.monotonic()`` (the batcher's clock) when the
request arrives, and the batcher answers 504 for a request still queued at that moment, never running
it: nobody waits for that answer any more. A gRPC call carries its own deadline (``grpc-timeout``),
read with ``ServicerContext.time_remaining()``. Both bound only queueing: a batch that already started
runs to its end.
"""

from __future__ import annotations

import math
import time

from fleetserve.errors import InvalidInput
from fleetserve.wire import TIMEOUT_HEADER


def forwarded_deadline(value: str | None, now: float | None = None) -> float | None:
    """The absolute deadline (``time.monotonic()`` seconds) a ``X-Fleetserve-Timeout-Ms`` value sets, if any.

    A value that is not a positive number of milliseconds is the caller's mistake (``InvalidInput``).
    """
    if value is None:
        return None
    try:
        ms = float(value)
    except ValueError:
        ms = math.nan
    if not (math.isfinite(ms) and ms > 0):
        raise InvalidInput(f"{TIMEOUT_HEADER} must be a positive number of milliseconds, got {value!r}")
    return (time.monotonic() if now is None else now) + ms / 1000


def remaining_deadline(remaining_s: float | None, now: float | None = None) -> float | None:
    """The absolute deadline for ``remaining_s`` seconds left (gRPC's ``time_remaining()``; None: no deadline)."""
    if remaining_s is None:
        return None
    return (time.monotonic() if now is None else now) + remaining_s
