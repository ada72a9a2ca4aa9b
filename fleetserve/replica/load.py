"""The load report a replica puts on every response: ORCA's ``endpoint-load-metrics`` (see :mod:`fleetserve.wire`).

Read from the batcher at the moment the response leaves (rows queued and running, over the rows one round of
batches on every engine instance takes) and, where a GPU monitor runs, from its latest background sample,
so reporting never waits on NVML. HTTP responses carry it as a header, gRPC calls as trailing metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from fleetserve.wire import encode_load_report


class QueueState(Protocol):
    """What the report reads from the batcher (:class:`~fleetserve.batching.worker.Batcher`)."""

    @property
    def queue_depth(self) -> int: ...

    @property
    def inflight(self) -> int: ...

    @property
    def round_rows(self) -> int: ...


class LoadReporter:
    """``report()`` is the ``endpoint-load-metrics`` value for this instant."""

    __slots__ = ("_batcher", "_capacity", "_gpu")

    def __init__(self, batcher: QueueState, gpu: Callable[[], Mapping[str, float]] | None = None) -> None:
        self._batcher = batcher
        self._capacity = batcher.round_rows
        self._gpu = gpu

    def report(self) -> str:
        batcher = self._batcher
        gpu = self._gpu() if self._gpu is not None else None
        return encode_load_report(batcher.queue_depth, batcher.inflight, self._capacity, gpu)
