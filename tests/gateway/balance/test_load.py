import math

import pytest

from fleetserve.gateway.balance.load import (
    EndpointLoad,
    LoadConfig,
    PeakEwma,
    ReportedLoad,
    outstanding,
    peak_ewma_cost,
    pending_cost,
    reported_cost,
)
from fleetserve.gateway.balance.slowstart import SlowStartConfig
from fleetserve.wire import encode_load_report


def test_peak_ewma_jumps_to_a_higher_sample() -> None:
    ewma = PeakEwma(tau_s=10.0, initial_s=0.02, now=0.0)
    ewma.observe(0.5, now=1.0)
    assert ewma.estimate(1.0) == 0.5


def test_first_sample_replaces_the_default() -> None:
    ewma = PeakEwma(tau_s=10.0, initial_s=0.05, now=0.0)
    ewma.observe(0.01, now=0.0)
    assert ewma.estimate(0.0) == 0.01


def test_peak_ewma_moves_towards_a_lower_sample_by_elapsed_time() -> None:
    ewma = PeakEwma(tau_s=10.0, initial_s=0.05, now=0.0)
    ewma.observe(0.1, now=0.0)
    ewma.observe(0.0, now=10.0)
    # One tau later the old value keeps weight exp(-1).
    assert ewma.estimate(10.0) == pytest.approx(0.1 * math.exp(-1))
    ewma.observe(0.01, now=10.001)
    # A sample right after the last barely moves the estimate: the weight is time-based, not per-sample.
    assert ewma.estimate(10.001) == pytest.approx(0.1 * math.exp(-1), rel=1e-3)


def test_peak_ewma_decays_while_idle_without_mutating() -> None:
    ewma = PeakEwma(tau_s=10.0, initial_s=0.2, now=0.0)
    assert ewma.estimate(10.0) == pytest.approx(0.2 * math.exp(-1))
    assert ewma.estimate(0.0) == 0.2
    assert ewma.estimate(1e6) > 0.0


def test_failure_at_least_doubles_the_estimate_even_when_fast() -> None:
    ewma = PeakEwma(tau_s=10.0, initial_s=0.02, now=0.0)
    ewma.observe_failure(0.001, now=0.0)
    assert ewma.estimate(0.0) == pytest.approx(0.04)
    ewma.observe_failure(0.001, now=0.0)
    assert ewma.estimate(0.0) == pytest.approx(0.08)
    ewma.observe_failure(1.0, now=0.0)
    assert ewma.estimate(0.0) == 1.0


def test_reported_load_reads_the_orca_report_and_fades() -> None:
    reported = ReportedLoad(max_age_s=4.0)
    assert reported.freshness(0.0) == 0.0
    report = encode_load_report(7, 3, gpu={"gpu_utilization": 0.85, "gpu_throttled": 1.0})
    assert reported.update(report, now=10.0)
    last = reported.last
    assert (last.queue_depth, last.inflight) == (7, 3)
    assert last.gpu_utilization == pytest.approx(0.85)
    assert last.gpu_throttled is True
    assert reported.freshness(10.0) == 1.0
    assert reported.freshness(12.0) == pytest.approx(0.5)
    assert reported.freshness(14.0) == 0.0
    assert reported.age(13.0) == pytest.approx(3.0)


def test_reported_load_keeps_the_last_valid_report() -> None:
    reported = ReportedLoad(max_age_s=4.0)
    assert not reported.update("JSON {}", now=1.0)
    assert reported.reported_at is None
    assert reported.update("TEXT named_metrics.queue_depth=5", now=2.0)
    assert not reported.update("TEXT named_metrics.queue_depth=lots", now=3.0)
    assert (reported.last.queue_depth, reported.reported_at) == (5, 2.0)


def test_endpoint_load_cost_and_effective_weight() -> None:
    load = EndpointLoad(3, LoadConfig(ewma_default_rtt_s=0.05), SlowStartConfig(window_s=10.0), now=0.0)
    assert peak_ewma_cost(load, load, 0.0) == pytest.approx(0.05 / 3)
    load.pending = 3
    assert peak_ewma_cost(load, load, 0.0) == pytest.approx(0.2 / 3)
    assert pending_cost(load, load, 0.0) == pytest.approx(4 / 3)
    assert load.effective_weight(0.0) == 3.0
    load.ramp.restart(0.0)
    assert load.effective_weight(5.0) == pytest.approx(1.5)
    load.sent_since_report = 3
    assert load.unreported_pending() == 3
    load.pending = 1  # two of them finished without a report
    assert load.unreported_pending() == 1
    load.report("not a report", now=5.0)
    assert load.unreported_pending() == 1
    load.report("TEXT named_metrics.queue_depth=1", now=5.0)
    assert load.unreported_pending() == 0


