"""The load report a replica puts on every response: ORCA's ``endpoint-load-metrics`` (see :mod:`fleetserve.wire`).

:class:`LoadMeter` sits between the batcher and its observer and keeps, per whole second, the requests the
batches answered and the time the engine instances spent computing them; the report gives the last whole
second's rate (``rps_fractional``) and busy share (``application_utilization``), and the batcher's queue and
running rows at the moment the response leaves. Where a GPU monitor runs, its latest background sample adds
the GPU's named metrics, so reporting never waits on NVML. HTTP responses carry the report as a header,
gRPC calls as trailing metadata.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Protocol

from fleetserve.batching.observer import BatchObserver
from fleetserve.wire import encode_load_report

WINDOW_S = 1.0


class QueueState(Protocol):
    """What the report reads from the batcher (:class:`~fleetserve.batching.worker.Batcher`)."""

    @property
    def queue_depth(self) -> int: ...

    @property
    def inflight(self) -> int: ...


class LoadMeter:
    """A batch observer that passes every call on and measures the answered rate and busy share per second."""

    __slots__ = (
        "_busy",
        "_capacity_s",
        "_clock",
        "_last_busy",
        "_last_requests",
        "_observer",
        "_requests",
        "_window_end",
    )

    def __init__(self, observer: BatchObserver, instances: int, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._observer = observer
        self._capacity_s = WINDOW_S * instances
        self._clock = clock
        self._window_end = clock() + WINDOW_S
        self._requests = 0
        self._busy = 0.0
        self._last_requests = 0
        self._last_busy = 0.0

    def _roll(self, now: float) -> None:
        if now < self._window_end:
            return
        if now < self._window_end + WINDOW_S:  # the window that just ended is the last whole second
            self._last_requests, self._last_busy = self._requests, self._busy
            self._window_end += WINDOW_S
        else:  # a whole second or more went by with nothing answered
            self._last_requests, self._last_busy = 0, 0.0
            self._window_end = now + WINDOW_S
        self._requests, self._busy = 0, 0.0

    def rates(self) -> tuple[float, float]:
        """Requests answered per second and the engine instances' busy share, over the last whole second."""
        self._roll(self._clock())
        return self._last_requests / WINDOW_S, min(1.0, self._last_busy / self._capacity_s)

    def on_batch(self, size: int, seq: int, queue_wait_s: list[float], compute_s: float) -> None:
        self._roll(self._clock())
        self._requests += len(queue_wait_s)
        self._busy += compute_s
        self._observer.on_batch(size, seq, queue_wait_s, compute_s)

    def on_expired(self, n: int) -> None:
        self._observer.on_expired(n)

    def on_rejected(self) -> None:
        self._observer.on_rejected()

    def on_cancelled(self, n: int) -> None:
        self._observer.on_cancelled(n)


class LoadReporter:
    """``report()`` is the ``endpoint-load-metrics`` value for this instant."""

    __slots__ = ("_gpu", "_meter", "_queue")

    def __init__(self, queue: QueueState, meter: LoadMeter,
                 gpu: Callable[[], Mapping[str, float]] | None = None) -> None:
        self._queue = queue
        self._meter = meter
        self._gpu = gpu

    def report(self) -> str:
        rps, utilization = self._meter.rates()
        gpu = self._gpu() if self._gpu is not None else None
        return encode_load_report(self._queue.queue_depth, self._queue.inflight, utilization, rps, gpu)
