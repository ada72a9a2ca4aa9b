"""Callbacks through which the batcher reports what it does (the replica's metrics implement them).

The batcher calls every method on its event loop thread, so implementations need no locking; they
must be quick and must not raise.
"""

from __future__ import annotations

from typing import Protocol


class BatchObserver(Protocol):
    def on_batch(self, size: int, seq: int, queue_wait_s: list[float], compute_s: float) -> None:
        """A batch of ``size`` rows padded to ``seq`` ran in ``compute_s``; one queue wait per request."""

    def on_expired(self, n: int) -> None:
        """``n`` requests passed their deadline in the queue and were answered ``RequestExpired``."""

    def on_rejected(self) -> None:
        """A request was turned away with ``Overloaded``/``NotReady`` (full queue, draining, not started)."""

    def on_cancelled(self, n: int) -> None:
        """``n`` queued requests were taken out of the queue unrun because their callers gave up."""


class NullObserver:
    """Observes nothing; the default when no observer is given."""

    def on_batch(self, size: int, seq: int, queue_wait_s: list[float], compute_s: float) -> None:
        pass

    def on_expired(self, n: int) -> None:
        pass

    def on_rejected(self) -> None:
        pass

    def on_cancelled(self, n: int) -> None:
        pass
