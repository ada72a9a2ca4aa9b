"""A synthetic load-generator result with known totals, stalls and errors, and the report built from it."""

from __future__ import annotations

import random

from fleetserve.bench.recorder import RawResult, Recorder
from fleetserve.bench.report import LoadReport, build_report


def synthetic(seed: int = 0) -> RawResult:
    rng = random.Random(seed)
    rec = Recorder(10_000, random.Random(seed))
    for i in range(3000):
        # Seconds 0, 1, 2, each ending early enough that completions stay in their second.
        scheduled = i // 1000 + (i % 1000) / 1100
        rec.record_sent(scheduled)
        if i % 100 == 0:
            rec.record_error("http_503", scheduled + 0.001)
        elif 1000 <= i < 2000:
            continue  # second 1: nothing completes (a stall), its requests time out in second 4
        else:
            latency = rng.uniform(0.001, 0.01)
            rec.record_ok(scheduled + latency, latency, latency / 2)
    for i in range(1000, 2000):
        if i % 100:
            rec.record_error("timeout", 4.5)
    return rec.result(duration_s=3.0, cpu_s=0.7)


def report(raw: RawResult | None = None) -> LoadReport:
    config = {"url": "http://x", "workload": "texts", "arrivals": "constant", "warmup_s": 0.0}
    return build_report(raw or synthetic(), mode="open", config=config, target_rps=1000.0, elapsed_s=5.0)