@pytest.mark.parametrize("kwargs", [{"ewma_tau_s": 0.0}, {"ewma_default_rtt_s": -1.0}, {"report_max_age_s": 0.0}])
def test_load_config_rejects_non_positive(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        LoadConfig(**kwargs)


def test_admitted_restarts_the_ramp_and_forgets_latency() -> None:
    load = EndpointLoad(1, LoadConfig(ewma_default_rtt_s=0.05), SlowStartConfig(window_s=10.0), now=0.0)
    load.ewma.observe(0.3, now=0.0)
    load.admitted(100.0)
    assert load.ewma.estimate(100.0) == pytest.approx(0.05)
    assert load.effective_weight(100.0) == pytest.approx(0.1)
    load.ewma.observe(0.01, now=100.0)
    assert load.ewma.estimate(100.0) == pytest.approx(0.01)


def test_outpaced_by_a_hedge_counts_like_a_failure_in_the_estimate() -> None:
    load = EndpointLoad(1, LoadConfig(), SlowStartConfig(), now=0.0)
    load.ewma.observe(0.005, now=0.0)
    load.outpaced(0.020, now=0.0)  # the hedge answered 20 ms in; this replica still had not
    assert load.ewma.estimate(0.0) == pytest.approx(0.020)
    load.outpaced(0.020, now=0.0)
    assert load.ewma.estimate(0.0) == pytest.approx(0.040)  # again: at least double


def loaded(pending: int = 0, weight: float = 1.0) -> EndpointLoad:
    load = EndpointLoad(weight, LoadConfig(report_max_age_s=4.0), SlowStartConfig(), now=0.0)
    load.pending = load.sent_since_report = pending
    return load


def test_outstanding_work_blends_the_report_with_local_pending_as_it_ages() -> None:
    load = loaded(pending=2)
    assert outstanding(load, 0.0) == 2  # no report: this gateway's own count
    load.report(encode_load_report(queue_depth=10, inflight=4), now=0.0)
    assert outstanding(load, 0.0) == 14  # every gateway's work, as the replica saw it
    load.pending = load.sent_since_report = 1  # sent after the report
    assert outstanding(load, 0.0) == 15
    assert outstanding(load, 2.0) == pytest.approx(0.5 * 15 + 0.5 * 1)
    assert outstanding(load, 4.0) == 1


def test_peak_ewma_cost_reads_the_reported_queue() -> None:
    idle_here, busy_here = loaded(pending=0), loaded(pending=3)
    for load in (idle_here, busy_here):
        load.ewma.observe(0.010, now=0.0)
    assert peak_ewma_cost(idle_here, busy_here, 0.0) < peak_ewma_cost(busy_here, idle_here, 0.0)
    # Another gateway filled the "idle" replica's queue: its report says so.
    idle_here.report(encode_load_report(queue_depth=20, inflight=8), now=0.0)
    busy_here.report(encode_load_report(queue_depth=0, inflight=3), now=0.0)
    busy_here.sent_since_report = 0
    assert peak_ewma_cost(idle_here, busy_here, 0.0) > peak_ewma_cost(busy_here, idle_here, 0.0)


def test_peak_ewma_cost_of_an_unmeasured_endpoint_borrows_its_rivals_latency() -> None:
    new, warm = loaded(), loaded(pending=1)
    warm.ewma.observe(0.003, now=0.0)
    assert peak_ewma_cost(new, warm, 0.0) == pytest.approx(0.003)
    assert peak_ewma_cost(warm, new, 0.0) == pytest.approx(0.006)


def test_reported_cost_weighs_gpu_state_by_freshness() -> None:
    plain, hot, throttled = loaded(), loaded(), loaded()
    plain.report(encode_load_report(1, 0), now=0.0)
    hot.report(encode_load_report(1, 0, gpu={"gpu_utilization": 1.0}), now=0.0)
    throttled.report(encode_load_report(1, 0, gpu={"gpu_throttled": 1.0}), now=0.0)
    assert [reported_cost(x, x, 0.0) for x in (plain, hot, throttled)] == [2.0, 4.0, 8.0]
    assert reported_cost(throttled, throttled, 2.0) == pytest.approx((0.5 * 1 + 1) * 2.5)
    assert reported_cost(loaded(pending=3, weight=2.0), plain, 0.0) == 2.0
