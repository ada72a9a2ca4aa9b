"""Dynamic batching: merge concurrent requests into sequence-bucketed batches for an engine.

``collator`` holds the pure policy (which requests form the next batch, and when), ``tensors`` pads
and splits arrays, ``worker`` runs the asyncio loop that feeds engine instances on threads.
"""

from fleetserve.batching.config import BatcherConfig
from fleetserve.batching.observer import BatchObserver, NullObserver
from fleetserve.batching.worker import Batcher

__all__ = ["BatchObserver", "Batcher", "BatcherConfig", "NullObserver"]
