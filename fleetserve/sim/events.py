"""The simulator's discrete-event core: a clock and a binary heap of timed callbacks.

Why not SimPy: SimPy (process generators, ``Event`` objects, ``Resource`` queues) is the well-kept library for
this, and ``tests/sim/test_events.py`` checks this core against it on the same queue. But the scale target is
1,000 replicas × 1,000,000 requests in ≤ 60 s on a 2-core machine, and on that target's event pattern
(``benchmarks/sim_core.py``; BENCHMARKS.md §8) SimPy took about 7× the CPU time of this loop before any fleet
logic ran: each SimPy step allocates an event, resumes a generator and walks callback lists, where a step here
is one ``heappop`` and one call. The fleet's state machines (replica, gateway worker, server) are plain objects
that schedule their own next callback, so nothing needs coroutines.

Ties are broken by insertion order, so a run is a pure function of its inputs and seeds. Cancelling is
lazy: a callback that may be superseded carries a token and ignores itself when the token is stale.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any

Callback = Callable[[Any], None]


class EventLoop:
    """Simulated time in seconds, starting at 0; ``schedule`` callbacks, ``run`` them in time order."""

    __slots__ = ("_heap", "_order", "now", "steps")

    def __init__(self) -> None:
        self.now = 0.0
        self.steps = 0
        self._heap: list[tuple[float, int, Callback, Any]] = []
        self._order = itertools.count()

    def clock(self) -> float:
        """The simulated time: the ``clock`` every injected component reads."""
        return self.now

    def schedule(self, at: float, callback: Callback, arg: Any = None) -> None:
        """Call ``callback(arg)`` at simulated time ``at``, which must not lie before ``now``."""
        heapq.heappush(self._heap, (at, next(self._order), callback, arg))

    def after(self, delay: float, callback: Callback, arg: Any = None) -> None:
        self.schedule(self.now + delay, callback, arg)

    @property
    def pending(self) -> int:
        return len(self._heap)

    def run(self, until: float = math.inf, stop: Callable[[], bool] | None = None) -> None:
        """Run callbacks in time order until none is due by ``until`` or ``stop()`` turns true."""
        heap = self._heap
        pop = heapq.heappop
        steps = 0
        bounded = until != math.inf  # unbounded (a whole run): no need to peek at the next time
        while heap and (not bounded or heap[0][0] <= until):
            at, _, callback, arg = pop(heap)
            self.now = at
            callback(arg)
            steps += 1
            if stop is not None and steps & 1023 == 0 and stop():
                break
        self.steps += steps
        if until != math.inf and (not heap or heap[0][0] > until):
            self.now = max(self.now, until)
