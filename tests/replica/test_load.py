"""The replica's load report: the answered rate and busy share of the last whole second, and the queue now."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fleetserve.batching.observer import NullObserver
from fleetserve.replica.load import LoadMeter, LoadReporter
from fleetserve.wire import GPU_THROTTLED, LoadReport, parse_load_report


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class Recorder(NullObserver):
    def __init__(self) -> None:
        self.batches = 0

    def on_batch(self, size: int, seq: int, queue_wait_s: list[float], compute_s: float) -> None:
        self.batches += 1


def test_rates_are_those_of_the_last_whole_second() -> None:
    clock, recorder = Clock(), Recorder()
    meter = LoadMeter(recorder, instances=2, clock=clock)
    assert meter.rates() == (0.0, 0.0)
    for _ in range(4):  # 4 batches of 3 requests, 0.2 s each, within the first second
        clock.now += 0.2
        meter.on_batch(6, 32, [0.001] * 3, 0.2)
    assert meter.rates() == (0.0, 0.0)  # that second has not ended yet
    clock.now = 51.1
    assert meter.rates() == (12.0, pytest.approx(0.4))  # 0.8 busy seconds of 2 instances' one second
    assert recorder.batches == 4  # every call is passed on
    clock.now = 52.5  # a second with nothing answered
    assert meter.rates() == (0.0, 0.0)
    clock.now = 60.0
    meter.on_batch(1, 16, [0.0], 5.0)
    clock.now = 61.0
    assert meter.rates() == (1.0, 1.0)  # the busy share is capped at the whole


def test_the_report_is_orca_with_the_queue_now_and_the_gpu_metrics() -> None:
    clock = Clock()
    meter = LoadMeter(NullObserver(), instances=1, clock=clock)
    meter.on_batch(2, 16, [0.0, 0.0], 0.25)
    clock.now += 1.0
    queue = SimpleNamespace(queue_depth=7, inflight=2)
    text = LoadReporter(queue, meter, lambda: {GPU_THROTTLED: 1.0}).report()
    assert "rps_fractional=2," in text
    # throttling reported, utilisation not: the report says 'no utilisation known', not an idle GPU
    assert parse_load_report(text) == LoadReport(0.25, 7, 2, None, True)
