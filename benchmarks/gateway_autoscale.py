"""What autoscaling costs the gateway per request, in-process: the forwarding core with autoscaling off and on.

With autoscaling on, the forwarding core calls ``SignalWindow.arrival()`` once per request and
``SignalWindow.observe()`` once per answered attempt (with the attempt's parsed load report); off, it checks
one attribute for None. This runs :meth:`Forwarder.forward` end to end over a balancer of four replicas
(p2c peak-EWMA, the default) with an exchange that answers at once in memory (no sockets: what is left is
the core's own work), alternating off and on, and times each piece of the hot path alone. CPU time of this
process, best of ``--repeat`` runs of ``--n`` requests (other work on a shared box does not count), after
``gc.freeze()`` as in the gateway process (:func:`fleetserve.gateway.workers._tune_gc`).

    .venv/bin/python benchmarks/gateway_autoscale.py [--n 100000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import time
import timeit
from collections.abc import Callable, Coroutine
from typing import Any

from fleetserve.autoscale.window import Membership, SignalWindow
from fleetserve.gateway.balance import Balancer, BalancerConfig, Endpoint, Insert, RequestContext
from fleetserve.gateway.edge.metrics import NullObserver
from fleetserve.gateway.forward.core import Forwarder, Outcome
from fleetserve.gateway.forward.hedge import HedgeConfig
from fleetserve.gateway.metrics import GatewayMetrics
from fleetserve.wire import encode_load_report, parse_load_report

from _common import machine

URLS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]
REPORTS = [encode_load_report(q, 1, 0.5, 100.0) for q in range(4)]


class InMemory:
    """An exchange whose replica answers at once with a load report."""

    def __init__(self) -> None:
        self._i = 0

    async def _reply(self) -> str:
        self._i += 1
        return REPORTS[self._i & 3]

    def send(self, ep: Endpoint, timeout_s: float, traceparent: str | None) -> Coroutine[Any, Any, str]:
        return self._reply()

    def answered(self, ep: Endpoint, reply: str) -> Outcome[str]:
        return Outcome(200, reply, backend=ep.url, verdict=200, report=reply)

    def failed(self, ep: Endpoint, error: Exception) -> Outcome[str]:
        raise error


def forwarder(signals: SignalWindow | None) -> Forwarder:
    metrics = GatewayMetrics()
    balancer = Balancer(BalancerConfig(), rng=random.Random(1), observer=metrics)
    for url in URLS:
        balancer.apply(Insert(Endpoint.from_url(url)))
    return Forwarder(balancer, metrics, HedgeConfig(), NullObserver(), max_retries=1,
                     retry_after="1", overload_retry_after="1", signals=signals)


def forward_us(core: Forwarder, n: int, repeat: int, loop: asyncio.AbstractEventLoop) -> list[float]:
    ctx = RequestContext("POST", "/v2/models/m/infer", 64, {}, "r")
    exchange = InMemory()

    async def many() -> None:
        for _ in range(n):
            deadline = core.clock() + 30.0
            await core.forward(ctx, exchange, deadline, 30.0)

    runs = []
    for _ in range(repeat):
        started = time.process_time()
        loop.run_until_complete(many())
        runs.append((time.process_time() - started) / n * 1e6)
    return runs


def best_us(fn: Callable[[], object], n: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=n, repeat=repeat, timer=time.process_time)) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    loop = asyncio.new_event_loop()
    off = forwarder(None)
    window = SignalWindow(time.monotonic, 1.0, 5.0)
    on = forwarder(window)
    gc.collect()
    gc.freeze()
    runs: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(args.repeat):  # alternate, so drift on a shared box hits both alike
        runs["off"] += forward_us(off, args.n, 1, loop)
        runs["on"] += forward_us(on, args.n, 1, loop)
    best_off, best_on = min(runs["off"]), min(runs["on"])
    window.snapshot(Membership(tuple(URLS)))
    report = REPORTS[1]
    pieces = [
        ("SignalWindow.arrival()", best_us(window.arrival, args.n, args.repeat)),
        ("SignalWindow.observe(url, latency, ok, report)",
         best_us(lambda: window.observe(URLS[1], 0.012, True, parse_load_report(report)), args.n, args.repeat)),
        ("parse_load_report (cached)", best_us(lambda: parse_load_report(report), args.n, args.repeat)),
        ("SignalWindow.snapshot() of 4 replicas, once per tick",
         best_us(lambda: window.snapshot(Membership(tuple(URLS))), max(1, args.n // 100), args.repeat)),
    ]
    loop.close()
    print(f"{machine()}; n={args.n}, best of {args.repeat}\n")
    print("| forwarding core, per request | µs |\n|---|---:|")
    print(f"| autoscaling off | {best_off:.2f} |")
    print(f"| autoscaling on | {best_on:.2f} |")
    print(f"| difference | {best_on - best_off:+.2f} ({(best_on / best_off - 1) * 100:+.1f}%) |\n")
    print("| piece | µs |\n|---|---:|")
    for name, us in pieces:
        print(f"| {name} | {us:.2f} |")


if __name__ == "__main__":
    main()
