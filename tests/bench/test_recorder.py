from __future__ import annotations

import random

import numpy as np
import pytest

from fleetserve.bench.recorder import Recorder, merge


def test_counts_are_exact_by_kind_and_second() -> None:
    rec = Recorder(100, random.Random(0))
    rec.record_sent(0.1, lag=0.002)
    rec.record_sent(0.9, lag=0.004)
    rec.record_sent(1.2)
    rec.record_dropped(1.5)
    rec.record_ok(0.3, 0.2, 0.15)
    rec.record_error("http_500", 1.1)
    rec.record_error("timeout", 2.5)
    raw = rec.result(duration_s=2.0, cpu_s=0.5)
    assert (raw.requests, raw.sent, raw.ok) == (4, 3, 1)
    assert raw.errors == {"dropped": 1, "http_500": 1, "timeout": 1}
    assert raw.sent_per_s == {0: 2, 1: 1}
    assert raw.ok_per_s == {0: 1}
    assert raw.errors_per_s == {1: 2, 2: 1}
    assert raw.latency_s.tolist() == [0.2] and raw.done_s.tolist() == [0.3]
    assert raw.service_s.tolist() == [0.15]
    assert raw.lag_max_s == 0.004 and raw.lag_sum_s == pytest.approx(0.006) and raw.lag_count == 3


def test_reservoir_keeps_a_uniform_sample_past_the_cap() -> None:
    rec = Recorder(2000, random.Random(1))
    n = 100_000
    for i in range(n):
        rec.record_ok(i / 1000, i / n, i / n / 2)
    raw = rec.result(1.0, 0.0)
    assert raw.ok == n and len(raw.latency_s) == 2000
    # Keeping only the first 2000 would give a mean near 0.01; a uniform subset sits near 0.5.
    assert raw.latency_s.mean() == pytest.approx(0.5, abs=0.03)
    assert np.percentile(raw.latency_s, 99) == pytest.approx(0.99, abs=0.01)
    # Each kept latency stays paired with its own completion time and service latency.
    assert np.allclose(raw.done_s, raw.latency_s * n / 1000)
    assert np.allclose(raw.service_s, raw.latency_s / 2)


def test_merge_adds_counts_and_concatenates_samples() -> None:
    parts = []
    for seed in range(3):
        rec = Recorder(10, random.Random(seed))
        rec.record_sent(0.5, lag=0.001 * (seed + 1))
        rec.record_ok(0.6, 0.1 * (seed + 1), 0.1)
        rec.record_error("connect", 1.0)
        parts.append(rec.result(2.0, 1.0))
    raw = merge(parts)
    assert (raw.requests, raw.sent, raw.ok) == (3, 3, 3)
    assert raw.errors == {"connect": 3} and raw.errors_per_s == {1: 3}
    assert sorted(raw.latency_s.tolist()) == pytest.approx([0.1, 0.2, 0.3])
    assert raw.service_s.tolist() == [0.1, 0.1, 0.1]
    assert raw.lag_max_s == pytest.approx(0.003) and raw.cpu_s == 3.0 and raw.duration_s == 2.0


def test_bad_cap_and_empty_merge_are_rejected() -> None:
    with pytest.raises(ValueError, match="max_samples"):
        Recorder(0, random.Random(0))
    with pytest.raises(ValueError, match="nothing to merge"):
        merge([])
