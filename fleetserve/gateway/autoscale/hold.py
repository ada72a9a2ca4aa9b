"""Scale from zero: requests wait here, in a bounded queue, while the fleet has no replica to send them to.

Knative's activator does this for a revision scaled to zero: it buffers the request, pokes the autoscaler,
and proxies the request once a pod is ready. Here the forwarding core, finding no replica at all, calls
:meth:`HoldQueue.hold`; the first request to wait wakes the autoscaler at once (``on_hold``) rather than at
its next tick; when the balancer admits a replica the queue is released in arrival order and each request
goes back to picking one. A request is refused at once when the queue is full, and given up when its
deadline (or the hold timeout, whichever is sooner) passes first; both answers are the gateway's 503 with
``Retry-After``. The queue holds futures only: the requests' bodies stay with their handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections import deque
from collections.abc import Callable

from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.balance.health import HealthState


class Held(enum.StrEnum):
    """How a wait ended: a metrics label and the forwarding core's cue."""

    RELEASED = "released"  # a replica became ready: pick again
    FULL = "full"  # the queue was at its bound: refused without waiting
    TIMEOUT = "timeout"  # the deadline or the hold timeout passed first


class HoldQueue:
    """At most ``capacity`` requests waiting for a first ready replica, each for at most ``timeout_s``."""

    def __init__(self, capacity: int, timeout_s: float, *, clock: Callable[[], float] = time.monotonic,
                 on_hold: Callable[[], None] | None = None,
                 on_end: Callable[[Held], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"hold queue capacity must be >= 1, got {capacity}")
        if not timeout_s > 0:
            raise ValueError(f"hold timeout must be > 0, got {timeout_s}")
        self.capacity = capacity
        self.timeout_s = timeout_s
        self._clock = clock
        self._on_hold = on_hold
        self._on_end = on_end
        self._waiting: deque[asyncio.Future[None]] = deque()

    @property
    def held(self) -> int:
        """Requests waiting now."""
        return len(self._waiting)

    async def hold(self, deadline: float) -> Held:
        """Wait until :meth:`release`, ``deadline`` (on the injected clock) or the hold timeout; FULL at once
        when ``capacity`` requests are already waiting."""
        if len(self._waiting) >= self.capacity:
            return self._end(Held.FULL)
        wait_s = min(deadline - self._clock(), self.timeout_s)
        if wait_s <= 0:
            return self._end(Held.TIMEOUT)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        if len(self._waiting) == 1 and self._on_hold is not None:
            self._on_hold()
        try:
            async with asyncio.timeout(wait_s):
                await waiter
        except TimeoutError:
            return self._end(Held.TIMEOUT)
        finally:
            # Gone already when released; still here on a timeout or a cancelled (disconnected) client.
            with contextlib.suppress(ValueError):
                self._waiting.remove(waiter)
        return self._end(Held.RELEASED)

    def refusal(self, how: Held) -> str:
        """Why a request that ended its wait ``how`` (FULL or TIMEOUT) is refused, for its 503."""
        if how is Held.FULL:
            return f"no replica is ready yet and {self.capacity} requests are already waiting for one"
        return "no replica became ready while the request waited"

    def release(self) -> int:
        """Wake every waiting request, oldest first (their tasks resume in this order); how many."""
        count = 0
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                count += 1
        return count

    def _end(self, how: Held) -> Held:
        if self._on_end is not None:
            self._on_end(how)
        return how


class ReleaseOnReady:
    """A balancer observer that releases ``queue`` when an endpoint becomes routable (turns healthy, or is
    re-admitted after an ejection): the held requests then pick it."""

    def __init__(self, queue: HoldQueue) -> None:
        self._queue = queue

    def on_eject(self, ep: Endpoint) -> None:
        return None

    def on_readmit(self, ep: Endpoint) -> None:
        self._queue.release()

    def on_state_change(self, ep: Endpoint, state: str) -> None:
        if state == HealthState.HEALTHY:
            self._queue.release()
