"""When one request waited and ran in the batcher, for a caller that asks (the replica's tracing).

A caller that wants the times sets :data:`TIMING` to a fresh :class:`JobTiming` around its
:meth:`~fleetserve.batching.worker.Batcher.submit`; the batcher fills it in (wall-clock nanoseconds, the
stamps trace spans carry). A caller that does not ask costs the batcher one context-variable read per
request. A context variable rather than a parameter, so that the front ends reach the batcher through
:class:`~fleetserve.replica.model.ServedModel` unchanged.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass


@dataclass(slots=True)
class JobTiming:
    queued_ns: int = 0  # entered the queue
    dispatched_ns: int = 0  # its batch went to an engine instance
    finished_ns: int = 0  # the batch's results were back on the event loop
    batch_rows: int = 0  # rows in its batch
    seq: int = 0  # the sequence bucket its batch was padded to
    instance: int = -1  # which engine instance ran it


TIMING: contextvars.ContextVar[JobTiming | None] = contextvars.ContextVar("fleetserve_job_timing", default=None)
