"""SignalWindow: rates and percentiles over sliding windows, per replica and for the fleet, bounded memory."""

from __future__ import annotations

import random

import pytest

from fleetserve.autoscale.window import Membership, SignalWindow, percentile
from fleetserve.wire import LoadReport
from tests.support.clock import FakeClock

A, B, C = "http://127.0.0.1:9001", "http://127.0.0.1:9003", "http://127.0.0.1:9005"


def test_arrival_rate_is_counted_over_the_rate_window_and_forgets_older_seconds() -> None:
    clock = FakeClock(100.0)
    window = SignalWindow(clock, rate_window_s=2.0, latency_window_s=5.0)
    for _ in range(40):  # 40 requests/s for 10 s, spread evenly
        for _ in range(10):
            window.arrival()
            clock.advance(0.025)
    snap = window.snapshot(Membership(ready=(A,)))
    assert snap.at_s == pytest.approx(110.0)
    assert snap.request_rate == pytest.approx(40.0, rel=0.05)
    clock.advance(3.0)  # nothing for longer than the window
    assert window.snapshot(Membership(ready=(A,))).request_rate == 0.0


def test_percentiles_match_the_exact_ones_within_the_bucket_error() -> None:
    clock = FakeClock(0.0)
    window = SignalWindow(clock, rate_window_s=1.0, latency_window_s=5.0)
    rng = random.Random(7)
    latencies = [rng.lognormvariate(-4.0, 0.8) for _ in range(5000)]
    for i, latency in enumerate(latencies):
        window.observe(A, latency, True, None)
        if i % 1000 == 999:
            clock.advance(1.0)
    snap = window.snapshot(Membership(ready=(A,)))
    ordered = sorted(latencies)
    assert snap.p50_s == pytest.approx(ordered[2499], rel=0.02)
    assert snap.p99_s == pytest.approx(ordered[4949], rel=0.02)
    assert snap.replicas[0].p99_s == snap.p99_s


def test_failed_answers_count_toward_the_rate_but_not_the_latency() -> None:
    clock = FakeClock(0.0)
    window = SignalWindow(clock)
    window.observe(A, 0.010, True, None)
    window.observe(A, 5.0, False, None)
    clock.advance(0.5)
    snap = window.snapshot(Membership(ready=(A,)))
    assert snap.replicas[0].request_rate == pytest.approx(2 / 1.5)
    assert snap.p99_s == pytest.approx(0.010, rel=0.02)


def test_latency_window_slides() -> None:
    clock = FakeClock(0.0)
    window = SignalWindow(clock, latency_window_s=3.0)
    window.observe(A, 2.0, True, None)
    clock.advance(2.0)
    window.observe(A, 0.1, True, None)
    assert window.snapshot(Membership(ready=(A,))).p99_s == pytest.approx(2.0, rel=0.02)
    clock.advance(2.5)  # the slow answer's second has left the 3 s window
    assert window.snapshot(Membership(ready=(A,))).p99_s == pytest.approx(0.1, rel=0.02)
    clock.advance(10.0)
    snap = window.snapshot(Membership(ready=(A,)))
    assert snap.p99_s is None and snap.p50_s is None


def test_fleet_load_sums_the_ready_replicas_latest_reports() -> None:
    clock = FakeClock(0.0)
    window = SignalWindow(clock)
    window.observe(A, 0.01, True, LoadReport(0.5, queue_depth=3, inflight=8, gpu_utilization=0.6))
    window.observe(A, 0.01, True, LoadReport(0.7, queue_depth=5, inflight=8, gpu_utilization=0.8,
                                             gpu_throttled=True))
    window.observe(B, 0.01, True, LoadReport(0.3, queue_depth=1, inflight=4, gpu_utilization=0.4))
    window.observe(C, 0.01, True, LoadReport(0.9, queue_depth=50, inflight=8))
    window.observe(B, 0.01, True, None)  # an answer without a report keeps the last one
    snap = window.snapshot(Membership(ready=(A, B), starting=("http://x",), draining=(C,)), held=2,
                           startup_s=1.5)
    assert (snap.ready, snap.starting, snap.draining, snap.held, snap.startup_s) == (2, 1, 1, 2, 1.5)
    assert snap.current == 3
    assert snap.queue_depth == 6 and snap.inflight == 12  # the draining replica's load is not the fleet's
    assert snap.gpu_utilization == pytest.approx(0.6)
    assert snap.utilization == pytest.approx(0.5)
    assert snap.gpu_throttled == 1
    assert [(r.url, r.ready) for r in snap.replicas] == [(A, True), (B, True), (C, False)]


def test_a_replica_without_answers_has_no_load_and_no_latency() -> None:
    window = SignalWindow(FakeClock(0.0))
    snap = window.snapshot(Membership(ready=(A,)))
    (replica,) = snap.replicas
    assert (replica.request_rate, replica.queue_depth, replica.p99_s, replica.utilization) == (0.0, 0.0, None, None)
    assert snap.gpu_utilization is None and snap.utilization is None


def test_replicas_that_left_the_membership_are_forgotten() -> None:
    clock = FakeClock(0.0)
    window = SignalWindow(clock)
    window.observe(A, 0.01, True, LoadReport(queue_depth=9))
    window.snapshot(Membership(ready=(B,)))
    snap = window.snapshot(Membership(ready=(A,)))  # A is back: nothing of its old report remains
    assert snap.queue_depth == 0 and snap.replicas[0].request_rate == 0


def test_memory_is_bounded_by_the_windows_not_the_traffic() -> None:
    clock = FakeClock(0.0)
    window = SignalWindow(clock, rate_window_s=2.0, latency_window_s=4.0)
    rng = random.Random(1)
    for _ in range(20_000):
        window.observe(A, rng.expovariate(50.0), True, None)
        window.arrival()
        clock.advance(0.01)
    ring = window._fleet._slots  # white box: the ring holds one slot per second of the longest window, plus one
    assert len(ring) == 5
    assert all(slot is not None and len(slot.latencies) < 1000 for slot in ring)


def test_percentile_of_an_empty_histogram_is_none() -> None:
    assert percentile({}, 0, 99.0) is None


def test_windows_shorter_than_a_slot_are_refused() -> None:
    with pytest.raises(ValueError, match="rate_window_s"):
        SignalWindow(FakeClock(), rate_window_s=0.5)
