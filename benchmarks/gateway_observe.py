"""The gateway's per-request metrics work, in-process: what recording one request's latencies costs.

Per proxied request the gateway records one upstream attempt (``observe_attempt``: a labelled latency
histogram) and, once the response is written, the end-to-end latency (aiohttp's access-logger hook,
:mod:`fleetserve.gateway.access`, which also makes aiohttp read the loop clock twice). This times each piece
against ``prometheus_client.Histogram`` with the same 28 buckets, as CPU time of this process (other work
on a shared box does not count), best of ``--repeat`` runs of ``--n`` calls with latencies drawn around
10 ms (where a linear bucket scan goes half way).

    .venv/bin/python benchmarks/gateway_observe.py [--n 200000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import timeit
from collections.abc import Callable

from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from prometheus_client import CollectorRegistry, Histogram

from fleetserve.gateway.access import LOGGER, access_logger
from fleetserve.gateway.metrics import LATENCY_BUCKETS, GatewayMetrics

BACKEND = "http://10.0.0.1:8000"


def best_us(fn: Callable[[], object], n: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=n, repeat=repeat, timer=time.process_time)) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(1)
    values = [rng.lognormvariate(-4.6, 0.6) for _ in range(1024)]
    i = iter(range(1 << 62))

    def value() -> float:
        return values[next(i) & 1023]

    baseline = best_us(value, args.n, args.repeat)
    client = Histogram("x_seconds", "x", ["backend"], buckets=LATENCY_BUCKETS, registry=CollectorRegistry())
    child = client.labels(BACKEND)
    metrics = GatewayMetrics()
    metrics.observe_attempt(BACKEND, 0.01)
    recorder = access_logger(metrics)(LOGGER, "")
    request = make_mocked_request("POST", "/v2/models/m/infer")
    admin = make_mocked_request("GET", "/metrics")
    response = web.Response()
    loop = asyncio.new_event_loop()
    rows = [
        ("prometheus_client Histogram child .observe (28 buckets)", best_us(lambda: child.observe(value()), args.n,
                                                                            args.repeat) - baseline),
        ("GatewayMetrics.observe_attempt (LatencyHistogram)", best_us(lambda: metrics.observe_attempt(BACKEND, value()),
                                                                      args.n, args.repeat) - baseline),
        ("end-to-end hook: access logger on a proxied path", best_us(lambda: recorder.log(request, response, value()),
                                                                     args.n, args.repeat) - baseline),
        ("end-to-end hook: access logger on an admin path", best_us(lambda: recorder.log(admin, response, value()),
                                                                    args.n, args.repeat) - baseline),
        ("aiohttp's two loop.time() reads with a logger set", best_us(lambda: (loop.time(), loop.time()), args.n,
                                                                      args.repeat)),
    ]
    loop.close()
    print("| per request | µs |\n|---|---|")
    for name, us in rows:
        print(f"| {name} | {us:.2f} |")


if __name__ == "__main__":
    main()
