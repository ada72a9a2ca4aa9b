"""Hold every packet of an NFQUEUE queue for a fixed time, then let it through: a link that delays, not drops.

``python -m fleetserve.bench.nfdelay --queue N --delay-ms MS`` binds netfilter queue ``N`` of its network
namespace (run it there with ``ip netns exec``), prints ``ready`` once bound, and from then on accepts each
queued packet ``MS`` milliseconds after it arrived, in arrival order (a constant delay keeps that order, so
a FIFO is the whole schedule). An iptables rule ``-j NFQUEUE --queue-num N`` decides which packets come
here; it is added only after ``ready``. On SIGTERM or SIGINT every held packet is let through at once and
the process exits 0.

This stands in for ``tc qdisc ... netem delay`` where the kernel lacks ``sch_netem`` (it is an optional
module; some VM kernels leave it out), using the kernel's nfnetlink_queue through ``fnfqueue``
(https://github.com/notti/fnfqueue). Packets are queued with their metadata only (``COPY_META``): this
process never reads or changes their contents.
"""

from __future__ import annotations

import argparse
import collections
import signal
import sys
import threading
import time
from typing import Any

# The kernel keeps at most this many packets waiting for a verdict; beyond it new ones are dropped.
QUEUE_MAXLEN = 10_000
_POLL_S = 0.05


class Delayer:
    """Accepts each packet ``delay_s`` after :meth:`hold` saw it; :meth:`flush` lets all of them through."""

    def __init__(self, delay_s: float, clock: Any = time.monotonic) -> None:
        self.delay_s = delay_s
        self._clock = clock
        self._held: collections.deque[tuple[float, Any]] = collections.deque()
        self._wake = threading.Event()
        self.stopping = threading.Event()

    def hold(self, packet: Any) -> None:
        self._held.append((self._clock() + self.delay_s, packet))
        self._wake.set()

    def due(self) -> float | None:
        """Seconds until the oldest held packet is due (None: nothing held)."""
        return self._held[0][0] - self._clock() if self._held else None

    def release_due(self) -> int:
        """Accept every packet whose time has come; returns how many."""
        released = 0
        while self._held and self._held[0][0] <= self._clock():
            self._held.popleft()[1].accept()
            released += 1
        return released

    def flush(self) -> int:
        """Accept every held packet now."""
        released = 0
        while self._held:
            self._held.popleft()[1].accept()
            released += 1
        return released

    def run_releases(self, on_stop: Any) -> None:
        """The release loop (its own thread): accept packets as they fall due; on stop, flush and ``on_stop()``."""
        while not self.stopping.is_set():
            self.release_due()
            wait = self.due()
            self._wake.wait(_POLL_S if wait is None else max(0.0, min(wait, _POLL_S)))
            self._wake.clear()
        self.flush()
        on_stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetserve.bench.nfdelay", description=__doc__)
    parser.add_argument("--queue", type=int, default=0, help="netfilter queue number (0..65535)")
    parser.add_argument("--delay-ms", type=float, required=True, help="how long each packet is held")
    args = parser.parse_args(argv)
    if not 0 <= args.queue <= 65535 or not args.delay_ms > 0:
        parser.error("--queue must be in 0..65535 and --delay-ms > 0")
    import fnfqueue

    conn = fnfqueue.Connection(alloc_size=64, chunk_size=16, packet_size=4096)
    queue = conn.bind(args.queue)
    queue.set_mode(0, fnfqueue.COPY_META)
    queue.set_maxlen(QUEUE_MAXLEN)
    delayer = Delayer(args.delay_ms / 1000)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: delayer.stopping.set())
    releaser = threading.Thread(target=delayer.run_releases, args=(conn.close,), daemon=True)
    releaser.start()
    print("ready", flush=True)
    for packet in conn:
        delayer.hold(packet)
    releaser.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
